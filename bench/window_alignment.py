"""Window alignment estimators on a synthetic sequence of known geometry (spec 13.1 "Alignment").

A ground-truth camera path (a forward-moving camera that turns smoothly) and per-frame depth are
seen by two overlapping windows, A (frames 0 .. L-1) and B (frames L-ov .. 2L-ov-1), each through
its own random similarity G_A, G_B (the arbitrary frame and scale of a fresh stream), plus noise:
  - pose jitter per frame: rotation --rot-jitter-deg per axis, centre --pos-jitter x the motion
    per frame (independent per window and frame);
  - pose drift: a random walk from each window's first frame, --rot-drift-deg per axis and
    --pos-drift x the motion per frame per step (A's overlap frames, at its end, carry 48 frames
    of drift; B's, at its start, little);
  - depth: per frame a common scale error (--depth-frame-noise, log-normal), per pixel
    --depth-pixel-noise (log-normal), and --outliers of the pixels replaced by 0.1x .. 10x.
Both estimators of ``lingbot_ros.mapping.windows.similarity.align_window`` then map B onto A (as the
windowed run does, A already in its final frame); the truth is G_A G_B^-1. Reported over
--seeds sequences, median and 90th percentile:
  rotation error (deg), scale error |s/s_true - 1|, and the error of B's noise-free camera centres
  placed by the estimate vs by the truth, mean over the overlap (% of the overlap's path length)
  and over all of B (% of B's path length), i.e. how far the next window's map lands off; and
  the agreement the live status reports (``overlap_agreement``: mean distance between A's and the
  placed B's noisy overlap centres, % of A's overlap path length).

    python bench/window_alignment.py                         # 500 seeds, L 64, ov 16 (demo defaults)
    python bench/window_alignment.py --rot-drift-deg 0 --pos-drift 0    # jitter only
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lingbot_ros.mapping.windows.similarity import (ESTIMATORS, align_window, overlap_agreement,  # noqa: E402
                                            rotations_to_quaternions)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=500, help="synthetic sequences (one alignment each)")
    p.add_argument("--window-frames", type=int, default=64, help="frames per window L")
    p.add_argument("--overlap", type=int, default=16, help="overlap frames ov")
    p.add_argument("--keyframe-interval", type=int, default=1,
                   help="every K-th overlap frame (after the phase-1 frames) is a keyframe in both windows")
    p.add_argument("--scale-frames", type=int, default=8, help="phase-1 frames at each window's start")
    p.add_argument("--speed", type=float, default=0.05, help="ground-truth motion per frame (m)")
    p.add_argument("--rot-jitter-deg", type=float, default=0.5, help="per-frame rotation noise per axis")
    p.add_argument("--pos-jitter", type=float, default=0.3, help="per-frame centre noise, x motion per frame")
    p.add_argument("--rot-drift-deg", type=float, default=0.05, help="rotation drift per frame per axis")
    p.add_argument("--pos-drift", type=float, default=0.05, help="centre drift per frame, x motion per frame")
    p.add_argument("--depth-frame-noise", type=float, default=0.02, help="per-frame depth scale error (log sd)")
    p.add_argument("--depth-pixel-noise", type=float, default=0.05, help="per-pixel depth error (log sd)")
    p.add_argument("--outliers", type=float, default=0.02, help="fraction of pixels with a wrong depth")
    p.add_argument("--depth-size", default="24x32", help="HxW of the synthetic depth maps")
    return p.parse_args()


def rotvec_to_matrix(w: np.ndarray) -> np.ndarray:
    """Rodrigues: rotation vectors [..., 3] (rad) -> matrices [..., 3, 3]."""
    theta = np.linalg.norm(w, axis=-1, keepdims=True)[..., None]
    k = w / np.maximum(theta[..., 0], 1e-12)
    K = np.zeros(w.shape[:-1] + (3, 3))
    K[..., 0, 1], K[..., 0, 2], K[..., 1, 2] = -k[..., 2], k[..., 1], -k[..., 0]
    K = K - np.swapaxes(K, -1, -2)
    return np.eye(3) + np.sin(theta) * K + (1 - np.cos(theta)) * K @ K


def random_rotation(rng) -> np.ndarray:
    """A uniformly random rotation (QR of a Gaussian matrix, signs fixed, det +1)."""
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def ground_truth(rng, frames: int, speed: float):
    """Camera-to-world rotations [N, 3, 3] and centres [N, 3]: OpenCV axes (y down), the camera
    moving forward (z) while yaw, pitch and roll change smoothly."""
    rates = np.cumsum(rng.normal(scale=[0.3, 0.08, 0.05], size=(frames, 3)), axis=0) * np.pi / 180
    rates = np.clip(rates, -2 * np.pi / 180, 2 * np.pi / 180)              # <= 2 deg per frame
    R, c = np.zeros((frames, 3, 3)), np.zeros((frames, 3))
    R_f, c_f = np.eye(3), np.zeros(3)
    for f in range(frames):
        R_f = R_f @ rotvec_to_matrix(np.array([rates[f, 1], rates[f, 0], rates[f, 2]]))   # pitch, yaw, roll
        c_f = c_f + speed * R_f[:, 2]
        R[f], c[f] = R_f, c_f
    return R, c


@dataclass
class Frame:
    pose_enc: torch.Tensor
    depth: torch.Tensor
    is_keyframe: bool


def window_view(rng, args, R, c, depth, frames, G, keyframes):
    """The frames ``frames`` as a window with similarity G = (s, Q, u) sees them, with noise."""
    s, Q, u = G
    n, deg = len(frames), np.pi / 180
    drift_r = np.cumsum(rng.normal(scale=args.rot_drift_deg * deg, size=(n, 3)), axis=0)
    drift_c = np.cumsum(rng.normal(scale=args.pos_drift * args.speed, size=(n, 3)), axis=0)
    jitter_r = rng.normal(scale=args.rot_jitter_deg * deg, size=(n, 3))
    jitter_c = rng.normal(scale=args.pos_jitter * args.speed, size=(n, 3))
    rot = Q @ rotvec_to_matrix(drift_r + jitter_r) @ R[frames]
    centre = s * (c[frames] + drift_c + jitter_c) @ Q.T + u
    quat = rotations_to_quaternions(torch.tensor(rot, dtype=torch.float32))
    d = s * depth[frames] * np.exp(rng.normal(scale=args.depth_frame_noise, size=(n, 1, 1))
                                   + rng.normal(scale=args.depth_pixel_noise, size=depth[frames].shape))
    wrong = rng.random(d.shape) < args.outliers
    d[wrong] *= np.exp(rng.uniform(np.log(0.1), np.log(10), size=wrong.sum()))
    return [Frame(torch.cat([torch.tensor(centre[i], dtype=torch.float32), quat[i], torch.tensor([0.9, 1.1])]),
                  torch.tensor(d[i], dtype=torch.float32), keyframes[i]) for i in range(n)]


def keyframe_flags(n: int, scale_frames: int, K: int):
    return [i < scale_frames or K <= 1 or (i - scale_frames) % K == 0 for i in range(n)]


def one_sequence(seed: int, args) -> dict[str, tuple[float, float, float, float]]:
    rng = np.random.default_rng(seed)
    L, ov = args.window_frames, args.overlap
    N = 2 * L - ov
    R, c = ground_truth(rng, N, args.speed)
    h, w = (int(x) for x in args.depth_size.split("x"))
    depth = rng.uniform(1, 10, size=(N, 1, 1)) * np.exp(rng.normal(scale=0.3, size=(N, h, w)))
    sims = [(float(np.exp(rng.normal(scale=0.7))), random_rotation(rng), rng.normal(scale=5, size=3))
            for _ in range(2)]
    a = window_view(rng, args, R, c, depth, np.arange(0, L), sims[0], keyframe_flags(L, args.scale_frames,
                                                                                       args.keyframe_interval))
    b = window_view(rng, args, R, c, depth, np.arange(L - ov, N), sims[1],
                    keyframe_flags(L, args.scale_frames, args.keyframe_interval))
    (sa, Qa, ua), (sb, Qb, ub) = sims
    s_true, R_true = sa / sb, Qa @ Qb.T                                    # G_A G_B^-1
    t_true = ua - s_true * R_true @ ub
    centres_b = sb * c[L - ov:] @ Qb.T + ub                                 # B's noise-free centres
    placed_true = s_true * centres_b @ R_true.T + t_true                    # = G_A(c)
    path = np.linalg.norm(np.diff(placed_true, axis=0), axis=1)
    out = {}
    for estimator in ESTIMATORS:
        sim = align_window(a, b, ov, estimator)
        s, Rm, t = float(sim.scale), sim.rotation.double().numpy(), sim.translation.double().numpy()
        angle = np.degrees(np.arccos(np.clip((np.trace(Rm @ R_true.T) - 1) / 2, -1, 1)))
        err = np.linalg.norm(s * centres_b @ Rm.T + t - placed_true, axis=1)
        distance, motion = overlap_agreement(a, b, ov, sim)
        out[estimator] = (angle, abs(s / s_true - 1), err[:ov].mean() / path[:ov - 1].sum(),
                          err.mean() / path.sum(), distance / motion)
    return out


def main() -> int:
    args = parse_args()
    if not 1 <= args.overlap < args.window_frames:
        print("need 1 <= --overlap < --window-frames", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    results = [one_sequence(seed, args) for seed in range(args.seeds)]
    print(f"{args.seeds} sequences, L {args.window_frames}, ov {args.overlap}, K {args.keyframe_interval}; "
          f"jitter {args.rot_jitter_deg} deg / {args.pos_jitter} x motion, drift {args.rot_drift_deg} deg / "
          f"{args.pos_drift} x motion per frame; depth noise {args.depth_frame_noise} frame, "
          f"{args.depth_pixel_noise} pixel, {args.outliers:.0%} outliers")
    print("median (p90)     rotation deg       scale err %        overlap centres %  window centres %   "
          "agreement %")
    for estimator in ESTIMATORS:
        m = np.array([r[estimator] for r in results])                       # [seeds, 5]
        med, p90 = np.median(m, axis=0), np.percentile(m, 90, axis=0)
        cells = [f"{med[0]:.3f} ({p90[0]:.3f})"] + [f"{100 * med[i]:.2f} ({100 * p90[i]:.2f})" for i in (1, 2, 3, 4)]
        print(f"{estimator:16s} " + "".join(f"{cell:19s}" for cell in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
