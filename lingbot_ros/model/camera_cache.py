"""The camera head's per-(iteration, trunk block) KV caches (spec 10): one token per stored frame.

Every stored frame enters all caches at once, so one shared length describes them all. Storage is a
preallocated buffer whose capacity doubles when full; nothing is concatenated per frame.

With `static=True`, single-frame calls keep fixed shapes: the write row and the visible length live
in device tensors and attention runs over the whole capacity with the rows past the length masked
out, so a CUDA graph of the call stays valid until the capacity grows (`generation` counts that).
`reset` keeps the capacity: a new stream reuses the buffers and grows them only past the longest
stream so far.
"""
from __future__ import annotations

import torch

from .layers import dense_attend


class CameraCacheEmpty(RuntimeError):
    """Rollback asked of a camera cache that holds no frame."""


class CameraKVCache:
    def __init__(self, num_caches: int, num_heads: int, head_dim: int, device, capacity: int = 64,
                 dtype: torch.dtype = torch.float32, static: bool = False):
        shape = (num_caches, capacity, num_heads, head_dim)
        # Zeroed: masked rows still enter the fixed-shape matmuls, and 0 * NaN garbage is NaN.
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0        # stored frames
        self._end = 0          # stored frames + this call's frames (visible to this call)
        self.static = static
        self.generation = 0
        self._static_step = False
        self._row = torch.zeros(1, dtype=torch.int64, device=device)   # static: this call's row
        self._hidden = torch.zeros(capacity, dtype=torch.bool, device=device)   # static: row >= end
        self._rows = torch.arange(capacity, device=device)

    @property
    def capacity(self) -> int:
        return self.k.shape[1]

    def begin_step(self, num_frames: int, store: bool) -> None:
        """Reserve this call's rows; stored frames stay, scratch rows are overwritten next call."""
        self._end = self.length + num_frames
        if self._end > self.capacity:
            self._grow(self._end)
        if store:
            self.length = self._end
        self._static_step = self.static and num_frames == 1
        if self._static_step:
            # Once per call, not per cache: every cache of the call sees the same rows.
            self._row.fill_(self._end - 1)
            torch.ge(self._rows, self._end, out=self._hidden)

    def attend(self, slot: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v [1, F, H, D] (this call's frames as one sequence) -> [1, F, H, D]."""
        if self._static_step:
            self.k[slot].index_copy_(0, self._row, k[0])
            self.v[slot].index_copy_(0, self._row, v[0])
            return self._one_query_attend(q, self.k[slot], self.v[slot])
        start = self._end - q.shape[1]
        self.k[slot, start:self._end] = k[0]
        self.v[slot, start:self._end] = v[0]
        return dense_attend(q, self.k[slot, None, :self._end], self.v[slot, None, :self._end])

    def _one_query_attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [1, 1, H, D] over the visible rows of k, v [capacity, H, D] -> [1, 1, H, D]. Two
        batched matrix-vector products, which spread over the keys: a fused attention kernel
        gives one query one block per head that walks every key (on the H200, 16 such calls
        took 3.4 ms per frame at 2,000 frames, growing with the capacity)."""
        scores = torch.einsum("hd,khd->hk", q[0, 0] * q.shape[-1] ** -0.5, k)   # [H, capacity]
        scores = scores.masked_fill(self._hidden, float("-inf")).softmax(-1)
        return torch.einsum("hk,khd->hd", scores, v)[None, None]

    def rollback_last_frame(self) -> None:
        if self.length == 0:
            raise CameraCacheEmpty("camera-head cache holds no frame to roll back")
        self.length -= 1

    def reset(self) -> None:
        """Empty, same buffers (capacity and `generation` unchanged), zeroed in place: masked rows
        enter the fixed-shape attention, so stale NaN must not survive into the next stream."""
        self.length = self._end = 0
        with torch.inference_mode():   # writable whether or not they were made under it
            self.k.zero_()
            self.v.zero_()

    def take_over(self, other: "CameraKVCache") -> None:
        """This empty cache holds ``other``'s stored frames (copied; the capacity grows only if
        they do not fit). ValueError, having changed nothing, when this one holds frames or the
        caches differ in layout."""
        if self.length:
            raise ValueError("the camera cache holds frames; reset it before taking another's over")
        if (self.k.shape[0], *self.k.shape[2:], self.k.dtype) != (other.k.shape[0], *other.k.shape[2:], other.k.dtype):
            raise ValueError("camera caches of different layouts (caches, heads, head size or dtype)")
        n = other.length
        if n > self.capacity:
            self._grow(n)
        with torch.inference_mode():   # as reset: the buffers may be inference tensors
            self.k[:, :n] = other.k[:, :n]
            self.v[:, :n] = other.v[:, :n]
        self.length = self._end = n

    def nbytes(self) -> int:
        """Bytes allocated (K and V, all caches, the whole capacity)."""
        return 2 * self.k.numel() * self.k.element_size()

    def nbytes_in_use(self) -> int:
        """Bytes of the stored frames' rows: what a stream holds (0 after reset)."""
        return self.nbytes() * self.length // self.capacity

    def _grow(self, needed: int) -> None:
        capacity = self.capacity
        while capacity < needed:
            capacity *= 2
        for name in ("k", "v"):
            old = getattr(self, name)
            new = old.new_zeros((old.shape[0], capacity) + tuple(old.shape[2:]))
            new[:, :self.length] = old[:, :self.length]
            setattr(self, name, new)
        self._rows = torch.arange(capacity, device=self.k.device)
        self._hidden = torch.zeros(capacity, dtype=torch.bool, device=self.k.device)
        self.generation += 1


class CameraCacheBatch:
    """Several streams' camera caches serving one call whose tokens are one frame per stream.

    The camera head treats the call's tokens as one sequence; everything but attention is per
    token, so only `attend` has to know the streams: token i attends over stream i's cache alone,
    exactly as that stream's own single-frame call would. The caller has called each cache's
    `begin_step(1, store)`."""

    def __init__(self, caches: list[CameraKVCache]):
        self.caches = caches

    def attend(self, slot: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v [1, N, H, D] (token i = stream i's frame) -> [1, N, H, D]."""
        return torch.cat([cache.attend(slot, q[:, i:i + 1], k[:, i:i + 1], v[:, i:i + 1])
                          for i, cache in enumerate(self.caches)], dim=1)
