"""ModelConfig: presets, JSON round trip, validation messages, parameter counts of spec 1."""
import json

import pytest
import torch

from lingbot_ros.model import ConfigError, LingBotMap, ModelConfig


def count(cfg):
    with torch.device("meta"):            # no memory for the 1.16B-parameter release
        model = LingBotMap(cfg)
    return sum(p.numel() for p in model.parameters()), len(model.state_dict())


def test_released_preset_matches_spec_counts():
    cfg = ModelConfig.preset("lingbot-map")
    assert (cfg.embed_dim, cfg.depth, cfg.num_heads, cfg.selected_layers) == (1024, 24, 16, (4, 11, 17, 23))
    assert count(cfg) == (1_157_943_540, 1342)


def test_tiny_preset_is_the_fixture_arch(parity_fixtures_dir):
    cfg = ModelConfig.from_json(parity_fixtures_dir / "tiny_default" / "config.json")
    assert cfg == ModelConfig.preset("tiny")
    assert count(cfg) == (7_467_476, 386)
    conv = ModelConfig.from_json(json.loads((parity_fixtures_dir / "tiny_conv2d" / "config.json").read_text()))
    assert conv.patch_embed.type == "conv" and not conv.enable_3d_rope
    assert count(conv) == (3_767_396, 252)


def test_from_json_accepts_arch_dict_and_round_trips(tmp_path):
    cfg = ModelConfig.preset("tiny")
    path = tmp_path / "arch.json"
    path.write_text(json.dumps(cfg.to_dict()))
    assert ModelConfig.from_json(path) == cfg
    assert ModelConfig.from_json({"arch": cfg.to_dict()}) == cfg


@pytest.mark.parametrize("change, message", [
    ({"num_heads": 3}, "not divisible by num_heads"),
    ({"num_heads": 4}, "sum\\(rope3d_fhw_dim\\)=64 == head dim"),
    ({"selected_layers": [1, 2, 4]}, "exactly 4 entries"),
    ({"selected_layers": [2, 1, 4, 5]}, "strictly increasing"),
    ({"selected_layers": [1, 2, 4, 6]}, "must lie in \\[0, depth=6\\)"),
    ({"patch_embed": {"type": "vit"}}, "patch_embed.type"),
    ({"camera_head": {"num_heads": 3}}, "not divisible by camera_head.num_heads"),
    ({"depth_head": {"features": 60}}, "multiple of 8"),
    ({"depth": 0}, "depth must be a positive int"),
    ({"bogus": 1}, "unknown model config keys \\['bogus'\\]"),
])
def test_invalid_configs_say_what_is_wrong(change, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_dict({**ModelConfig.preset("tiny").to_dict(), **change})


def test_unknown_preset_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="unknown model preset 'huge'"):
        ModelConfig.preset("huge")
    with pytest.raises(ConfigError, match="no such config file"):
        ModelConfig.from_json(tmp_path / "none.json")


def test_from_name_takes_a_preset_or_a_json_file(tmp_path):
    assert ModelConfig.from_name("tiny") == ModelConfig.preset("tiny")
    path = tmp_path / "arch"                      # an existing file without the .json suffix
    path.write_text(json.dumps({"arch": ModelConfig.preset("tiny").to_dict()}))
    assert ModelConfig.from_name(str(path)) == ModelConfig.preset("tiny")
    with pytest.raises(ConfigError, match="no such config file"):
        ModelConfig.from_name(str(tmp_path / "missing" / "arch"))   # a path, not a preset name
    with pytest.raises(ConfigError, match="unknown model preset"):
        ModelConfig.from_name("lingbot-mapp")
