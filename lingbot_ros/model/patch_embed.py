"""Patch embeddings (spec 5 and 16.1): DINOv2 ViT with registers, or a bare 14x14 conv."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .layers import Block


class ConvPatchEmbed(nn.Module):
    """Conv(3 -> C, kernel = stride = patch) -> row-major patch tokens."""

    def __init__(self, patch_size: int, dim: int):
        super().__init__()
        self.proj = nn.Conv2d(3, dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.proj(images).flatten(2).transpose(1, 2)      # [S, C, h, w] -> [S, N, C]


class DinoV2PatchEmbed(nn.Module):
    """DINOv2 backbone: [cls, registers, patches] through pre-norm blocks, patch tokens kept."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        pe, C = cfg.patch_embed, cfg.embed_dim
        self.grid = cfg.img_size // cfg.patch_size
        self.num_prefix = 1 + pe.num_register_tokens
        self.patch_embed = ConvPatchEmbed(cfg.patch_size, C)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, C))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + self.grid * self.grid, C))
        self.register_tokens = nn.Parameter(torch.zeros(1, pe.num_register_tokens, C))
        self.mask_token = nn.Parameter(torch.zeros(1, C))         # in the checkpoint, never used
        self.blocks = nn.ModuleList(Block(C, pe.num_heads, pe.mlp_ratio, qk_norm=False, eps=1e-6)
                                    for _ in range(pe.depth))
        self.norm = nn.LayerNorm(C, eps=1e-6)

    def patch_pos_embed(self, h: int, w: int) -> torch.Tensor:
        pos = self.pos_embed[:, 1:].float()
        if (h, w) == (self.grid, self.grid):
            return pos
        grid = pos.reshape(1, self.grid, self.grid, -1).permute(0, 3, 1, 2)   # [1, C, G, G]
        # Antialiased bicubic to an explicit size, in fp32 (spec 5: both matter for parity).
        with torch.autocast(grid.device.type, enabled=False):
            grid = F.interpolate(grid, size=(h, w), mode="bicubic", antialias=True, align_corners=False)
        return grid.flatten(2).transpose(1, 2)                                 # [1, h*w, C]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        S, _, H, W = images.shape
        h, w = H // self.patch_embed.proj.stride[0], W // self.patch_embed.proj.stride[1]
        x = self.patch_embed(images) + self.patch_pos_embed(h, w)             # [S, N, C]
        cls = (self.cls_token + self.pos_embed[:, :1]).expand(S, -1, -1)
        x = torch.cat([cls, self.register_tokens.expand(S, -1, -1), x], dim=1)  # [S, 1+R+N, C]
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x)[:, self.num_prefix:]                               # [S, N, C]


def build_patch_embed(cfg: ModelConfig) -> nn.Module:
    if cfg.patch_embed.type == "conv":
        return ConvPatchEmbed(cfg.patch_size, cfg.embed_dim)
    return DinoV2PatchEmbed(cfg)
