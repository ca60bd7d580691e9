"""Pose decoding and unprojection (spec 12). Extrinsics are camera-to-world, OpenCV camera axes."""
from __future__ import annotations

import torch

# fov = 0 (after the ReLU) would give an infinite focal length; clamp tan(fov/2) away from 0.
_MIN_TAN_HALF_FOV = 1e-6


def quaternion_to_rotation(q: torch.Tensor) -> torch.Tensor:
    """Scalar-last, unnormalised (x, y, z, w) [..., 4] -> rotation [..., 3, 3] (s = 2/|q|^2)."""
    x, y, z, w = q.unbind(-1)
    s = 2.0 / (q * q).sum(-1)
    rows = [
        1 - s * (y * y + z * z), s * (x * y - z * w), s * (x * z + y * w),
        s * (x * y + z * w), 1 - s * (x * x + z * z), s * (y * z - x * w),
        s * (x * z - y * w), s * (y * z + x * w), 1 - s * (x * x + y * y),
    ]
    return torch.stack(rows, dim=-1).unflatten(-1, (3, 3))


def pose_to_extrinsic(pose_enc: torch.Tensor) -> torch.Tensor:
    """pose_enc [..., 9] -> camera-to-world [R | t] [..., 3, 4]."""
    R = quaternion_to_rotation(pose_enc[..., 3:7])
    return torch.cat([R, pose_enc[..., :3, None]], dim=-1)


def pose_to_intrinsic(pose_enc: torch.Tensor, width: float, height: float) -> torch.Tensor:
    """pose_enc [..., 9] -> pinhole K [..., 3, 3] for an image of width x height pixels.

    Index 7 is the vertical FoV, index 8 the horizontal one; principal point at the centre.
    """
    fov_h, fov_w = pose_enc[..., 7], pose_enc[..., 8]
    fx = (width / 2) / torch.tan(fov_w / 2).clamp_min(_MIN_TAN_HALF_FOV)
    fy = (height / 2) / torch.tan(fov_h / 2).clamp_min(_MIN_TAN_HALF_FOV)
    K = torch.zeros(pose_enc.shape[:-1] + (3, 3), dtype=pose_enc.dtype, device=pose_enc.device)
    K[..., 0, 0], K[..., 1, 1] = fx, fy
    K[..., 0, 2], K[..., 1, 2], K[..., 2, 2] = width / 2, height / 2, 1.0
    return K


def scale_intrinsic(K: torch.Tensor, from_size, to_size) -> torch.Tensor:
    """Rescale K [..., 3, 3] from an image of (w, h) pixels to one of (w', h') pixels."""
    sx, sy = to_size[0] / from_size[0], to_size[1] / from_size[1]
    scale = torch.tensor([sx, sy, 1.0], dtype=K.dtype, device=K.device)
    return K * scale[:, None]


def depth_to_world_points(depth: torch.Tensor, extrinsic: torch.Tensor,
                          intrinsic: torch.Tensor) -> torch.Tensor:
    """depth [S, H, W], c2w [S, 3, 4], K [S, 3, 3] -> world points [S, H, W, 3] (no half-pixel offset)."""
    S, H, W = depth.shape
    v, u = torch.meshgrid(torch.arange(H, device=depth.device, dtype=depth.dtype),
                          torch.arange(W, device=depth.device, dtype=depth.dtype), indexing="ij")
    fx, fy = intrinsic[:, 0, 0, None, None], intrinsic[:, 1, 1, None, None]
    cx, cy = intrinsic[:, 0, 2, None, None], intrinsic[:, 1, 2, None, None]
    cam = torch.stack([(u - cx) / fx * depth, (v - cy) / fy * depth, depth], dim=-1)   # [S, H, W, 3]
    R, t = extrinsic[:, :, :3], extrinsic[:, :, 3]
    return torch.einsum("sij,shwj->shwi", R, cam) + t[:, None, None, :]
