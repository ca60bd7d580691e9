"""Builds the model, the streaming session and the preprocessor from the node's parameters."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from lingbot_ros.ros.params import NodeConfig

# torch.compile's kernel cache; PyTorch's default lives under /tmp and is gone after a reboot.
INDUCTOR_CACHE = Path.home() / ".cache" / "lingbot_ros" / "torchinductor"


@dataclasses.dataclass
class LoadedModel:
    session: object
    preprocessor: object
    device: str
    description: str          # for the log: preset / file, checkpoint, device
    random_weights: bool      # no checkpoint: the output is not a map


def resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device '{name}' requested but CUDA is not available (set device:=cpu)")
    return name


def model_config(cfg: NodeConfig):
    """``model_config``: a preset name, or a JSON file (a bare arch, or a fixture's {"arch": ...})."""
    from lingbot_ros.model import ModelConfig

    name = cfg.model_config or ("lingbot-map" if cfg.checkpoint else "tiny")
    return ModelConfig.from_name(name), name


def load(cfg: NodeConfig) -> LoadedModel:
    """Raises with a message naming the file or setting at fault (the node reports ERROR)."""
    from lingbot_ros.model import build_model, load_checkpoint
    from lingbot_ros.stream import Preprocessor, StreamingSession, StreamSettings

    device = resolve_device(cfg.device)
    if cfg.fused_blocks and device.startswith("cuda"):
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(INDUCTOR_CACHE))
    arch, arch_name = model_config(cfg)
    model = build_model(arch, device=device, random_init=not cfg.checkpoint)
    if cfg.checkpoint:
        load_checkpoint(model, cfg.checkpoint)
    settings = StreamSettings(
        num_scale_frames=cfg.num_scale_frames, scale_frames=cfg.num_scale_frames,
        keyframe_interval=cfg.keyframe_interval, camera_num_iterations=cfg.camera_num_iterations,
        sliding_window=cfg.sliding_window,
        # The motion policy stores every frame, then keeps it or rolls it back: deferral makes
        # the rollback exact (nothing is evicted until the flush).
        defer_evictions=cfg.keyframe_policy == "motion",
        dtype=cfg.dtype, attention_backend=cfg.attention_backend, cuda_graphs=cfg.cuda_graphs,
        fused_blocks=cfg.fused_blocks)
    model.store_matmul_weights(settings.compute_dtype(model.device))
    session = StreamingSession(model, settings)
    preprocessor = Preprocessor(target_width=cfg.image_width, device=device)
    checkpoint = cfg.checkpoint or "random weights"
    return LoadedModel(session=session, preprocessor=preprocessor, device=device,
                       description=f"model {arch_name}, {checkpoint}, on {device}",
                       random_weights=not cfg.checkpoint)
