"""`StepTable`: one step's page table and index tensors, and `IndexUploader`, which moves them
to the device in one non-blocking copy per step."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepTable:
    """What the attends of one step need. Pool rows are tokens of a pool viewed as
    `[num_pages * 2 * P, H, D]`: row `page * 2P + kv * P + slot` (kv 0 = K, 1 = V).

    A step is R requests (one per stream; a single-stream cache has R = 1): request r's queries
    are rows `qo_indptr[r]:qo_indptr[r+1]` and see only pages `kv_indptr[r]:kv_indptr[r+1]`."""

    num_frames: int            # F: frames written this step (all requests)
    num_queries: int           # T = F * P
    num_kv_tokens: int         # Tk: visible tokens (all requests' pages, each last one partial)
    write_pages: torch.Tensor  # [F] int64 device: page of each new frame (scratch if not stored)
    copy_src: torch.Tensor     # [2n] int64 device: pool rows of evicted specials (K rows, V rows)
    copy_dst: torch.Tensor     # [2n] int64 device: their rows in the special stream
    pages: torch.Tensor        # [m] int64 device: visible pages in attention order, request by request
    pages_i32: torch.Tensor    # [m] int32 device: the same (FlashInfer's index dtype)
    host_pages: torch.Tensor   # [m] int32 host: the same (for checks and diagnostics)
    host_qo_indptr: torch.Tensor      # [R+1] int32 host: [0, .., T]
    host_kv_indptr: torch.Tensor      # [R+1] int32 host: [0, .., m]
    host_last_page_len: torch.Tensor  # [R] int32 host: tokens in each request's last visible page
    # Single-frame step with its index tensors at the fixed offsets every such step uses (the
    # special-token copies padded to a fixed count): its device work can replay a CUDA graph.
    static: bool = False

    @property
    def num_requests(self) -> int:
        return len(self.host_last_page_len)


class IndexUploader:
    """Two host buffers (pinned on CUDA) used in turn, each guarded by an event, so that the
    host can fill one while the device may still be copying from the other. Every step lands
    in the same device buffer, so a step's index tensors sit at fixed addresses as long as
    their offsets are fixed (what a captured CUDA graph needs); `generation` counts the times
    that buffer was reallocated."""

    def __init__(self, device: torch.device, capacity: int) -> None:
        self.device = device
        self.generation = 0
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
        self._device32 = torch.empty(capacity, dtype=torch.int32, device=self.device)
        self._device64 = torch.empty(capacity, dtype=torch.int64, device=self.device)
        self.generation += 1

    def upload(self, values: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns (host int32, device int32, device int64) views of `values`. Call `done()`
        after the last use of the host view in this step (planning)."""
        if self._cuda:
            # Blocks only if the device is still two steps behind on this buffer.
            self._events[self._slot].synchronize()
        if len(values) > self._buffers[0].numel():
            self._reserve(2 * len(values))
        n = len(values)
        host = self._buffers[self._slot][:n]
        host.copy_(torch.tensor(values, dtype=torch.int32))
        device32, device64 = self._device32[:n], self._device64[:n]
        device32.copy_(host, non_blocking=True)
        device64.copy_(device32)
        return host, device32, device64

    def done(self) -> None:
        if self._cuda:
            self._events[self._slot].record()
        self._slot ^= 1
