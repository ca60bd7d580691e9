"""The robot's frames: where the camera sits on the base, and the metric scale.

The Mapper works in an internal frame I: the first camera at the origin, axes those of the robot
base at the start (the model world rotated by the mount's rotation), model units. The published
``map`` frame M is the robot base at the start (REP 105), in metres when the scale is known:

    p_M = s * p_I + t_bc            T_M_camera = [R_I_camera | s * c_I + t_bc]
    T_M_base = T_M_camera @ inverse(T_base_camera)

with T_base_camera = [R_bc | t_bc] the camera mount (the image frame in base_frame) and s the
metric scale (1 until known). Everything leaves the Mapper through this conversion, evaluated
with the current scale, so a saved map and trajectory are at one scale even while the estimate
moves; the stored map and trajectory stay in I.
"""
from __future__ import annotations

import math

import numpy as np

from .frames import rigid_inverse
from .metric_scale import MetricScale, make_scale_source
from .odometry import OdometryBuffer
from .settings import MapperSettings


def pose_from_xyz_rpy(x, y, z, roll, pitch, yaw) -> np.ndarray:
    """4x4 from a translation and roll-pitch-yaw (fixed axes x, y, z: R = Rz(yaw) Ry(pitch) Rx(roll))."""
    cr, sr, cp, sp, cy, sy = (math.cos(roll), math.sin(roll), math.cos(pitch), math.sin(pitch),
                              math.cos(yaw), math.sin(yaw))
    pose = np.eye(4)
    pose[:3, :3] = [[cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
                    [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
                    [-sp, cp * sr, cp * cr]]
    pose[:3, 3] = (x, y, z)
    return pose


def parse_mount(text: str) -> np.ndarray:
    """'x y z roll pitch yaw' (metres, radians) -> T_base_camera."""
    return pose_from_xyz_rpy(*(float(v) for v in text.split()))


class RobotFrames:
    def __init__(self, settings: MapperSettings):
        self.set_mount(parse_mount(settings.camera_mount), "the camera_mount setting")
        self.scale_source = make_scale_source(
            settings.scale_source, settings.scale, window_pairs=settings.scale_window_pairs,
            min_pairs=settings.scale_min_pairs, min_motion_m=settings.scale_min_motion_m,
            max_spread=settings.scale_max_spread)
        self.odometry = OdometryBuffer()
        self._last_keyframe_ns: int | None = None
        self._state = self.scale_source.state()

    def set_mount(self, base_camera: np.ndarray, source: str) -> None:
        """T_base_camera (where it came from, for the log: TF or the setting)."""
        self.mount = np.asarray(base_camera, dtype=np.float64)
        self.mount_source = source
        self._camera_base = rigid_inverse(self.mount)

    @property
    def rotation(self) -> np.ndarray:
        """The mount's rotation: the internal frame's axes seen from the camera's optical world."""
        return self.mount[:3, :3]

    @property
    def scale(self) -> MetricScale:
        return self._state

    def camera_pose(self, internal_pose: np.ndarray) -> np.ndarray:
        """T_I_camera -> T_M_camera."""
        pose = internal_pose.copy()
        pose[:3, 3] = self._state.scale * internal_pose[:3, 3] + self.mount[:3, 3]
        return pose

    def base_pose(self, internal_pose: np.ndarray) -> np.ndarray:
        """T_I_camera -> T_M_base."""
        return self.camera_pose(internal_pose) @ self._camera_base

    def points(self, xyz_internal: np.ndarray) -> np.ndarray:
        return (self._state.scale * np.asarray(xyz_internal, np.float64) + self.mount[:3, 3]).astype(np.float32)

    def keyframe(self, stamp_ns: int, internal_pose: np.ndarray) -> None:
        """A final keyframe: one more sample for the scale estimate (camera positions on both
        sides, so the mount's offset does not bias the lengths)."""
        if self._last_keyframe_ns is not None and stamp_ns <= self._last_keyframe_ns:
            return   # two frames of one stamp: the pair would have no duration
        self._last_keyframe_ns = stamp_ns
        odom_base = self.odometry.at(stamp_ns)
        odom_camera = None if odom_base is None else odom_base @ self.mount
        self.scale_source.add_keyframe(stamp_ns, internal_pose[:3, 3], odom_camera)
        self._state = self.scale_source.state()

    def restart(self) -> None:
        """A new stream: its scale is its own, estimated again. The odometry buffer stays (the
        frames still queued need theirs); the front end clears it when odometry stamps go back."""
        self.scale_source.reset()
        self._last_keyframe_ns = None
        self._state = self.scale_source.state()

    def window_switch(self) -> None:
        """A new window: no pair across the switch; the estimate goes on."""
        self.scale_source.break_pairs()
