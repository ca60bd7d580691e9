"""Rotary position embeddings (spec 8): 2D rotate-half for frame blocks, 3D interleaved for global blocks.

Angles are computed in float64 and only cos/sin are cast to float32, so any 3D time index works
(no 1024-row table) and values below the trained range equal upstream's precomputed table.
"""
from __future__ import annotations

import torch


def rotate_half_2d(x: torch.Tensor) -> torch.Tensor:
    """Rotate-half pairing inside each half of the head (row half, column half): k pairs with k + D/4."""
    x1, x2 = x.unflatten(-1, (2, 2, x.shape[-1] // 4)).unbind(-2)   # [..., part, D/4] each
    return torch.stack((-x2, x1), dim=-2).flatten(-3)


def rotate_interleaved(x: torch.Tensor) -> torch.Tensor:
    """Interleaved complex pairing: dims (2i, 2i+1) form pair i."""
    x0, x1 = x.unflatten(-1, (-1, 2)).unbind(-1)                    # [..., D/2] each
    return torch.stack((-x1, x0), dim=-1).flatten(-2)


class Rotation:
    """cos/sin for one call's tokens; rotates q or k laid out [B, T, H, D]."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor, pairing):
        # cos/sin arrive [T, D] or [B, T, D]; insert the head axis once here, not per layer.
        self.cos, self.sin, self.pairing = cos.unsqueeze(-2), sin.unsqueeze(-2), pairing

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.cos + self.pairing(x) * self.sin


def _omega(base: float, pairs: int, dim: int, device) -> torch.Tensor:
    k = torch.arange(pairs, dtype=torch.float64, device=device)
    return base ** (-2.0 * k / dim)                                   # float64 [pairs]


def _grid(h: int, w: int, device):
    rows = torch.arange(h, dtype=torch.float64, device=device).repeat_interleave(w)
    cols = torch.arange(w, dtype=torch.float64, device=device).repeat(h)
    return rows, cols                                                 # row-major, [h*w] each


class Rope2D:
    """Frame-block RoPE: specials at (0, 0), patch (r, c) at (r + 1, c + 1)."""

    def __init__(self, head_dim: int, freq: float, num_special: int):
        self.head_dim, self.freq, self.num_special = head_dim, freq, num_special
        self._tables: dict = {}

    def __call__(self, h: int, w: int, device) -> Rotation:
        key = (h, w, str(device))
        if key not in self._tables:
            self._tables[key] = self._build(h, w, device)
        return Rotation(*self._tables[key], rotate_half_2d)

    def _build(self, h, w, device):
        quarter = self.head_dim // 4
        omega = _omega(self.freq, quarter, self.head_dim // 2, device)
        rows, cols = _grid(h, w, device)
        zeros = torch.zeros(self.num_special, dtype=torch.float64, device=device)
        py, px = torch.cat([zeros, rows + 1]), torch.cat([zeros, cols + 1])   # [P]
        ay, ax = py[:, None] * omega, px[:, None] * omega                        # [P, D/4]
        angle = torch.cat([ay, ay, ax, ax], dim=-1)                              # [P, D]
        return angle.cos().float(), angle.sin().float()


class Rope3D:
    """Global-block RoPE: special j at (f, j, j), patch (r, c) at (f, S + r, S + c), S = #specials."""

    def __init__(self, head_dim: int, fhw_dim, theta: float, num_special: int):
        self.fhw_dim, self.theta, self.num_special = tuple(fhw_dim), theta, num_special
        self._spatial: dict = {}
        self._omega_t: dict = {}

    def __call__(self, time_index: torch.Tensor, h: int, w: int) -> Rotation:
        """time_index: float64 [F] (one per frame of this call) -> rotation for [F, P, H, D]."""
        device = time_index.device
        key = (h, w, str(device))
        if key not in self._spatial:
            self._spatial[key] = self._build_spatial(h, w, device)
            self._omega_t[str(device)] = _omega(self.theta, self.fhw_dim[0] // 2, self.fhw_dim[0], device)
        spatial = self._spatial[key]                                              # [P, D_hw] float64
        at = time_index[:, None] * self._omega_t[str(device)]                     # [F, D_t/2]
        at = at.repeat_interleave(2, dim=-1)[:, None, :].expand(-1, spatial.shape[0], -1)
        angle = torch.cat([at, spatial.expand(at.shape[0], -1, -1)], dim=-1)      # [F, P, D]
        return Rotation(angle.cos().float(), angle.sin().float(), rotate_interleaved)

    def _build_spatial(self, h, w, device):
        _, dh, dw = self.fhw_dim
        rows, cols = _grid(h, w, device)
        special = torch.arange(self.num_special, dtype=torch.float64, device=device)
        pa = torch.cat([special, rows + self.num_special])                       # [P]
        pb = torch.cat([special, cols + self.num_special])
        aa = pa[:, None] * _omega(self.theta, dh // 2, dh, device)
        ab = pb[:, None] * _omega(self.theta, dw // 2, dw, device)
        return torch.cat([aa, ab], dim=-1).repeat_interleave(2, dim=-1)          # [P, D_hw]
