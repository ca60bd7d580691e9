"""Depth maps to coloured 3D points (spec section 12).

Works on numpy arrays and on torch tensors (any device); the output has the input's type, so a
GPU depth map is unprojected on the GPU; point selection copies only the strided pixels to the host.
"""
from __future__ import annotations

import numpy as np
import torch

Array = np.ndarray | torch.Tensor


def depth_to_points(depth: Array, intrinsic: Array, extrinsic_c2w: Array) -> Array:
    """Unproject a depth map to world points, exactly as spec section 12 does.

    ``X_cam(u, v) = depth(v, u) * ((u - cx) / fx, (v - cy) / fy, 1)`` with ``u, v`` the integer
    pixel indices (column 0..W-1, row 0..H-1, no half-pixel offset), then
    ``X_world = R @ X_cam + t``.

    Args:
        depth: ``[H, W]`` or ``[H, W, 1]``, depth along the optical axis in the model's units
            (metres up to the model's unknown scale).
        intrinsic: ``[3, 3]`` pinhole matrix for the depth map's resolution (pixels).
        extrinsic_c2w: ``[3, 4]`` or ``[4, 4]`` camera-to-world ``[R | t]`` (OpenCV camera axes).

    Returns:
        ``[H, W, 3]`` world points, same library, device and float dtype as ``depth``.
    """
    if depth.ndim == 3 and depth.shape[-1] == 1:
        depth = depth[..., 0]
    if depth.ndim != 2:
        raise ValueError(f"depth must be [H, W] or [H, W, 1], got shape {tuple(depth.shape)}")
    if tuple(intrinsic.shape) != (3, 3):
        raise ValueError(f"intrinsic must be [3, 3], got shape {tuple(intrinsic.shape)}")
    if tuple(extrinsic_c2w.shape) not in ((3, 4), (4, 4)):
        raise ValueError(
            f"extrinsic_c2w must be [3, 4] or [4, 4], got {tuple(extrinsic_c2w.shape)}")
    height, width = depth.shape
    if isinstance(depth, torch.Tensor):
        intrinsic = torch.as_tensor(intrinsic, dtype=depth.dtype, device=depth.device)
        extrinsic_c2w = torch.as_tensor(extrinsic_c2w, dtype=depth.dtype, device=depth.device)
        u = torch.arange(width, dtype=depth.dtype, device=depth.device)[None, :]
        v = torch.arange(height, dtype=depth.dtype, device=depth.device)[:, None]
        stack = torch.stack
    else:
        intrinsic = np.asarray(intrinsic, dtype=depth.dtype)
        extrinsic_c2w = np.asarray(extrinsic_c2w, dtype=depth.dtype)
        u = np.arange(width, dtype=depth.dtype)[None, :]
        v = np.arange(height, dtype=depth.dtype)[:, None]
        stack = np.stack
    fx, fy = intrinsic[0, 0], intrinsic[1, 1]
    cx, cy = intrinsic[0, 2], intrinsic[1, 2]
    x_cam = depth * (u - cx) / fx                     # [H, W] via broadcasting of [1, W]
    y_cam = depth * (v - cy) / fy                     # [H, W] via broadcasting of [H, 1]
    points_cam = stack([x_cam, y_cam, depth], -1)     # [H, W, 3]
    rotation, translation = extrinsic_c2w[:3, :3], extrinsic_c2w[:3, 3]
    return points_cam @ rotation.T + translation      # row vectors: (R X)^T = X^T R^T


def image_to_rgb_uint8(image_chw: Array) -> Array:
    """Model input image ``[3, H, W]`` float in [0, 1] -> ``[H, W, 3]`` uint8 RGB (same library)."""
    if image_chw.ndim != 3 or image_chw.shape[0] != 3:
        raise ValueError(f"image must be [3, H, W], got shape {tuple(image_chw.shape)}")
    if isinstance(image_chw, torch.Tensor):
        scaled = (image_chw.permute(1, 2, 0).clamp(0, 1) * 255).round()
        return scaled.to(torch.uint8)
    scaled = np.round(np.clip(np.moveaxis(image_chw, 0, -1), 0, 1) * 255)
    return scaled.astype(np.uint8)


def select_points(points: Array, colors: Array, conf: Array | None, min_confidence: float,
                  stride: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Keep every ``stride``-th pixel in both image axes whose confidence is high enough.

    Args:
        points: ``[H, W, 3]`` world points (e.g. from :func:`depth_to_points`).
        colors: ``[H, W, 3]`` uint8 RGB of the same pixels.
        conf: ``[H, W]`` confidence (``depth_conf``, >= 1), or None to keep every pixel.
        min_confidence: keep pixels with ``conf >= min_confidence`` (the upstream viewer uses 1.5).
        stride: pixel step along rows and columns (1 keeps every pixel, 2 a quarter of them).

    Returns:
        ``(xyz float32 [N, 3], rgb uint8 [N, 3])`` as numpy arrays. Points with a non-finite
        coordinate are dropped as well: they cannot be placed in a map.
    """
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    if points.ndim != 3 or points.shape[-1] != 3:
        raise ValueError(f"points must be [H, W, 3], got shape {tuple(points.shape)}")
    if tuple(colors.shape) != tuple(points.shape):
        raise ValueError(f"colors {tuple(colors.shape)} must match points {tuple(points.shape)}")
    if conf is not None and tuple(conf.shape) != tuple(points.shape[:2]):
        raise ValueError(f"conf {tuple(conf.shape)} must be [H, W] = {tuple(points.shape[:2])}")
    points, colors = points[::stride, ::stride], colors[::stride, ::stride]
    conf = None if conf is None else conf[::stride, ::stride]
    arrays = [a for a in (points, colors, conf) if a is not None]
    if all(isinstance(a, torch.Tensor) for a in arrays):
        # The strided pixels cross to the host in one copy and are selected there: on a GPU,
        # selecting on the device waits for it twice (boolean indexing) and launches ~10 kernels
        # (float32 holds every uint8 colour exactly).
        packed = torch.cat([points.float(), colors.float()] + ([] if conf is None else [conf[..., None].float()]),
                           dim=-1).cpu().numpy()
        points, colors = packed[..., :3], packed[..., 3:6]
        conf = None if conf is None else packed[..., 6]
    else:
        points, colors = to_numpy(points), to_numpy(colors)
        conf = None if conf is None else to_numpy(conf)
    points, colors = points.reshape(-1, 3), colors.reshape(-1, 3)
    keep = np.isfinite(points).all(axis=-1)
    if conf is not None:
        keep &= conf.reshape(-1) >= min_confidence
    return points[keep].astype(np.float32), colors[keep].astype(np.uint8)


def to_numpy(array: Array) -> np.ndarray:
    """A torch tensor (any device) or array-like -> numpy array."""
    if isinstance(array, torch.Tensor):
        return array.detach().cpu().numpy()
    return np.asarray(array)
