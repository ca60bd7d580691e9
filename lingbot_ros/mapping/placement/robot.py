"""The robot's frames: where the camera sits on the base, its odometry, and each stream's metric scale.

``RobotFrames`` holds what outlives a stream: the camera mount (T_base_camera, from TF or the
setting) and the odometry buffer. ``StreamFrames`` is one stream's part: its scale source and the
``MapConversion`` (placement/conversion.py) it gives, replaced whenever the scale estimate changes.
"""
from __future__ import annotations

import numpy as np

from .conversion import MapConversion, Placement
from .geometry import parse_mount, rigid_inverse
from .metric_scale import ScaleSource, applied_scale, make_scale_source
from .odometry import OdometryBuffer
from ..settings import MapperSettings


class RobotFrames:
    def __init__(self, settings: MapperSettings, odometry: OdometryBuffer | None = None):
        self.settings = settings
        self.set_mount(parse_mount(settings.camera_mount), "the camera_mount setting")
        self.odometry = odometry if odometry is not None else OdometryBuffer()

    def set_mount(self, base_camera: np.ndarray, source: str) -> None:
        """T_base_camera (where it came from, for the log: TF or the setting)."""
        self.mount = np.asarray(base_camera, dtype=np.float64)
        self.mount_source = source

    def first_stream(self) -> tuple[Placement, "StreamFrames"]:
        """A stream with no earlier one to continue from: its first camera at I's origin, I
        with the base's axes, ``map``'s origin at the base."""
        return Placement(rotation=self.mount[:3, :3].copy()), self._stream(np.zeros(3), self.mount[:3, 3].copy())

    @property
    def constant_scale(self) -> bool:
        """Every stream has the same scale (scale_source none or fixed): streams can share I."""
        return self.settings.scale_source != "odometry"

    def continuing_in(self, conversion: MapConversion, camera_pose_internal: np.ndarray) \
            -> tuple[Placement, "StreamFrames"]:
        """A constant scale: the new stream continues in the ended one's I, from its last camera
        (T_I_camera), with the same conversion into map."""
        return Placement.continuing_from(camera_pose_internal), self._frames(conversion)

    def continuing_stream(self, camera_pose_map: np.ndarray) -> tuple[Placement, "StreamFrames"]:
        """A scale of its own (odometry): the new stream continues the map from
        ``camera_pose_map`` (T_M_camera), its I is ``map`` itself, scaled about its first camera."""
        origin = camera_pose_map[:3, 3].copy()
        return Placement.continuing_from(camera_pose_map), self._stream(origin, origin)

    def resumed_stream(self, conversion: MapConversion, stored: dict) -> "StreamFrames":
        """A stored stream continued (database/resume.py): its conversion into map, its scale state."""
        frames = self._frames(conversion)
        frames.restore(stored)
        return frames

    def _source(self) -> ScaleSource:
        s = self.settings
        return make_scale_source(s.scale_source, s.scale, window_pairs=s.scale_window_pairs,
                                 min_pairs=s.scale_min_pairs, min_motion_m=s.scale_min_motion_m,
                                 max_spread=s.scale_max_spread)

    def _stream(self, origin_internal: np.ndarray, origin_map: np.ndarray) -> "StreamFrames":
        conversion = MapConversion(self._source().state(), rigid_inverse(self.mount), origin_internal, origin_map,
                                   estimated=not self.constant_scale)
        return self._frames(conversion)

    def _frames(self, conversion: MapConversion) -> "StreamFrames":
        """A new stream's scale source and frames, converting into map with ``conversion``."""
        return StreamFrames(self._source(), conversion, self.odometry, self.mount, self.settings.scale_update_step)


class StreamFrames:
    """One stream's metric scale and its conversion into ``map``."""

    def __init__(self, source: ScaleSource, conversion: MapConversion, odometry: OdometryBuffer,
                 mount: np.ndarray, update_step: float):
        self.source, self.conversion, self._odometry, self._mount = source, conversion, odometry, mount
        self._update_step = update_step
        self._last_keyframe_ns: int | None = None

    def keyframe(self, stamp_ns: int, internal_pose: np.ndarray) -> None:
        """A final keyframe: one more sample for the scale estimate (camera positions on both
        sides, so the mount's offset does not bias the lengths)."""
        if self._last_keyframe_ns is not None and stamp_ns <= self._last_keyframe_ns:
            return   # two frames of one stamp: the pair would have no duration
        self._last_keyframe_ns = stamp_ns
        odom_base = self._odometry.at(stamp_ns)
        odom_camera = None if odom_base is None else odom_base @ self._mount
        self.source.add_keyframe(stamp_ns, internal_pose[:3, 3], odom_camera)
        applied = applied_scale(self.conversion.metric, self.source.state(), self._update_step)
        # A new conversion only when what it converts with changes (outputs and ~/path key on it).
        if applied is not self.conversion.metric:
            self.conversion = self.conversion.with_metric(applied)

    def window_switch(self) -> None:
        """A new window: no pair across the switch; the estimate goes on."""
        self.source.break_pairs()

    def stored(self) -> dict:
        """What a resumed stream continues the scale from (arrays; with the conversion the run
        stores anyway): the estimate's pairs and the newest keyframe's stamp."""
        last = -1 if self._last_keyframe_ns is None else self._last_keyframe_ns
        return {**self.source.stored(), "last_keyframe_ns": np.array([last], np.int64)}

    def restore(self, arrays: dict) -> None:
        self.source.restore(arrays)
        last = int(arrays["last_keyframe_ns"][0])
        self._last_keyframe_ns = None if last < 0 else last
