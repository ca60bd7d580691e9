"""load_checkpoint: accepted formats and one named error per failure mode."""
import logging

import pytest
import torch

from lingbot_ros.model import CheckpointError, ModelConfig, build_model, load_checkpoint

pytestmark = pytest.mark.usefixtures("torch_single_thread")



def small_config():
    # selected_layers must be strictly increasing with 4 entries, so depth >= 4.
    return ModelConfig.from_dict({
        "name": "ckpt-test", "embed_dim": 64, "depth": 4, "num_heads": 1, "selected_layers": [0, 1, 2, 3],
        "patch_embed": {"type": "conv"}, "camera_head": {"trunk_depth": 1, "num_heads": 2},
        "depth_head": {"features": 16, "out_channels": [8, 8, 16, 16]}})


@pytest.fixture(scope="module")
def model():
    return build_model(small_config())


@pytest.fixture()
def saved(tmp_path, model):
    path = tmp_path / "ckpt.pt"
    torch.save({"model": model.state_dict()}, path)
    return path


def test_wrapped_and_bare_state_dicts_load(tmp_path, model, saved):
    other = build_model(small_config(), seed=1)
    assert load_checkpoint(other, saved) == []
    assert all(torch.equal(a, b) for a, b in zip(other.state_dict().values(), model.state_dict().values()))
    bare = tmp_path / "bare.pt"
    torch.save(model.state_dict(), bare)
    assert load_checkpoint(build_model(small_config(), seed=2), bare) == []


def test_a_model_built_without_random_init_loads_the_same_weights(saved, model):
    """random_init=False (a checkpoint follows) skips the seeded init; after loading, every weight
    the model uses equals the checkpoint's, buffers included."""
    fresh = build_model(small_config(), random_init=False)
    assert not fresh.training and not any(p.requires_grad for p in fresh.parameters())
    load_checkpoint(fresh, saved)
    expected = model.state_dict()
    got = fresh.state_dict()
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in got)
    assert all(torch.equal(a, b) for a, b in zip(fresh.buffers(), model.buffers()))


def test_missing_file(tmp_path, model):
    with pytest.raises(CheckpointError, match=r"nope\.pt: no such checkpoint file"):
        load_checkpoint(model, tmp_path / "nope.pt")


def test_garbage_is_not_a_checkpoint(tmp_path, model):
    path = tmp_path / "garbage.pt"
    path.write_bytes(b"this is not a checkpoint at all" * 10)
    with pytest.raises(CheckpointError, match=r"garbage\.pt: not a PyTorch checkpoint"):
        load_checkpoint(model, path)


def test_truncated_file(tmp_path, saved, model):
    data = saved.read_bytes()
    path = tmp_path / "truncated.pt"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"truncated\.pt: truncated or corrupt"):
        load_checkpoint(model, path)


def test_not_a_state_dict(tmp_path, model):
    path = tmp_path / "list.pt"
    torch.save([1, 2, 3], path)
    with pytest.raises(CheckpointError, match=r"list\.pt: not a state dict"):
        load_checkpoint(model, path)


def test_missing_keys_name_the_tensors(tmp_path, model):
    sd = dict(model.state_dict())
    del sd["camera_head.embed_pose.weight"]
    path = tmp_path / "partial.pt"
    torch.save({"model": sd}, path)
    with pytest.raises(CheckpointError, match=r"partial\.pt: 1 tensors the model uses are missing.*embed_pose"):
        load_checkpoint(model, path)


def test_shape_mismatch_names_another_architecture(tmp_path, model):
    other = ModelConfig.from_dict({**small_config().to_dict(), "depth_head": {"features": 32,
                                                                            "out_channels": [8, 8, 16, 16]}})
    path = tmp_path / "other.pt"
    torch.save({"model": build_model(other).state_dict()}, path)
    with pytest.raises(CheckpointError, match=r"other\.pt: \d+ shape mismatches .*another architecture"):
        load_checkpoint(model, path)


def test_unexpected_keys_warn_once_and_mask_token_may_be_absent(tmp_path, caplog):
    dino = ModelConfig.from_dict({**small_config().to_dict(),
                                  "patch_embed": {"type": "dinov2", "depth": 1, "num_heads": 1}})
    model = build_model(dino)
    sd = dict(model.state_dict())
    del sd["aggregator.patch_embed.mask_token"]                  # unused: may be missing
    sd["point_head.proj.weight"] = torch.zeros(2)                # stage-1 extra: harmless
    sd["something.else"] = torch.zeros(1)
    path = tmp_path / "extra.pt"
    torch.save({"model": sd}, path)
    with caplog.at_level(logging.WARNING, logger="lingbot_ros.model.checkpoint"):
        unexpected = load_checkpoint(model, path)
    assert unexpected == ["point_head.proj.weight", "something.else"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "something.else" in warnings[0].message and "point_head" in warnings[0].message


def test_fixture_checkpoint_is_the_tiny_preset(parity_fixtures_dir):
    model = build_model(ModelConfig.preset("tiny"))
    assert load_checkpoint(model, parity_fixtures_dir / "tiny_default" / "ckpt.pt") == []
    with pytest.raises(CheckpointError, match="missing"):
        load_checkpoint(model, parity_fixtures_dir / "tiny_conv2d" / "ckpt.pt")
