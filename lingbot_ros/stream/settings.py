"""Streaming settings (spec 9, 10, 13): runtime choices of one session, validated up front."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..cache.kv_storage import FP8

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
BACKENDS = ("auto", "torch", "flashinfer")
KV_CACHE_DTYPES = ("auto", "fp8")


class SettingsError(ValueError):
    """Streaming settings that make no sense together."""


@dataclass(frozen=True)
class StreamSettings:
    num_scale_frames: int = 8          # phase-1 batch (bidirectional), spec 13
    keyframe_interval: int = 1         # phase 2: every K-th frame is stored (unless overridden per step)
    camera_num_iterations: int = 4
    sliding_window: int = 64           # kv_cache.* of spec 9
    scale_frames: int = 8
    cross_frame_special: bool = True
    include_scale_frames: bool = True
    camera_only: bool = False
    defer_evictions: bool = False      # pages of evicted frames recycled only at flush()
    max_special_tokens: Optional[int] = None
    dtype: str = "auto"                # auto: float32 on CPU, bf16 mixed precision on CUDA (spec 14)
    attention_backend: str = "auto"
    # What the global KV cache stores K/V in: auto = the compute dtype; fp8 = float8 e4m3, half
    # of bf16's memory; attention computes in the compute dtype over the rounded K/V.
    kv_cache_dtype: str = "auto"
    # Phase-2 frame steps replay captured CUDA graphs (CUDA with the FlashInfer backend only;
    # same outputs, far less host work per frame).
    cuda_graphs: bool = True
    # Single-frame CUDA steps run the DINOv2 and aggregator blocks' layer norms, RoPE, casts and
    # residual work as kernels fused by torch.compile (compiled once per process, on the first
    # such frame).
    fused_blocks: bool = True

    def __post_init__(self):
        def need(ok, msg):
            if not ok:
                raise SettingsError(msg)

        for key in ("num_scale_frames", "keyframe_interval", "camera_num_iterations", "sliding_window"):
            value = getattr(self, key)
            need(isinstance(value, int) and value >= 1, f"{key} must be an int >= 1, got {value!r}")
        need(isinstance(self.scale_frames, int) and self.scale_frames >= 0,
             f"scale_frames must be an int >= 0, got {self.scale_frames!r}")
        need(self.num_scale_frames <= self.scale_frames + self.sliding_window,
             f"num_scale_frames={self.num_scale_frames} exceeds scale_frames + sliding_window = "
             f"{self.scale_frames} + {self.sliding_window}: the phase-1 batch would be evicted while "
             f"it is appended (spec 6/9); raise sliding_window or lower num_scale_frames")
        need(self.max_special_tokens is None or self.max_special_tokens >= 0,
             f"max_special_tokens must be None or >= 0, got {self.max_special_tokens!r}")
        need(self.dtype == "auto" or self.dtype in DTYPES,
             f"dtype must be 'auto' or one of {sorted(DTYPES)}, got {self.dtype!r}")
        need(isinstance(self.cuda_graphs, bool), f"cuda_graphs must be a bool, got {self.cuda_graphs!r}")
        need(isinstance(self.fused_blocks, bool), f"fused_blocks must be a bool, got {self.fused_blocks!r}")
        need(self.kv_cache_dtype in KV_CACHE_DTYPES,
             f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        need(self.attention_backend in BACKENDS,
             f"attention_backend must be one of {BACKENDS}, got {self.attention_backend!r}")

    def compute_dtype(self, device: torch.device) -> torch.dtype:
        """The dtype of the aggregator's matmuls and KV cache; float32 means no autocast at all."""
        if self.dtype == "auto":
            return torch.bfloat16 if device.type == "cuda" else torch.float32
        return DTYPES[self.dtype]

    def kv_storage_dtype(self, device: torch.device) -> torch.dtype:
        """The dtype the global KV cache stores K and V in."""
        return FP8 if self.kv_cache_dtype == "fp8" else self.compute_dtype(device)
