"""Drives one StreamingSession for the node: stamps, keyframe policy, caps, resets, map, trajectory.

Runs only on the worker thread (it is the sole owner of the session). It knows nothing about
ROS messages: it takes decoded frames and returns poses in the ``map`` frame (see frames.py)
together with the model's per-frame outputs; the node turns those into messages.
"""
from __future__ import annotations

import dataclasses
import time
from collections import deque

import numpy as np
import torch

from lingbot_ros.mapping import Trajectory, VoxelMap, image_to_rgb_uint8, select_points, to_numpy
from lingbot_ros.ros.frames import R_MAP_FROM_OPTICAL, optical_points_to_map, optical_pose_to_map
from lingbot_ros.ros.keyframes import MotionPolicy
from lingbot_ros.ros.params import NodeConfig

WAITING, INITIALISING, TRACKING, RESET = 0, 1, 2, 3   # MapStatus.STATE_* values
STATE_NAMES = {WAITING: "waiting", INITIALISING: "initialising", TRACKING: "tracking",
               RESET: "reset"}


@dataclasses.dataclass
class InputFrame:
    """One decoded image. ``stamp`` is the header stamp object, passed through untouched."""
    rgb: np.ndarray            # [H, W, 3] uint8
    stamp: object
    stamp_ns: int
    frame_id: str
    received_ns: int           # time.monotonic_ns() when the callback got it


@dataclasses.dataclass
class PoseOutput:
    """One frame's result, ready to publish."""
    stamp: object
    stamp_ns: int
    frame_id: str
    received_ns: int
    pose_map: np.ndarray       # [4, 4] T_map_camera (optical camera frame)
    trusted: bool              # False for the scale-frame batch and the first pose after a reset
    is_keyframe: bool
    result: object             # FrameResult: depth, depth_conf, intrinsic, image...

    def points_map(self, min_confidence: float, stride: int, origin: np.ndarray):
        """Confidence-filtered, strided coloured points of this frame in ``map``."""
        return frame_points(self.result, min_confidence, stride, origin)


def frame_points(result, min_confidence: float, stride: int, origin: np.ndarray):
    # The session already unprojected the depth (world_points); only the kept points leave the device.
    colors = image_to_rgb_uint8(result.image)
    xyz, rgb = select_points(result.world_points, colors, result.depth_conf, min_confidence, stride)
    xyz = optical_points_to_map(xyz)
    return (xyz @ origin[:3, :3].T + origin[:3, 3]).astype(np.float32), rgb


@dataclasses.dataclass
class CacheNumbers:
    keyframes: int = 0
    pages: int = 0
    bytes: int = 0


class Tracker:
    def __init__(self, session, preprocessor, cfg: NodeConfig, num_scale_frames: int):
        self.session = session
        self.preprocessor = preprocessor
        self.cfg = cfg
        self.num_scale_frames = num_scale_frames
        self.motion = MotionPolicy(cfg.keyframe_min_parallax_px) if cfg.keyframe_policy == "motion" else None
        self.voxel_map = VoxelMap(cfg.map_voxel_size_m)
        self.trajectory = Trajectory()
        self.state = WAITING
        self.state_text = "waiting for images"
        self.input_hw: tuple[int, int] | None = None   # model input size of the last frame
        self.resets = 0
        self.init_frames = 0
        # Map pose of the current stream's origin. A reset forced by the cache cap keeps the
        # trajectory going from the last pose instead of jumping back to the start.
        self.origin = np.eye(4)
        self._pending: deque[InputFrame] = deque()   # frames the model has not returned yet
        self._last_stamp_ns: int | None = None
        self._last_pose_map: np.ndarray | None = None
        self._untrusted_next = True
        self.model_ms = 0.0
        # Points of the newest stored keyframe, kept out of the voxel map while that frame can
        # still be rolled back (~/rollback_last_frame drops them). They are merged once another
        # keyframe is stored, or before the map is read (save, publish) or the stream restarts.
        self._unmerged: tuple[np.ndarray, np.ndarray] | None = None

    # -- stream control (worker thread only) ------------------------------------------------

    def reset(self, reason: str, keep_map: bool = False) -> None:
        """Restart the stream. ``keep_map``: continue the map and trajectory from the last pose."""
        self.session.reset()
        if keep_map:
            self._merge_points()
        self._unmerged = None
        if self.motion is not None:
            self.motion.reset()
        self._pending.clear()
        self._last_stamp_ns = None
        self._untrusted_next = True
        self.init_frames = 0
        self.resets += 1
        if keep_map and self._last_pose_map is not None:
            # The next stream's origin is its first camera, i.e. about the last camera we saw.
            rebase = np.eye(4)
            rebase[:3, :3] = R_MAP_FROM_OPTICAL.T
            self.origin = self._last_pose_map @ rebase
        else:
            self.origin = np.eye(4)
            self.voxel_map.clear()
            self.trajectory.clear()
            self._last_pose_map = None
        self.state = RESET
        self.state_text = f"reset: {reason}"

    def rollback_last_frame(self) -> bool:
        """Undo the newest stored frame (raises the session's NothingToRollback if none).

        Returns False when the frame's points had already been merged into the map (a second
        rollback in a row, or the map was saved or published since): they stay there.
        """
        self.session.rollback_last_frame()
        if self.state == INITIALISING and self._pending:   # a buffered scale frame was dropped
            self._pending.pop()
            self.init_frames = len(self._pending)
            self.state_text = f"initialising {self.init_frames}/{self.num_scale_frames}"
            return True                                    # no points yet
        removed, self._unmerged = self._unmerged is not None, None
        return removed

    def map_points(self) -> tuple[np.ndarray, np.ndarray]:
        """The accumulated map (xyz, rgb), newest keyframe included (it is merged for good)."""
        self._merge_points()
        return self.voxel_map.points()

    def _merge_points(self) -> None:
        if self._unmerged is not None:
            self.voxel_map.insert(*self._unmerged)
            self._unmerged = None

    def flush(self) -> None:
        self.session.flush()

    def cache(self) -> CacheNumbers:
        """Frames stored since the last reset (the 3D-RoPE time index), pages and bytes in use."""
        stats = self.session.stats()
        kv = stats["kv_cache"]   # None until the first step allocates the cache
        pages = 0 if kv is None else (kv.anchor_pages + kv.window_pages + kv.pending_pages
                                      + kv.special_pages)
        nbytes = (0 if kv is None else kv.bytes_allocated) + stats["camera_cache_bytes"]
        return CacheNumbers(keyframes=stats["frames_stored"], pages=pages, bytes=nbytes)

    # -- frames -------------------------------------------------------------------------------

    def check_stamp(self, frame: InputFrame) -> str | None:
        """Reason to reset before this frame (stamps went backwards or jumped), else None."""
        last = self._last_stamp_ns
        if last is None:
            return None
        if frame.stamp_ns < last:
            return f"image stamp went back by {(last - frame.stamp_ns) / 1e9:.3f} s (bag looped?)"
        gap = (frame.stamp_ns - last) / 1e9
        if self.cfg.max_stamp_gap_s > 0 and gap > self.cfg.max_stamp_gap_s:
            return f"gap of {gap:.3f} s between image stamps (max_stamp_gap_s={self.cfg.max_stamp_gap_s})"
        return None

    def cap_reason(self, cache: CacheNumbers) -> str | None:
        if self.cfg.max_keyframes and cache.keyframes >= self.cfg.max_keyframes:
            return f"cache cap: {cache.keyframes} keyframes stored (max_keyframes={self.cfg.max_keyframes})"
        if self.cfg.max_cache_mb and cache.bytes >= self.cfg.max_cache_mb * 2**20:
            return (f"cache cap: {cache.bytes / 2**20:.1f} MB allocated "
                    f"(max_cache_mb={self.cfg.max_cache_mb})")
        return None

    def process(self, frame: InputFrame) -> list[PoseOutput]:
        """Run the model on one frame; return the poses that became available (0, 1 or a batch)."""
        image = self.preprocessor(frame.rgb)
        self.input_hw = tuple(image.shape[-2:])
        buffering = self.state != TRACKING
        # Motion policy: store the frame (deferred eviction keeps the rollback exact), then keep
        # it and flush if the view moved enough, or roll it back. Scale frames are always kept.
        motion_decides = self.motion is not None and not buffering
        self._pending.append(frame)
        start = time.perf_counter()
        results = self.session.step(image, keyframe=True if self.motion is not None else None)
        keyframe_kept = True
        if motion_decides:
            if self.motion.is_keyframe(frame.rgb):
                self.session.flush()
            else:
                self.session.rollback_last_frame()
                keyframe_kept = False
        elif self.motion is not None:
            self.motion.is_keyframe(frame.rgb)   # sets the reference to the latest scale frame
        if image.is_cuda:
            # The step only queues GPU work; the model time ends when the outputs are ready
            # (they are copied to the host next anyway).
            torch.cuda.current_stream(image.device).synchronize()
        self.model_ms = (time.perf_counter() - start) * 1e3
        self._last_stamp_ns = frame.stamp_ns

        if not results:
            self.init_frames = len(self._pending)
            self.state = INITIALISING
            self.state_text = f"initialising {self.init_frames}/{self.num_scale_frames}"
            return []
        batch = len(results) > 1
        outputs = []
        for result in results:
            source = self._pending.popleft()
            pose = self.origin @ optical_pose_to_map(to_numpy(result.extrinsic))
            is_keyframe = bool(result.is_keyframe) and (keyframe_kept or batch)
            outputs.append(PoseOutput(stamp=source.stamp, stamp_ns=source.stamp_ns,
                                      frame_id=source.frame_id, received_ns=source.received_ns,
                                      pose_map=pose, trusted=not (batch or self._untrusted_next),
                                      is_keyframe=is_keyframe, result=result))
            self._untrusted_next = False
            self.trajectory.append(source.stamp_ns / 1e9, pose)
            self._last_pose_map = pose
            if is_keyframe:   # the previous keyframe can no longer be rolled back on its own
                self._merge_points()
                self._unmerged = frame_points(result, self.cfg.min_confidence,
                                              self.cfg.points_stride, self.origin)
        self._pending.clear()   # every buffered frame has its result now
        self.init_frames = 0
        self.state = TRACKING
        self.state_text = "tracking"
        return outputs

