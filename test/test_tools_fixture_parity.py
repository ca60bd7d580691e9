"""Spec-18 parity: every fixture through lingbot-ros-fixture, compared with expected.npz."""
import json

import numpy as np
import pytest
import torch

from lingbot_ros.mapping import factory
from lingbot_ros.mapping.windows.offline import frame_type, stitch_plan
from lingbot_ros.mapping.windows.rule import WindowRule
from lingbot_ros.stream import SettingsError
from lingbot_ros.tools import fixture

pytestmark = pytest.mark.usefixtures("torch_single_thread")

FIXTURES = ("tiny_default", "tiny_kf2", "tiny_conv2d", "tiny_windowed")


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_matches_expected(parity_fixtures_dir, tmp_path, capsys, name):
    ref = parity_fixtures_dir / name
    out = tmp_path / "out.npz"
    assert fixture.main([str(ref), str(out), "--quiet", "--check"]) == 0
    with np.load(ref / "expected.npz") as expected, np.load(out) as actual:
        expected, actual = dict(expected), dict(actual)
    report = fixture.compare(expected, actual)
    assert set(report) == set(expected)
    failed = {k: ratio for k, (ok, ratio) in report.items() if not ok}
    assert not failed, f"{name}: keys over the spec-18 tolerance (error/allowance): {failed}"
    # --check compares every expected key (tiny_windowed: chunk_scales and chunk_transforms too).
    checked = {line.split()[0] for line in capsys.readouterr().out.splitlines() if line.split()[1:2] == ["ok"]}
    assert checked == set(expected)
    if json.loads((ref / "config.json").read_text())["run"].get("mode") == "windowed":
        assert "pose_enc_list" not in actual and {"chunk_scales", "chunk_transforms"} <= set(actual)


def test_windowed_fixture_sources_and_frame_types(parity_fixtures_dir):
    """config.json per_frame's source_window and frame_type (informational) follow from the rule."""
    ref = parity_fixtures_dir / "tiny_windowed"
    config = json.loads((ref / "config.json").read_text())
    run, per_frame = config["run"], config["per_frame"]
    settings = factory.stream_settings(fixture.fixture_settings(ref, run))
    rule = WindowRule.from_settings(settings, run["window_size"], run["overlap_size"], run["overlap_keyframes"])
    S, K = run["num_frames"], settings.keyframe_interval
    windows = rule.windows(S)
    assert len(windows) == 5
    plan = stitch_plan(windows, rule.layout(S).overlap)
    assert [f for f, _, _ in plan] == list(range(S))
    assert [k for _, k, _ in plan] == per_frame["source_window"]
    types = []
    for _, k, j in plan:
        n_w = min(rule.layout(S).scale_frames, windows[k][1] - windows[k][0])
        types.append(frame_type(j, n_w, j < n_w or K <= 1 or (j - n_w) % K == 0))
    assert types == per_frame["frame_type"]


def test_check_flag_and_per_frame_time_index(parity_fixtures_dir, tmp_path, capsys):
    ref = parity_fixtures_dir / "tiny_kf2"
    assert fixture.main([str(ref), str(tmp_path / "o.npz"), "--quiet", "--check"]) == 0
    assert "FAIL" not in capsys.readouterr().out
    # The session's keyframe flags and 3D-RoPE indices follow config.json["per_frame"].
    config = json.loads((ref / "config.json").read_text())
    per_frame = config["per_frame"]
    settings = fixture.fixture_settings(ref, config["run"])
    model, _ = factory.load_model(settings, settings.device)
    session = factory.new_session(model, settings)
    frames = torch.from_numpy(np.load(ref / "frames.npy"))
    results = [r for f in frames for r in session.step(f)]
    assert [r.is_keyframe for r in results] == per_frame["is_keyframe"]
    assert [r.time_index for r in results] == per_frame["rope_frame_index"]


def test_run_section_becomes_the_settings(parity_fixtures_dir):
    ref = parity_fixtures_dir / "tiny_kf2"
    run = json.loads((ref / "config.json").read_text())["run"]
    settings = fixture.fixture_settings(ref, run)
    assert (settings.device, settings.dtype, settings.attention_backend) == ("cpu", "float32", "torch")
    assert settings.model_config == str(ref / "config.json")
    # tiny_kf2's ckpt.pt is a pointer to tiny_default's weights.
    assert settings.checkpoint == str((parity_fixtures_dir / "tiny_default" / "ckpt.pt").resolve())
    assert (settings.num_scale_frames, settings.keyframe_interval, settings.camera_num_iterations) == (3, 2, 4)
    assert {k: getattr(settings, k) for k in fixture.KV_CACHE_KEYS} == run["kv_cache"]


def test_bad_run_sections_are_refused(parity_fixtures_dir, tmp_path, capsys):
    ref = parity_fixtures_dir / "tiny_default"
    run = json.loads((ref / "config.json").read_text())["run"]
    with pytest.raises(fixture.FixtureError, match="max_special_tokens"):
        fixture.fixture_settings(ref, {**run, "kv_cache": {**run["kv_cache"], "max_special_tokens": 4}})
    with pytest.raises(SettingsError, match="num_scale_frames"):   # 8 > 3 anchors + window 4
        fixture.fixture_settings(ref, {**run, "num_scale_frames": 8})
    with pytest.raises(fixture.FixtureError, match="num_scale_frames"):
        fixture.fixture_settings(ref, {k: v for k, v in run.items() if k != "num_scale_frames"})


def test_compare_flags_a_wrong_output():
    b = np.linspace(1, 2, 100, dtype=np.float32).reshape(10, 10)
    ok, _ = fixture.compare({"x": b}, {"x": b[None] * (1 + 1e-5)})["x"]    # batch dim tolerated
    assert ok
    ok, ratio = fixture.compare({"x": b}, {"x": b * 1.01})["x"]
    assert not ok and ratio > 1
    assert fixture.compare({"x": b}, {})["x"][0] is False


def test_bad_reference_directory_is_a_clear_error(tmp_path, capsys):
    assert fixture.main([str(tmp_path), str(tmp_path / "o.npz")]) == 2
    assert "config.json" in capsys.readouterr().err


def test_checkpoint_pointer_file_is_followed(tmp_path):
    real = tmp_path / "a" / "ckpt.pt"
    real.parent.mkdir()
    real.write_bytes(b"\0" * 5000)
    pointer = tmp_path / "b" / "ckpt.pt"
    pointer.parent.mkdir()
    pointer.write_text("../a/ckpt.pt\n")
    assert fixture.resolve_checkpoint(pointer) == real.resolve()
