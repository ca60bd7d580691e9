"""`StepTable`: one step's page table and index tensors, and `IndexUploader`, which moves them
to the device in one non-blocking copy per step."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepTable:
    """What the attends of one step need. Pool rows are tokens of a pool viewed as
    `[num_pages * 2 * P, H, D]`: row `page * 2P + kv * P + slot` (kv 0 = K, 1 = V)."""

    num_frames: int            # F: frames written this step
    num_queries: int           # T = F * P
    num_kv_tokens: int         # Tk: visible tokens (all visible pages, the last one partial)
    write_pages: torch.Tensor  # [F] int64 device: page of each new frame (scratch if not stored)
    copy_src: torch.Tensor     # [2n] int64 device: pool rows of evicted specials (K rows, V rows)
    copy_dst: torch.Tensor     # [2n] int64 device: their rows in the special stream
    pages: torch.Tensor        # [m] int64 device: visible pages in attention order
    host_pages: torch.Tensor   # [m] int32 host: the same (FlashInfer plans from host tensors)
    host_qo_indptr: torch.Tensor      # [2] int32 host: [0, T]
    host_kv_indptr: torch.Tensor      # [2] int32 host: [0, m]
    host_last_page_len: torch.Tensor  # [1] int32 host: tokens in the last visible page


class IndexUploader:
    """Two host buffers (pinned on CUDA) used in turn, each guarded by an event, so that the
    host can fill one while the device may still be copying from the other."""

    def __init__(self, device: torch.device, capacity: int) -> None:
        self.device = device
        self._cuda = device.type == "cuda"
        self._slot = 0
        self._buffers: list[torch.Tensor] = []
        self._events = [torch.cuda.Event() for _ in range(2)] if self._cuda else []
        self._reserve(capacity)

    def _reserve(self, capacity: int) -> None:
        # Old buffers may still feed an in-flight copy; the caching host allocator keeps pinned
        # blocks alive until their recorded copies finish, so dropping them is safe.
        self._buffers = [torch.empty(capacity, dtype=torch.int32, pin_memory=self._cuda)
                         for _ in range(2)]

    def upload(self, values: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (host int32 view, device int64 copy) of `values`. Call `done()` after the
        last use of the host view in this step (planning)."""
        if self._cuda:
            # Blocks only if the device is still two steps behind on this buffer.
            self._events[self._slot].synchronize()
        if len(values) > self._buffers[0].numel():
            self._reserve(2 * len(values))
        host = self._buffers[self._slot][:len(values)]
        host.copy_(torch.tensor(values, dtype=torch.int32))
        device_values = host.to(self.device, non_blocking=True).long()
        return host, device_values

    def done(self) -> None:
        if self._cuda:
            self._events[self._slot].record()
        self._slot ^= 1
