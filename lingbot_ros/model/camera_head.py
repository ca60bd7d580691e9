"""Camera head (spec 10): iterative, causal over stored frames through its own KV caches."""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from .camera_cache import CameraKVCache
from .config import ModelConfig
from .layers import Block, Mlp

POSE_DIM = 9   # (tx, ty, tz, qx, qy, qz, qw, fov_h, fov_w)


def activate_pose(raw: torch.Tensor) -> torch.Tensor:
    """Translation and quaternion stay linear, the two FoVs go through ReLU."""
    return torch.cat([raw[..., :7], F.relu(raw[..., 7:])], dim=-1)


class CameraHead(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        D, ch = cfg.camera_dim, cfg.camera_head
        self.trunk_depth = ch.trunk_depth
        self.num_heads = ch.num_heads
        self.token_norm = nn.LayerNorm(D, eps=1e-5)
        self.trunk_norm = nn.LayerNorm(D, eps=1e-5)
        self.adaln_norm = nn.LayerNorm(D, eps=1e-6, elementwise_affine=False)
        self.empty_pose_tokens = nn.Parameter(torch.zeros(1, 1, POSE_DIM))
        self.embed_pose = nn.Linear(POSE_DIM, D)
        self.poseLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(D, 3 * D))
        self.trunk = nn.ModuleList(Block(D, ch.num_heads, ch.mlp_ratio, qk_norm=False, eps=1e-5)
                                   for _ in range(ch.trunk_depth))
        self.pose_branch = Mlp(D, D // 2, POSE_DIM)

    def new_cache(self, num_iterations: int, device, capacity: int = 64,
                  static: bool = False) -> CameraKVCache:
        D = self.token_norm.normalized_shape[0]
        return CameraKVCache(num_iterations * self.trunk_depth, self.num_heads, D // self.num_heads,
                             device, capacity, static=static)

    def forward(self, camera_tokens: torch.Tensor, cache: CameraKVCache,
                num_iterations: int) -> torch.Tensor:
        """camera_tokens [S, 2C] (token 0 of the last selected output) -> activated poses [I, S, 9].

        The S frames form one sequence that also sees the cached frames; the caller has called
        cache.begin_step(S, store).
        """
        c = self.token_norm(camera_tokens)[None]                               # [1, S, 2C]
        c_norm = self.adaln_norm(c)
        raw = None
        poses = []
        for it in range(num_iterations):
            # Iteration > 0 feeds back the raw (pre-ReLU) pose.
            e = self.empty_pose_tokens.expand(1, c.shape[1], -1) if raw is None else raw
            shift, scale, gate = self.poseLN_modulation(self.embed_pose(e)).chunk(3, dim=-1)
            x = gate * (c_norm * (1 + scale) + shift) + c
            for j, block in enumerate(self.trunk):
                x = block(x, attend=partial(cache.attend, it * self.trunk_depth + j))
            delta = self.pose_branch(self.trunk_norm(x))                       # [1, S, 9]
            raw = delta if raw is None else raw + delta
            poses.append(activate_pose(raw))
        return torch.cat(poses)                                                # [I, S, 9]
