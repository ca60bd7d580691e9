"""How K and V are stored in the pools: in the compute dtype, or as float8 e4m3 (one byte a value,
half of bf16's memory). Mechanism only: the spec says which (`CacheSpec.kv_dtype`)."""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0   # largest finite e4m3fn value


def to_storage(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in the pools' dtype. Float8 is stored unscaled: K comes out of the q/k norm and V out of
    a projection of layer-normed tokens, both far inside +-448, and e4m3's relative step (1/8)
    is the same over its whole normal range [2^-6, 448], so a scale would buy nothing but a
    calibration. Values past the range saturate instead of turning into NaN."""
    if dtype != FP8:
        return x.to(dtype)
    return x.clamp(-FP8_MAX, FP8_MAX).to(FP8)


def raw(x: torch.Tensor) -> torch.Tensor:
    """A float8 tensor as bytes (same shape), for the copies and gathers that have no float8
    kernels on every device; any other tensor as it is."""
    return x.view(torch.uint8) if x.dtype == FP8 else x


def from_raw(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Values read through `raw` back as the storage dtype `dtype`."""
    return x.view(FP8) if dtype == FP8 else x
