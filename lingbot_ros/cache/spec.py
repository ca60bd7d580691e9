"""`CacheSpec`: the shapes and policy knobs of one paged KV cache, with derived sizes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kv_storage import FP8


@dataclass(frozen=True)
class CacheSpec:
    """What a `PagedKVCache` holds and how it evicts (spec section 9).

    One page holds one frame's `tokens_per_frame` (P) tokens, specials first, in every layer.
    Sizes in bytes cover K and V.
    """

    num_layers: int
    num_heads: int
    head_dim: int
    tokens_per_frame: int            # P: specials first, then patches
    special_tokens: int = 6          # camera, 4 registers, scale
    scale_frames: int = 8            # A: anchors = first A frames appended since reset
    sliding_window: int = 64         # Wn: newest stored frames kept whole
    cross_frame_special: bool = True  # evicted frames leave their specials behind
    # Keep the first A frames as anchors. False: no anchors, and every eviction also drops the
    # A oldest retained frames without keeping their specials (spec 9, patch_stream.py).
    include_scale_frames: bool = True
    camera_only: bool = False        # evicted frames leave only the camera token (index 0)
    deferred_capacity: int = 8       # pages of evicted (or dropped) frames waiting for flush()
    special_chunk_pages: int = 4     # special stream grows by this many pages at a time
    max_special_tokens: int | None = None  # cap on the special stream; None = unbounded
    dtype: torch.dtype = torch.float32   # the queries' and outputs' dtype
    device: torch.device | str = "cpu"
    # What the pools store K and V in: None = `dtype`, or float8 e4m3 (`kv_storage.FP8`).
    kv_dtype: torch.dtype | None = None
    # The visible pages of a full window's step, which set how many parts a step's pages are
    # attended in (attention_flashinfer.py): None = this cache's own window (scale_frames +
    # sliding_window). A cache that runs part of another's stream (a spare session's) gives the
    # other's, so that both split alike and round alike.
    split_window_pages: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_heads", "head_dim", "tokens_per_frame", "special_tokens",
                     "sliding_window", "special_chunk_pages"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"CacheSpec.{name} must be a positive int, got {value!r}")
        for name in ("scale_frames", "deferred_capacity"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"CacheSpec.{name} must be an int >= 0, got {value!r}")
        for name in ("cross_frame_special", "include_scale_frames", "camera_only"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"CacheSpec.{name} must be a bool, got {getattr(self, name)!r}")
        if self.special_tokens > self.tokens_per_frame:
            raise ValueError(
                f"CacheSpec.special_tokens ({self.special_tokens}) exceeds tokens_per_frame "
                f"({self.tokens_per_frame}); a frame's specials are its first tokens")
        cap = self.max_special_tokens
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 0):
            raise ValueError(f"CacheSpec.max_special_tokens must be None or an int >= 0, got {cap!r}")
        pages = self.split_window_pages
        if pages is not None and (not isinstance(pages, int) or isinstance(pages, bool) or pages < 1):
            raise ValueError(f"CacheSpec.split_window_pages must be None or a positive int, got {pages!r}")
        if not isinstance(self.dtype, torch.dtype) or not self.dtype.is_floating_point:
            raise ValueError(f"CacheSpec.dtype must be a floating torch.dtype, got {self.dtype!r}")
        if self.kv_dtype not in (None, self.dtype, FP8):
            raise ValueError(f"CacheSpec.kv_dtype must be None, the spec's dtype ({self.dtype}) or "
                             f"{FP8}, got {self.kv_dtype!r}")
        # Normalise so that comparisons and tensor factories see one type.
        object.__setattr__(self, "device", torch.device(self.device))

    # ---- derived sizes ----------------------------------------------------------------------

    @property
    def storage_dtype(self) -> torch.dtype:
        """The dtype of the pools."""
        return self.kv_dtype or self.dtype

    @property
    def frame_pages(self) -> int:
        """Pages for stored and pending frames: A + Wn stored after a step, one more while a
        step's new frame exists before its eviction is freed, plus `deferred_capacity`."""
        return self.scale_frames + self.sliding_window + 1 + self.deferred_capacity

    @property
    def full_window_pages(self) -> int:
        """The pages a full window's single-frame step sees (`split_window_pages` where given)."""
        if self.split_window_pages is not None:
            return self.split_window_pages
        return self.sliding_window + (self.scale_frames if self.include_scale_frames else 0)

    @property
    def scratch_page(self) -> int:
        """Page id of the scratch page that holds a non-keyframe's K/V (never stored)."""
        return self.frame_pages

    @property
    def patch_pages(self) -> int:
        """Frame pages plus the scratch page; special pages are numbered after these."""
        return self.frame_pages + 1

    @property
    def frames_per_eviction(self) -> int:
        """Frames a single-frame step that evicts takes out of attention: 1, or A + 1 without
        anchors (one evicted, A dropped). A deferral budget below this defers no eviction."""
        return 1 if self.include_scale_frames else self.scale_frames + 1

    @property
    def specials_per_evicted_frame(self) -> int:
        """Special tokens an evicted frame leaves in the special stream (frames dropped under
        include_scale_frames=False leave none)."""
        if not self.cross_frame_special:
            return 0
        return 1 if self.camera_only else self.special_tokens

    @property
    def token_bytes(self) -> int:
        """Bytes of one token's K and V over all layers."""
        itemsize = torch.empty((), dtype=self.storage_dtype).element_size()
        return self.num_layers * 2 * self.num_heads * self.head_dim * itemsize

    @property
    def layer_page_bytes(self) -> int:
        """Bytes of one page (P tokens, K and V) in one layer's pool."""
        return self.page_bytes // self.num_layers

    @property
    def page_bytes(self) -> int:
        """Bytes of one page over all layers (pages are shared by all layers)."""
        return self.tokens_per_frame * self.token_bytes

    @property
    def base_pages(self) -> int:
        """Pages per layer at construction: patch pages plus the first special chunk."""
        return self.patch_pages + self.special_chunk_pages
