"""Motion keyframe policy: a frame is a keyframe when the scene moved enough since the last one.

Parallax = median optical-flow displacement (pixels, at ``work_width``) of corners tracked from
the last keyframe into the current frame (OpenCV pyramidal Lucas-Kanade). Pure functions on
images; ``MotionPolicy.decide`` says what the frame the session just stored becomes: KEEP (a
scale frame: the reference only), FLUSH (a keyframe: its deferred evictions become final) or
ROLLBACK (the view did not move: the frame leaves the cache again).
"""
from __future__ import annotations

import cv2
import numpy as np

# Flow is measured on a small grey copy: cheap (about 1 ms) and stable against sensor noise.
WORK_WIDTH = 320
# Too few tracked corners (texture-less view, big jump) means the frame is new content: keyframe.
MIN_TRACKED = 12

# What the Mapper does with a frame the session stored (decide).
KEEP, FLUSH, ROLLBACK = "keep", "flush", "rollback"


def to_work_gray(rgb: np.ndarray) -> np.ndarray:
    height, width = rgb.shape[:2]
    scale = WORK_WIDTH / width
    gray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    return cv2.resize(gray, (WORK_WIDTH, max(1, round(height * scale))), interpolation=cv2.INTER_AREA)


def parallax_px(reference_gray: np.ndarray, current_gray: np.ndarray) -> float:
    """Median displacement of corners tracked reference -> current; inf if tracking fails."""
    if reference_gray.shape != current_gray.shape:
        return float("inf")
    corners = cv2.goodFeaturesToTrack(reference_gray, maxCorners=200, qualityLevel=0.01,
                                      minDistance=8)
    if corners is None or len(corners) < MIN_TRACKED:
        return float("inf")
    tracked, status, _ = cv2.calcOpticalFlowPyrLK(reference_gray, current_gray, corners, None)
    good = status.reshape(-1) == 1
    if good.sum() < MIN_TRACKED:
        return float("inf")
    return float(np.median(np.linalg.norm((tracked - corners).reshape(-1, 2)[good], axis=1)))


class MotionPolicy:
    """Holds the last keyframe's grey image; ``is_keyframe(rgb)`` compares against it."""

    def __init__(self, min_parallax_px: float):
        self.min_parallax_px = min_parallax_px
        self._reference: np.ndarray | None = None
        self.last_parallax_px = float("nan")

    def reset(self) -> None:
        self._reference = None

    def is_keyframe(self, rgb: np.ndarray) -> bool:
        gray = to_work_gray(rgb)
        if self._reference is None:
            self.last_parallax_px = float("inf")
        else:
            self.last_parallax_px = parallax_px(self._reference, gray)
        keep = self.last_parallax_px >= self.min_parallax_px
        if keep:
            self._reference = gray
        return keep

    def decide(self, rgb: np.ndarray, in_phase2: bool) -> str:
        """The consequence for a frame just stored: phase-1 frames are kept (they only set the
        reference); a phase-2 frame is flushed in if the view moved enough, else rolled back."""
        moved = self.is_keyframe(rgb)
        if not in_phase2:
            return KEEP
        return FLUSH if moved else ROLLBACK


def policy_step(session, motion: MotionPolicy | None, image, rgb: np.ndarray, in_phase2: bool) -> tuple[list, str]:
    """``session.step(image)`` under the keyframe policy: the interval rule (the session's own;
    KEEP), or ``motion``, which has the session store the frame (deferred evictions keep the
    rollback exact), then keeps it and flushes if the view moved enough, or rolls it back.
    Returns the session's results and the decision."""
    if motion is None:
        return session.step(image), KEEP
    results = session.step(image, keyframe=True)
    decision = motion.decide(rgb, in_phase2)
    if decision == FLUSH:
        session.flush()
    elif decision == ROLLBACK:
        session.rollback_last_frame()
    return results, decision
