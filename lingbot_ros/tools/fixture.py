"""lingbot-ros-fixture REF_DIR OUT.npz: the spec-18 parity run.

Builds the model from REF_DIR/config.json["arch"], loads REF_DIR/ckpt.pt, streams
REF_DIR/frames.npy with config.json["run"] in float32 on the CPU and writes the outputs to OUT.npz.
With run.mode = "windowed" it runs spec 13.1 instead (run.window_size, run.overlap_size,
run.overlap_keyframes) and writes the stitched outputs, plus chunk_scales and chunk_transforms
when there is more than one window (no pose_enc_list).
With --check, compares them against REF_DIR/expected.npz with the spec-18 tolerance.
"""
from __future__ import annotations

import io
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ..mapping import factory
from ..mapping.settings import MapperSettings
from ..mapping.files.staged_files import write_files
from ..mapping.windows.offline import WindowedRun
from ..mapping.windows.rule import WindowError, WindowRule
from ..model import CheckpointError, ConfigError
from ..stream import SettingsError, StreamingSession
from ..process import interrupts
from lingbot_ros.tools.command_line import Parser

log = logging.getLogger("lingbot_ros.fixture")

# run.kv_cache's keys (spec 9); each is the MapperSettings field of the same name.
KV_CACHE_KEYS = ("sliding_window", "scale_frames", "cross_frame_special", "include_scale_frames", "camera_only")
# A pointer file (a checkpoint shared with another fixture) is a tiny text file holding a path.
_POINTER_MAX_BYTES = 4096


class FixtureError(RuntimeError):
    """A reference directory that does not follow the spec-18 layout."""


def resolve_checkpoint(path: Path) -> Path:
    """Follow symlinks and small text files that name another checkpoint (relative to their folder)."""
    path = path.resolve()
    for _ in range(8):
        if not path.is_file():
            raise FixtureError(f"{path}: checkpoint not found")
        if path.stat().st_size > _POINTER_MAX_BYTES:
            return path
        try:
            target = path.read_text().strip()
        except UnicodeDecodeError:
            return path
        if not target or "\n" in target:
            return path
        path = (path.parent / target).resolve()
    raise FixtureError(f"{path}: too many checkpoint pointer hops")


def fixture_settings(ref_dir: Path, run: dict) -> MapperSettings:
    """The spec-18 run of a reference directory: its config.json's arch and run section, its
    checkpoint, float32 on the CPU with the torch attention backend. The windowed mode's windows
    come from the run section itself (spec 13.1's keys, null = not given), not from the
    mapper's long-run settings."""
    kv = run.get("kv_cache", {})
    unknown = sorted(set(kv) - set(KV_CACHE_KEYS))
    if unknown:
        raise FixtureError(f"config.json run.kv_cache: unknown key(s) {unknown}; known: {list(KV_CACHE_KEYS)}")
    try:
        return MapperSettings(model_config=str(ref_dir / "config.json"),
                              checkpoint=str(resolve_checkpoint(ref_dir / "ckpt.pt")),
                              device="cpu", dtype="float32", attention_backend="torch",
                              num_scale_frames=run["num_scale_frames"],
                              keyframe_interval=run.get("keyframe_interval", 1),
                              camera_num_iterations=run.get("camera_num_iterations", 4), **kv)
    except KeyError as e:
        raise FixtureError(f"config.json run section lacks {e}") from None


def run_fixture(ref_dir, threads: int | None = None) -> dict[str, np.ndarray]:
    ref_dir = Path(ref_dir)
    cfg_path = ref_dir / "config.json"
    if not cfg_path.is_file():
        raise FixtureError(f"{cfg_path}: not found (is {ref_dir} a reference directory?)")
    config = json.loads(cfg_path.read_text())
    if "arch" not in config or "run" not in config:
        raise FixtureError(f"{cfg_path}: needs 'arch' and 'run' sections")
    if threads:
        torch.set_num_threads(threads)
    run = config["run"]
    settings = fixture_settings(ref_dir, run)
    model, _ = factory.load_model(settings, settings.device)
    frames = np.load(ref_dir / "frames.npy")
    if frames.ndim == 5 and frames.shape[0] == 1:
        frames = frames[0]
    if frames.ndim != 4 or frames.shape[1] != 3:
        raise FixtureError(f"{ref_dir / 'frames.npy'}: expected [S, 3, H, W], got {frames.shape}")
    mode = run.get("mode", "streaming")
    if mode not in ("streaming", "windowed"):
        raise FixtureError(f"{cfg_path}: run.mode must be 'streaming' or 'windowed', got {mode!r}")
    session = factory.new_session(model, settings)
    log.info("%s: %d frames %dx%d, model %s, %s", ref_dir, frames.shape[0], frames.shape[3], frames.shape[2],
             model.config.name, mode)
    images = torch.from_numpy(np.ascontiguousarray(frames, dtype=np.float32))
    start = time.perf_counter()
    if mode == "windowed":
        outputs = _run_windowed(session, images, run)
    else:
        outputs = _run_streaming(session, images)
    log.info("%d frames in %.2f s", len(outputs["pose_enc"]), time.perf_counter() - start)
    return outputs


def _run_streaming(session: StreamingSession, images: torch.Tensor) -> dict[str, np.ndarray]:
    results = []
    for i, frame in enumerate(images):
        results += session.step(frame)
        log.info("frame %d/%d: %d results so far", i + 1, len(images), len(results))
    results += session.close_scale_phase()           # a stream shorter than num_scale_frames
    outputs = _stack(results)
    outputs["pose_enc_list"] = torch.stack([r.pose_enc_list for r in results]).numpy().transpose(1, 0, 2)
    return outputs                                    # pose_enc_list [I, S, 9]


def _run_windowed(session: StreamingSession, images: torch.Tensor, run: dict) -> dict[str, np.ndarray]:
    try:
        rule = WindowRule.from_settings(session.settings, run["window_size"], run.get("overlap_size"),
                                        run.get("overlap_keyframes"))
    except KeyError as e:
        raise FixtureError(f"config.json run section lacks {e} (needed with mode 'windowed')") from None
    windowed = WindowedRun(session, rule, len(images))
    log.info("windows %s, overlap %d", windowed.windows, windowed.layout.overlap)
    outputs = _stack([w.result for w in windowed.frames(images)])
    if len(windowed.windows) >= 2:                    # spec 13.1: metadata only with several windows
        outputs["chunk_scales"] = windowed.chunk_scales().numpy()
        outputs["chunk_transforms"] = windowed.chunk_transforms().numpy()
    return outputs


def _stack(results) -> dict[str, np.ndarray]:
    def stack(name):
        return torch.stack([getattr(r, name) for r in results]).numpy()

    return {
        "pose_enc": stack("pose_enc"),
        "depth": stack("depth")[..., None],
        "depth_conf": stack("depth_conf"),
        "world_points": stack("world_points"),
        "extrinsic": stack("extrinsic"),
        "intrinsic": stack("intrinsic"),
    }


def compare(expected: dict, actual: dict) -> dict[str, tuple[bool, float]]:
    """Spec-18 check per key of ``expected``: |a-b| <= 1e-4*p99(|b|) + 1e-3*|b|.

    Returns {key: (passed, worst ratio of error to allowance)}; a leading batch dim of 1 is tolerated.
    """
    report = {}
    for key in expected:
        b = np.asarray(expected[key], dtype=np.float64)
        if key not in actual:
            report[key] = (False, float("inf"))
            continue
        a = np.asarray(actual[key], dtype=np.float64)
        a, b = _drop_batch(a, b.shape), _drop_batch(b, a.shape)
        if a.shape != b.shape:
            report[key] = (False, float("inf"))
            continue
        allowed = 1e-4 * np.percentile(np.abs(b), 99) + 1e-3 * np.abs(b)
        err = np.abs(a - b)
        ratio = float(np.max(err / np.maximum(allowed, 1e-30))) if err.size else 0.0
        report[key] = (bool(np.all(err <= allowed)), ratio)
    return report


def _drop_batch(x, other_shape):
    return x[0] if x.ndim == len(other_shape) + 1 and x.shape[0] == 1 else x


def main(argv=None) -> int:
    return interrupts.run(_main, argv, "lingbot-ros-fixture")


def _main(argv) -> int:
    parser = Parser(prog="lingbot-ros-fixture", description=__doc__.split("\n\n")[0])
    parser.add_argument("ref_dir", help="reference directory: config.json, ckpt.pt, frames.npy")
    parser.add_argument("out", help="output .npz path")
    parser.add_argument("--check", action="store_true",
                        help="compare with REF_DIR/expected.npz (spec-18 tolerance); exit 1 on failure")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and the check table")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s")
    try:
        outputs = run_fixture(args.ref_dir, args.threads)
    except (FixtureError, CheckpointError, ConfigError, SettingsError, WindowError, OSError, ValueError) as e:
        print(f"lingbot-ros-fixture: error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    archive = io.BytesIO()
    np.savez(archive, **outputs)
    write_files({out: archive.getvalue()})
    print(f"wrote {out} ({', '.join(f'{k} {list(v.shape)}' for k, v in outputs.items())})")
    if not args.check:
        return 0
    expected_path = Path(args.ref_dir) / "expected.npz"
    if not expected_path.is_file():
        print(f"lingbot-ros-fixture: error: {expected_path} not found", file=sys.stderr)
        return 2
    with np.load(expected_path) as expected:
        report = compare(dict(expected), outputs)
    for key, (ok, ratio) in report.items():
        print(f"{key:16s} {'ok  ' if ok else 'FAIL'} worst error / allowance = {ratio:.3g}")
    return 0 if all(ok for ok, _ in report.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
