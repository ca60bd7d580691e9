"""Aggregator (spec 4, 6, 7): patch embed, special tokens, alternating frame / global blocks."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import torch
from torch import nn

from ..cache.partials import PartialAttention
from .config import ModelConfig
from .layers import Block
from .patch_embed import build_patch_embed
from .rope import Rope2D, Rope3D

# global_attend(layer, q, k, v), all [F, P, H, D], k already rotated -> out [F, P, H, D], or its
# unmerged parts over disjoint key sets (a paged cache's split attention; the block merges them).
# The streaming session implements it with its KV cache.
GlobalAttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], "torch.Tensor | PartialAttention"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class Aggregator(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        C, R = cfg.embed_dim, cfg.num_register_tokens
        self.patch_size = cfg.patch_size
        # Two slots each (spec 6): camera/register slot 0 = first frame of the stream,
        # scale slot 0 = phase-1 frames.
        self.camera_token = nn.Parameter(torch.zeros(1, 2, 1, C))
        self.register_token = nn.Parameter(torch.zeros(1, 2, R, C))
        self.scale_token = nn.Parameter(torch.zeros(1, 2, 1, C))
        self.patch_embed = build_patch_embed(cfg)
        self.frame_blocks = nn.ModuleList(Block(C, cfg.num_heads, cfg.mlp_ratio, qk_norm=True, eps=1e-5)
                                          for _ in range(cfg.depth))
        self.global_blocks = nn.ModuleList(Block(C, cfg.num_heads, cfg.mlp_ratio, qk_norm=True, eps=1e-5)
                                           for _ in range(cfg.depth))
        self.selected_layers = frozenset(cfg.selected_layers)
        self.rope2d = Rope2D(cfg.head_dim, cfg.rope2d_freq, cfg.num_special_tokens)
        self.rope3d = (Rope3D(cfg.head_dim, cfg.rope3d_fhw_dim, cfg.rope3d_theta, cfg.num_special_tokens)
                       if cfg.enable_3d_rope else None)
        # Exact fp32 constants, never rounded to the compute dtype (spec 3 quirk avoided).
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def special_tokens(self, num_frames: int, first_frame: bool, scale_slot: int) -> torch.Tensor:
        S = num_frames
        cam = self.camera_token[0, 1:2].expand(S, -1, -1)                     # [S, 1, C]
        reg = self.register_token[0, 1:2].expand(S, -1, -1)                   # [S, R, C]
        if first_frame:
            cam = torch.cat([self.camera_token[0, 0:1], cam[1:]])
            reg = torch.cat([self.register_token[0, 0:1], reg[1:]])
        scale = self.scale_token[0, scale_slot:scale_slot + 1].expand(S, -1, -1)
        return torch.cat([cam, reg, scale], dim=1)                             # [S, 2+R, C]

    def forward(self, images: torch.Tensor, *, first_frame: bool, scale_slot: int,
                time_index: torch.Tensor, global_attend: GlobalAttendFn) -> list[torch.Tensor]:
        """images [S, 3, H, W] in [0, 1]; time_index float64 [S] -> the selected layers' outputs
        (4 of them) [S, P, 2C]."""
        return self.forward_patches(self.embed(images), images.shape[-2:], first_frame=first_frame,
                                    scale_slot=scale_slot, time_index=time_index,
                                    global_attend=global_attend)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """images [S, 3, H, W] in [0, 1] -> patch tokens [S, N, C]. Reads no cache: a streaming
        caller can start it before the caches' bookkeeping for the same frame."""
        return self.patch_embed((images - self.mean) / self.std)

    def forward_patches(self, patches: torch.Tensor, image_hw: tuple[int, int], *, first_frame: bool,
                        scale_slot: int, time_index: torch.Tensor,
                        global_attend: GlobalAttendFn) -> list[torch.Tensor]:
        """`forward` after `embed`: patches [S, N, C] of images of size image_hw (H, W)."""
        run = self.begin(patches, image_hw, first_frame=first_frame, scale_slot=scale_slot, time_index=time_index)
        self.run_layers(run, global_attend, len(self.frame_blocks))
        return run.outputs

    def begin(self, patches: torch.Tensor, image_hw: tuple[int, int], *, first_frame: bool, scale_slot: int,
              time_index: torch.Tensor) -> "AggregatorRun":
        """A run of the layers that `run_layers` takes a few at a time (a call cut into slices, whose
        outputs equal those of one `forward_patches`)."""
        S = patches.shape[0]
        h, w = image_hw[0] // self.patch_size, image_hw[1] // self.patch_size
        x = torch.cat([self.special_tokens(S, first_frame, scale_slot), patches], dim=1)  # [S, P, C]
        rope_frame = self.rope2d(h, w, patches.device)
        # Without 3D RoPE the global blocks reuse the 2D positions (no temporal information).
        rope_global = self.rope3d(time_index, h, w) if self.rope3d is not None else rope_frame
        return AggregatorRun(x, rope_frame, rope_global)

    def run_layers(self, run: "AggregatorRun", global_attend: GlobalAttendFn, count: int) -> bool:
        """The next ``count`` frame/global layer pairs of ``run``; whether all have run."""
        stop = min(run.next_layer + count, len(self.frame_blocks))
        for i in range(run.next_layer, stop):
            x = self.frame_blocks[i](run.x, run.rope_frame)
            frame_out = x
            run.x = self.global_blocks[i](x, run.rope_global, partial(global_attend, i))
            if i in self.selected_layers:
                run.outputs.append(torch.cat([frame_out, run.x], dim=-1))      # frame first, then global
        run.next_layer = stop
        return stop == len(self.frame_blocks)


@dataclass
class AggregatorRun:
    """An aggregator call between its layers: the tokens, the positions, the selected outputs."""

    x: torch.Tensor                       # [S, P, C] after the layers run so far
    rope_frame: object
    rope_global: object
    outputs: list[torch.Tensor] = field(default_factory=list)   # the selected layers' [S, P, 2C]
    next_layer: int = 0
