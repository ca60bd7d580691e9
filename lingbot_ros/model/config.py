"""Model hyperparameters (spec sections 2 and 16.2): one frozen dataclass with named presets."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping, Union


class ConfigError(ValueError):
    """A model configuration that cannot describe a valid LingBot-Map network."""


@dataclass(frozen=True)
class PatchEmbedConfig:
    type: str = "dinov2"          # "dinov2" (ViT with registers, pos-embed, final norm) or "conv"
    depth: int = 24
    num_heads: int = 16
    mlp_ratio: float = 4.0
    num_register_tokens: int = 4  # DINOv2's own registers (not the aggregator's)


@dataclass(frozen=True)
class CameraHeadConfig:
    trunk_depth: int = 4
    num_heads: int = 16
    mlp_ratio: float = 4.0


@dataclass(frozen=True)
class DepthHeadConfig:
    features: int = 256
    out_channels: tuple[int, int, int, int] = (256, 512, 1024, 1024)


@dataclass(frozen=True)
class ModelConfig:
    name: str = "lingbot-map"
    img_size: int = 518               # only sets the DINOv2 pos-embed grid (img_size / patch_size)
    patch_size: int = 14
    embed_dim: int = 1024
    depth: int = 24                   # frame blocks = global blocks
    num_heads: int = 16
    mlp_ratio: float = 4.0
    num_register_tokens: int = 4      # aggregator registers; special tokens = 1 + R + 1
    patch_embed: PatchEmbedConfig = field(default_factory=PatchEmbedConfig)
    selected_layers: tuple[int, int, int, int] = (4, 11, 17, 23)
    rope2d_freq: float = 100.0
    enable_3d_rope: bool = True
    rope3d_theta: float = 10000.0
    rope3d_fhw_dim: tuple[int, int, int] = (20, 22, 22)
    max_frame_num: int = 1024         # trained 3D-RoPE range; angles are computed for any index
    camera_head: CameraHeadConfig = field(default_factory=CameraHeadConfig)
    depth_head: DepthHeadConfig = field(default_factory=DepthHeadConfig)

    def __post_init__(self):
        _validate(self)

    # Derived sizes, computed here so call sites never retype them.
    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def num_special_tokens(self) -> int:
        return 2 + self.num_register_tokens   # camera, registers, scale

    @property
    def camera_dim(self) -> int:
        return 2 * self.embed_dim

    @classmethod
    def preset(cls, name: str) -> "ModelConfig":
        if name not in PRESETS:
            raise ConfigError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
        return PRESETS[name]

    @classmethod
    def from_name(cls, name: str) -> "ModelConfig":
        """A preset name, or a JSON file (anything ending in .json, holding a path separator, or
        naming an existing file): the one rule the command-line tools and the node share."""
        if name.endswith(".json") or os.path.sep in name or Path(name).is_file():
            return cls.from_json(name)
        return cls.preset(name)

    @classmethod
    def from_json(cls, source: Union[str, Path, Mapping[str, Any]]) -> "ModelConfig":
        """Read a spec-16.2 ``arch`` dict, a fixture ``config.json`` (its ``arch``), or a path to either."""
        if isinstance(source, Mapping):
            data = dict(source)
        else:
            path = Path(source)
            try:
                data = json.loads(path.read_text())
            except FileNotFoundError:
                raise ConfigError(f"{path}: no such config file") from None
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}: not valid JSON ({e})") from None
        if "arch" in data:
            data = data["arch"]
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown model config keys {unknown}; known: {sorted(known)}")
        kw = dict(data)
        try:
            if "patch_embed" in kw:
                kw["patch_embed"] = _sub(PatchEmbedConfig, kw["patch_embed"], "patch_embed")
            if "camera_head" in kw:
                kw["camera_head"] = _sub(CameraHeadConfig, kw["camera_head"], "camera_head")
            if "depth_head" in kw:
                kw["depth_head"] = _sub(DepthHeadConfig, kw["depth_head"], "depth_head")
            for key in ("selected_layers", "rope3d_fhw_dim"):
                if key in kw:
                    kw[key] = tuple(kw[key])
        except TypeError as e:
            raise ConfigError(f"malformed model config: {e}") from None
        return cls(**kw)

    def to_dict(self) -> dict:
        return asdict(self)

    def replace(self, **changes) -> "ModelConfig":
        return replace(self, **changes)


def _sub(cls, value, name):
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"{name} must be an object, got {type(value).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ConfigError(f"unknown {name} keys {unknown}; known: {sorted(known)}")
    value = dict(value)
    if "out_channels" in value:
        value["out_channels"] = tuple(value["out_channels"])
    return cls(**value)


def _validate(c: ModelConfig) -> None:
    def need(ok, msg):
        if not ok:
            raise ConfigError(f"model config {c.name!r}: {msg}")

    for key in ("img_size", "patch_size", "embed_dim", "depth", "num_heads", "max_frame_num"):
        need(isinstance(getattr(c, key), int) and getattr(c, key) > 0, f"{key} must be a positive int")
    need(c.num_register_tokens >= 0, "num_register_tokens must be >= 0")
    need(c.mlp_ratio > 0, "mlp_ratio must be > 0")
    need(c.embed_dim % c.num_heads == 0,
         f"embed_dim {c.embed_dim} is not divisible by num_heads {c.num_heads}")
    need(c.head_dim % 4 == 0, f"head dim {c.head_dim} must be a multiple of 4 (2D RoPE)")
    need(len(c.selected_layers) == 4, f"selected_layers needs exactly 4 entries, got {list(c.selected_layers)}")
    need(list(c.selected_layers) == sorted(set(c.selected_layers)),
         f"selected_layers must be strictly increasing, got {list(c.selected_layers)}")
    need(all(0 <= i < c.depth for i in c.selected_layers),
         f"selected_layers {list(c.selected_layers)} must lie in [0, depth={c.depth})")
    if c.enable_3d_rope:
        need(len(c.rope3d_fhw_dim) == 3 and all(d > 0 and d % 2 == 0 for d in c.rope3d_fhw_dim),
             f"rope3d_fhw_dim must be 3 positive even ints, got {list(c.rope3d_fhw_dim)}")
        need(sum(c.rope3d_fhw_dim) == c.head_dim,
             f"3D RoPE needs sum(rope3d_fhw_dim)={sum(c.rope3d_fhw_dim)} == head dim "
             f"embed_dim/num_heads={c.head_dim}")
    pe = c.patch_embed
    need(pe.type in ("dinov2", "conv"), f"patch_embed.type must be 'dinov2' or 'conv', got {pe.type!r}")
    if pe.type == "dinov2":
        need(pe.depth > 0 and pe.num_heads > 0, "patch_embed depth and num_heads must be positive")
        need(c.embed_dim % pe.num_heads == 0,
             f"embed_dim {c.embed_dim} is not divisible by patch_embed.num_heads {pe.num_heads}")
        need(c.img_size % c.patch_size == 0,
             f"img_size {c.img_size} must be a multiple of patch_size {c.patch_size} (pos-embed grid)")
    ch = c.camera_head
    need(ch.trunk_depth > 0 and ch.num_heads > 0, "camera_head trunk_depth and num_heads must be positive")
    need(c.camera_dim % ch.num_heads == 0,
         f"camera head width 2*embed_dim={c.camera_dim} is not divisible by camera_head.num_heads {ch.num_heads}")
    dh = c.depth_head
    need(len(dh.out_channels) == 4 and all(o > 0 for o in dh.out_channels),
         f"depth_head.out_channels needs 4 positive entries, got {list(dh.out_channels)}")
    need(dh.features > 0 and dh.features % 8 == 0,
         f"depth_head.features must be a multiple of 8 (its half gets a positional embedding), got {dh.features}")
    for o in dh.out_channels:
        need(o % 4 == 0, f"depth_head.out_channels entries must be multiples of 4 (positional embedding), got {o}")


PRESETS: dict[str, ModelConfig] = {
    # The released GCTStream architecture (spec 1.1, 1,157,943,540 parameters).
    "lingbot-map": ModelConfig(),
    # The parity fixtures' tiny_default architecture (spec 16.2, 7,467,476 parameters).
    "tiny": ModelConfig(
        name="tiny", embed_dim=128, depth=6, num_heads=2,
        patch_embed=PatchEmbedConfig(type="dinov2", depth=2, num_heads=2),
        selected_layers=(1, 2, 4, 5),
        depth_head=DepthHeadConfig(features=64, out_channels=(32, 64, 128, 128)),
    ),
}
