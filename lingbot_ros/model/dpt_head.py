"""DPT depth head (spec 11): four token levels -> fused feature pyramid -> depth and confidence."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig


def _interp(x: torch.Tensor, size) -> torch.Tensor:
    return F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=True)


def position_embedding(channels: int, rows: int, cols: int, aspect: float, device) -> torch.Tensor:
    """Sin/cos embedding of normalised (u, v) coordinates scaled by the image aspect -> [C, rows, cols]."""
    diag = math.sqrt(aspect * aspect + 1.0)
    sx, sy = aspect / diag, 1.0 / diag
    u = torch.linspace(-sx * (cols - 1) / cols, sx * (cols - 1) / cols, cols, device=device).double()
    v = torch.linspace(-sy * (rows - 1) / rows, sy * (rows - 1) / rows, rows, device=device).double()
    q = channels // 4
    omega = 100.0 ** (-torch.arange(q, dtype=torch.float64, device=device) / q)
    eu, ev = u[:, None] * omega, v[:, None] * omega                            # [cols, q], [rows, q]
    pu = torch.cat([eu.sin(), eu.cos()], dim=1).T[:, None, :].expand(-1, rows, -1)   # [C/2, rows, cols]
    pv = torch.cat([ev.sin(), ev.cos()], dim=1).T[:, :, None].expand(-1, -1, cols)
    return torch.cat([pu, pv]).float()


class ResidualConvUnit(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.conv1 = nn.Conv2d(features, features, 3, padding=1)
        self.conv2 = nn.Conv2d(features, features, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [quirk] upstream's first ReLU is in place, so the skip adds relu(x), not x.
        x = F.relu(x)
        return x + self.conv2(F.relu(self.conv1(x)))


class FeatureFusionBlock(nn.Module):
    def __init__(self, features: int, has_skip: bool = True):
        super().__init__()
        if has_skip:
            self.resConfUnit1 = ResidualConvUnit(features)
        self.resConfUnit2 = ResidualConvUnit(features)
        self.out_conv = nn.Conv2d(features, features, 1)

    def forward(self, x: torch.Tensor, skip, size) -> torch.Tensor:
        if skip is not None:
            x = x + self.resConfUnit1(skip)
        return self.out_conv(_interp(self.resConfUnit2(x), size))


class Scratch(nn.Module):
    def __init__(self, features: int, out_channels):
        super().__init__()
        for i, oc in enumerate(out_channels):
            setattr(self, f"layer{i + 1}_rn", nn.Conv2d(oc, features, 3, padding=1, bias=False))
        self.refinenet1 = FeatureFusionBlock(features)
        self.refinenet2 = FeatureFusionBlock(features)
        self.refinenet3 = FeatureFusionBlock(features)
        self.refinenet4 = FeatureFusionBlock(features, has_skip=False)
        self.output_conv1 = nn.Conv2d(features, features // 2, 3, padding=1)
        self.output_conv2 = nn.Sequential(nn.Conv2d(features // 2, 32, 3, padding=1), nn.ReLU(),
                                          nn.Conv2d(32, 2, 1))


class DPTHead(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        D, oc, f = cfg.camera_dim, cfg.depth_head.out_channels, cfg.depth_head.features
        self.patch_size = cfg.patch_size
        self.num_special = cfg.num_special_tokens
        self.norm = nn.LayerNorm(D, eps=1e-5)                   # one norm shared by all four levels
        self.projects = nn.ModuleList(nn.Conv2d(D, c, 1) for c in oc)
        self.resize_layers = nn.ModuleList([
            nn.ConvTranspose2d(oc[0], oc[0], 4, stride=4),       # x4
            nn.ConvTranspose2d(oc[1], oc[1], 2, stride=2),       # x2
            nn.Identity(),                                       # x1
            nn.Conv2d(oc[3], oc[3], 3, stride=2, padding=1),     # x1/2
        ])
        self.scratch = Scratch(f, oc)
        self._pe: dict = {}       # positional embeddings depend only on sizes: build once per stream size

    def _position_embedding(self, channels: int, rows: int, cols: int, aspect: float, device) -> torch.Tensor:
        key = (channels, rows, cols, aspect, str(device))
        if key not in self._pe:
            self._pe[key] = position_embedding(channels, rows, cols, aspect, device)
        return self._pe[key]

    def forward(self, outputs: list[torch.Tensor], H: int, W: int):
        """outputs: 4 x [S, P, 2C] -> depth [S, H, W, 1], depth_conf [S, H, W]."""
        S = outputs[0].shape[0]
        h, w = H // self.patch_size, W // self.patch_size
        aspect = W / H
        levels = []
        for i, out in enumerate(outputs):
            t = self.norm(out[:, self.num_special:])                          # [S, N, 2C]
            t = t.transpose(1, 2).reshape(S, -1, h, w)                        # [S, 2C, h, w]
            t = self.projects[i](t)
            t = t + 0.1 * self._position_embedding(t.shape[1], h, w, aspect, t.device)
            t = self.resize_layers[i](t)
            levels.append(getattr(self.scratch, f"layer{i + 1}_rn")(t))
        sc = self.scratch
        z = sc.refinenet4(levels[3], None, levels[2].shape[-2:])
        z = sc.refinenet3(z, levels[2], levels[1].shape[-2:])
        z = sc.refinenet2(z, levels[1], levels[0].shape[-2:])
        z = sc.refinenet1(z, levels[0], (2 * z.shape[-2], 2 * z.shape[-1]))
        z = _interp(sc.output_conv1(z), (H, W))
        z = z + 0.1 * self._position_embedding(z.shape[1], H, W, aspect, z.device)
        z = sc.output_conv2(z)                                                # [S, 2, H, W]
        return z[:, 0, :, :, None].exp(), 1 + z[:, 1].exp()
