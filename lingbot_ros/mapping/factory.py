"""The one place a model, its streaming session and the preprocessor are assembled from settings.

The node, the offline tool, the fixture tool and the benchmarks all build through here, so that
device resolution, the model preset rule, checkpoint loading, the matmul weight dtype and the
stream settings derived from the mapping settings are written once.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from ..model import CheckpointError, LingBotMap, ModelConfig, build_model, load_checkpoint
from ..stream import MultiStreamSession, Preprocessor, StreamingSession, StreamSettings
from .rig.cameras import check_cameras, check_rig_settings
from .settings import MapperSettings

# torch.compile's kernel cache; PyTorch's default lives under /tmp and is gone after a reboot.
INDUCTOR_CACHE = Path.home() / ".cache" / "lingbot_ros" / "torchinductor"


@dataclasses.dataclass
class SessionBundle:
    model: LingBotMap
    session: StreamingSession
    preprocessor: Preprocessor
    device: str
    description: str          # for logs: preset / file, checkpoint, device
    random_weights: bool      # no checkpoint: the output is not a map
    architecture: str = ""    # the model_config it runs: a preset name or a JSON file

    def release_cached_memory(self) -> None:
        """Hand the allocator's cached blocks back to the device (after a failure such as CUDA out
        of memory, before the next stream allocates)."""
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()

    def untrained_warning(self) -> str:
        """The start-up warning of a run without a checkpoint ("" with one): it names the
        architecture that runs, since the released one with random weights is no map either."""
        if not self.random_weights:
            return ""
        return (f"NO CHECKPOINT SET: running the '{self.architecture}' architecture with RANDOM weights. "
                "Poses, depth and the map are NOT a reconstruction")


@dataclasses.dataclass
class RigBundle(SessionBundle):
    """A camera rig's: one model, one MultiStreamSession with a stream per camera."""

    session: MultiStreamSession

    def camera_bundle(self, session) -> SessionBundle:
        """One camera's bundle: this one's model and preprocessor, ``session`` its stream's view."""
        values = {field.name: getattr(self, field.name) for field in dataclasses.fields(SessionBundle)}
        return SessionBundle(**{**values, "session": session})


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device '{name}' requested but CUDA is not available (set device to cpu)")
    return name


def model_config(settings: MapperSettings) -> tuple[ModelConfig, str]:
    """The architecture: ``model_config`` (a preset name or a JSON file), else lingbot-map with a
    checkpoint and the tiny test model without one."""
    name = settings.model_config or ("lingbot-map" if settings.checkpoint else "tiny")
    return ModelConfig.from_name(name), name


def stream_settings(settings: MapperSettings) -> StreamSettings:
    return StreamSettings(
        num_scale_frames=settings.num_scale_frames, scale_frames=settings.scale_frames,
        keyframe_interval=settings.keyframe_interval, camera_num_iterations=settings.camera_num_iterations,
        sliding_window=settings.sliding_window, cross_frame_special=settings.cross_frame_special,
        include_scale_frames=settings.include_scale_frames, camera_only=settings.camera_only,
        # The motion policy stores every frame, then keeps it or rolls it back: deferral makes
        # the rollback exact (nothing is evicted until the flush).
        defer_evictions=settings.keyframe_policy == "motion",
        dtype=settings.dtype, attention_backend=settings.attention_backend,
        kv_cache_dtype=settings.kv_cache_dtype, cuda_graphs=settings.cuda_graphs, fused_blocks=settings.fused_blocks)


def load_model(settings: MapperSettings, device: str) -> tuple[LingBotMap, str]:
    """The model on ``device`` with the checkpoint's weights (seeded random weights without one),
    its matmul weights stored in the session's compute dtype. Returns it and a description."""
    if settings.fused_blocks and device.startswith("cuda"):
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(INDUCTOR_CACHE))
    arch, arch_name = model_config(settings)
    model = build_model(arch, device=device, random_init=not settings.checkpoint)
    if settings.checkpoint:
        load_checkpoint(model, settings.checkpoint)
    model.store_matmul_weights(stream_settings(settings).compute_dtype(model.device))
    return model, f"model {arch_name}, {settings.checkpoint or 'random weights'}, on {device}"


def new_session(model: LingBotMap, settings: MapperSettings) -> StreamingSession:
    """Another session over an already loaded model (benchmarks compare variants this way)."""
    return StreamingSession(model, stream_settings(settings))


# Where the modules of torch.compile's kernel builds live: an error raised from one of them is a
# build failure (no Triton, no C compiler), which fused_blocks false avoids.
_COMPILE_MODULES = ("torch._dynamo", "torch._inductor", "triton")


def failure_hint(error: BaseException, settings: MapperSettings) -> str:
    """What to change for a failure to build or warm up the model, or "" when nothing known
    applies (the node's, the offline tool's and the prebuild tool's messages end with it)."""
    if isinstance(error, CheckpointError) and ("missing" in str(error) or "mismatch" in str(error)):
        _, name = model_config(settings)
        return (f" (the checkpoint does not fit the architecture '{name}': set model_config to the one it was "
                f"trained with, a preset name or a JSON file; the launch argument model_config:=, "
                f"lingbot-ros-offline --model-config)")
    chain, seen = error, set()
    while chain is not None and id(chain) not in seen:
        seen.add(id(chain))
        if settings.fused_blocks and type(chain).__module__.startswith(_COMPILE_MODULES):
            return (" (fused_blocks compiles kernels with torch.compile, which needs Triton and a C compiler "
                    "on CUDA; fused_blocks:=false runs without it)")
        chain = chain.__cause__ or chain.__context__
    return ""


def build(settings: MapperSettings) -> SessionBundle:
    """Raises with a message naming the file or setting at fault."""
    return _build(settings, SessionBundle, lambda model: new_session(model, settings))


def build_rig(settings: MapperSettings, cameras) -> RigBundle:
    """A rig's bundle for ``cameras`` (names, checked before the model loads), the model loaded once."""
    cameras, _ = check_cameras(cameras)
    check_rig_settings(settings)
    return _build(settings, RigBundle,
                  lambda model: MultiStreamSession(model, len(cameras), stream_settings(settings)))


def _build(settings: MapperSettings, kind, session_of):
    device = resolve_device(settings.device)
    model, description = load_model(settings, device)
    _, architecture = model_config(settings)
    preprocessor = Preprocessor(target_width=settings.image_width, device=device, exact=settings.exact_resize)
    return kind(model=model, session=session_of(model), preprocessor=preprocessor, device=device,
                description=description, random_weights=not settings.checkpoint, architecture=architecture)
