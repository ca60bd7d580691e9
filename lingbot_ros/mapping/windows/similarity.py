"""Similarity transforms between windows (spec 13.1 "Alignment" and "Warp"), float32 like the reference.

A window's outputs live in the window's own frame, at its own scale. ``align_window`` estimates
the similarity ``X -> s R X + t`` that maps window k's raw outputs into the frame of window k-1's
already warped outputs (so, by chaining, into window 0's frame); ``warp_frame`` applies it to one
frame, ``warp_frames`` to several. Works on anything with ``pose_enc [9]``, ``depth [H, W]`` and
``is_keyframe`` (a ``FrameResult``); no ROS, no model.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from ...model.geometry import depth_to_world_points, pose_to_extrinsic, quaternion_to_rotation
from ...stream.results import FrameResult

# "anchor": the original's estimator (rotation and translation from one anchor frame), the
# default and the one parity uses. "all_frames": rotation averaged and translation fitted over all
# paired frames (bench/window_alignment.py measures it against "anchor").
ESTIMATORS = ("anchor", "all_frames")

# Ratios against depths at or below float32's epsilon are not counted (spec 13.1).
_MIN_DEPTH = 2.0 ** -23
SCALE_MIN, SCALE_MAX = 1e-3, 1e3


class AlignmentError(ValueError):
    """An alignment that cannot be computed (no frames, an unknown estimator)."""


class PairedFrame(Protocol):
    """What alignment reads of a frame (``FrameResult`` has it)."""

    pose_enc: torch.Tensor     # [9] (tx, ty, tz, qx, qy, qz, qw, fov_h, fov_w), camera-to-world
    depth: torch.Tensor        # [H, W]
    is_keyframe: bool


@dataclass(frozen=True)
class Similarity:
    """``X -> scale * rotation @ X + translation``; float32 tensors on the frames' device."""

    scale: torch.Tensor        # [] s > 0
    rotation: torch.Tensor     # [3, 3] R, proper rotation
    translation: torch.Tensor  # [3] t

    @classmethod
    def identity(cls, device=None) -> Similarity:
        f32 = dict(dtype=torch.float32, device=device)
        return cls(torch.ones((), **f32), torch.eye(3, **f32), torch.zeros(3, **f32))

    def matrix(self) -> torch.Tensor:
        """[4, 4] ``[sR t; 0 1]``: homogeneous points of the window -> the first window's frame."""
        return self._homogeneous(self.scale * self.rotation)

    def rigid_matrix(self) -> torch.Tensor:
        """[4, 4] ``[R t; 0 1]`` without the scale (the spec's ``chunk_transforms`` entry)."""
        return self._homogeneous(self.rotation)

    def apply(self, points: torch.Tensor) -> torch.Tensor:
        """points [..., 3] -> s R X + t [..., 3]."""
        return self.scale * (points @ self.rotation.T) + self.translation

    @functools.cached_property
    def on_host(self) -> Similarity:
        """The same transform on the CPU (copied once: a window warps all its frames with it)."""
        return Similarity(self.scale.cpu(), self.rotation.cpu(), self.translation.cpu())

    def _homogeneous(self, linear: torch.Tensor) -> torch.Tensor:
        out = torch.eye(4, dtype=linear.dtype, device=linear.device)
        out[:3, :3], out[:3, 3] = linear, self.translation
        return out


def rotations_to_quaternions(rotation: torch.Tensor) -> torch.Tensor:
    """Rotations [..., 3, 3] -> unit quaternions [..., 4] scalar-last (x, y, z, w), w >= 0.

    Batched torch counterpart of ``mapping.trajectory.rotation_to_quaternion``: of the four ways
    to read q off R, each one dividing by 4|w|, 4|x|, 4|y| or 4|z|, take the one with the largest
    divisor, so none divides by a value near zero (rotations near 180 degrees included).
    """
    m = rotation
    m00, m11, m22 = m[..., 0, 0], m[..., 1, 1], m[..., 2, 2]
    # 4w^2, 4x^2, 4y^2, 4z^2 of a unit quaternion, each from the diagonal alone.
    squares = torch.stack([1 + m00 + m11 + m22, 1 + m00 - m11 - m22,
                           1 - m00 + m11 - m22, 1 - m00 - m11 + m22], dim=-1)
    wx, wy, wz = m[..., 2, 1] - m[..., 1, 2], m[..., 0, 2] - m[..., 2, 0], m[..., 1, 0] - m[..., 0, 1]
    xy, xz, yz = m[..., 0, 1] + m[..., 1, 0], m[..., 0, 2] + m[..., 2, 0], m[..., 1, 2] + m[..., 2, 1]
    # Row i: 4 * (w, x, y, z) * (w, x, y, z)[i], i.e. q scaled by 4 q_i (order w, x, y, z).
    scaled = torch.stack([
        torch.stack([squares[..., 0], wx, wy, wz], dim=-1),
        torch.stack([wx, squares[..., 1], xy, xz], dim=-1),
        torch.stack([wy, xy, squares[..., 2], yz], dim=-1),
        torch.stack([wz, xz, yz, squares[..., 3]], dim=-1),
    ], dim=-2)                                                              # [..., 4, 4]
    best = squares.argmax(dim=-1)                                           # [...]
    q = torch.take_along_dim(scaled, best[..., None, None].expand(*best.shape, 1, 4), dim=-2)[..., 0, :]
    q = torch.nn.functional.normalize(q, dim=-1)
    q = torch.where(q[..., :1] < 0, -q, q)                                  # w >= 0
    return torch.cat([q[..., 1:], q[..., :1]], dim=-1)                      # (w, x, y, z) -> (x, y, z, w)


def overlap_pairs(num_prev: int, num_cur: int, overlap: int) -> tuple[int, int]:
    """(st, m): frame j < m of the current window and frame st + j of the previous one are the same input."""
    st = max(num_prev - overlap, 0)
    return st, min(overlap, num_prev - st, num_cur)


def align_window(prev: Sequence[PairedFrame], cur: Sequence[PairedFrame], overlap: int,
                 estimator: str = "anchor") -> Similarity:
    """The similarity that maps window k's raw frames onto window k-1's warped ones (spec 13.1).

    prev: window k-1's frames after its own warp, in order (all of them, or at least its last
    ``overlap``); cur: window k's raw frames from its first (only the first ``overlap`` are read,
    so a live caller may pass just those). ``overlap`` <= 0 gives the identity (tiling windows).
    Scale: the lower median of the pooled per-pixel depth ratios prev / cur, clamped to [1e-3, 1e3].
    ``estimator="anchor"`` (the original's): over the paired frames that are keyframes in both
    windows, R and t from the latest such pair alone (from the first pair if there is none, a
    quirk that uses non-keyframes). ``"all_frames"``: every paired frame counts; R is the chordal
    mean of the per-pair rotations, t the least-squares fit of the camera centres.
    """
    if estimator not in ESTIMATORS:
        raise AlignmentError(f"unknown alignment estimator {estimator!r}; use one of {ESTIMATORS}")
    if overlap <= 0:
        return Similarity.identity(cur[0].pose_enc.device if cur else None)
    if not prev or not cur:
        raise AlignmentError(f"alignment needs frames of both windows, got {len(prev)} and {len(cur)}")
    st, m = overlap_pairs(len(prev), len(cur), overlap)
    p, q = prev[st:st + m], cur[:m]
    if estimator == "anchor":
        pairs = [j for j in range(m) if p[j].is_keyframe and q[j].is_keyframe] or [0]
        anchors = pairs[-1:]
    else:
        pairs = anchors = list(range(m))
    scale = depth_ratio_scale([p[j].depth for j in pairs], [q[j].depth for j in pairs])
    pose_p = torch.stack([p[j].pose_enc for j in anchors])                  # [A, 9]
    pose_q = torch.stack([q[j].pose_enc for j in anchors])
    rotations = quaternion_to_rotation(pose_p[:, 3:7]) @ quaternion_to_rotation(pose_q[:, 3:7]).transpose(1, 2)
    rotation = rotations[0] if len(anchors) == 1 else chordal_mean(rotations)
    # Least squares over the anchors' centres given s and R (one anchor: c_a - s R c_b exactly).
    translation = (pose_p[:, :3] - scale * (pose_q[:, :3] @ rotation.T)).mean(dim=0)
    return Similarity(scale, rotation, translation)


def overlap_agreement(prev: Sequence[PairedFrame], cur: Sequence[PairedFrame], overlap: int,
                      sim: Similarity) -> tuple[float, float]:
    """How well two windows agree on their shared frames once ``cur`` is moved by ``sim``:
    (mean distance between the paired camera centres, path length of ``prev``'s centres over the
    pairs), both in ``prev``'s units; their ratio is the disagreement relative to the motion.
    Same arguments and pairing as ``align_window``; (0, 0) without an overlap."""
    if overlap <= 0 or not prev or not cur:
        return 0.0, 0.0
    st, m = overlap_pairs(len(prev), len(cur), overlap)
    centres_p = torch.stack([f.pose_enc[:3] for f in prev[st:st + m]]).double()
    centres_q = sim.apply(torch.stack([f.pose_enc[:3] for f in cur[:m]])).double()
    distance = (centres_p - centres_q).norm(dim=-1).mean()
    path = (centres_p[1:] - centres_p[:-1]).norm(dim=-1).sum()
    return float(distance), float(path)


def depth_ratio_scale(prev_depths: Sequence[torch.Tensor], cur_depths: Sequence[torch.Tensor]) -> torch.Tensor:
    """Lower median (rank floor((N-1)/2), like torch.median) of the pooled ratios prev / cur over
    the pixel pairs with both depths finite and |cur| > 2^-23; 1 if there are none; clamped."""
    a = torch.cat([d.reshape(-1) for d in prev_depths]).float()
    b = torch.cat([d.reshape(-1) for d in cur_depths]).float()
    valid = torch.isfinite(a) & torch.isfinite(b) & (b.abs() > _MIN_DEPTH)
    ratios = a[valid] / b[valid]
    if ratios.numel() == 0:
        return torch.ones((), dtype=torch.float32, device=a.device)
    return ratios.median().clamp(SCALE_MIN, SCALE_MAX)


def chordal_mean(rotations: torch.Tensor) -> torch.Tensor:
    """[N, 3, 3] -> the rotation nearest (Frobenius) to their sum: SVD projection onto SO(3)."""
    u, _, vh = torch.linalg.svd(rotations.sum(dim=0))
    d = torch.ones(3, dtype=rotations.dtype, device=rotations.device)
    d[2] = torch.sign(torch.det(u @ vh))                                    # a rotation, not a reflection
    return u @ torch.diag(d) @ vh


def warp_pose_enc(pose_enc: torch.Tensor, sim: Similarity) -> torch.Tensor:
    """pose_enc [..., 9] -> the same cameras in the target frame: centre s R c + t, rotation
    R rot(q) as a unit quaternion with w >= 0, FoV unchanged."""
    centre = sim.apply(pose_enc[..., :3])
    rotation = sim.rotation @ quaternion_to_rotation(pose_enc[..., 3:7])
    return torch.cat([centre, rotations_to_quaternions(rotation), pose_enc[..., 7:9]], dim=-1)


def warp_frame(result: FrameResult, sim: Similarity) -> FrameResult:
    """One frame moved by ``sim``: pose (and every camera iteration's pose) warped, depth times s,
    confidence and intrinsics unchanged, extrinsic and world points derived again (spec 12), so
    world points equal s R X + t. Frame counters, keyframe flag and image pass through."""
    return warp_frames([result], sim)[0]


def warp_frames(results: Sequence[FrameResult], sim: Similarity) -> list[FrameResult]:
    """``warp_frame`` of each of ``results`` (frames on one device), their poses together.

    The poses (1 + iterations rows of 9 numbers a frame) are warped on the CPU: on a GPU their
    ~250 tiny kernels cost ~6 ms of launches per frame (the H200's Mapper profile, bench/README.md),
    on the CPU the same float32 ops take a fraction of that, and a switch's overlap (16 frames)
    crosses in one copy each way and one pass of those ops. Only the per-pixel work stays on the
    frames' device, frame by frame."""
    if not results:
        return []
    device = results[0].pose_enc.device
    # [N, 1 + iterations, 9]: one session's frames, so the same number of camera iterations.
    poses = torch.stack([torch.cat([r.pose_enc[None], r.pose_enc_list]) for r in results]).cpu()
    warped = warp_pose_enc(poses.flatten(0, 1), sim.on_host).view(poses.shape)
    extrinsics = pose_to_extrinsic(warped[:, 0])                                   # [N, 3, 4]
    host = torch.cat([warped.flatten(), extrinsics.flatten()]).to(device)
    warped, extrinsics = host[:warped.numel()].view(warped.shape), host[warped.numel():].view(-1, 3, 4)
    out = []
    for result, pose, extrinsic in zip(results, warped, extrinsics):
        depth = result.depth * sim.scale
        world_points = depth_to_world_points(depth[None], extrinsic[None], result.intrinsic[None])[0]
        out.append(dataclasses.replace(result, pose_enc=pose[0], pose_enc_list=pose[1:], extrinsic=extrinsic,
                                       depth=depth, world_points=world_points))
    return out
