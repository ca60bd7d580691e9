"""The rig's typed values out (rig_mapper.py; a camera's frame in is grouping.py's RigFrame)."""
from __future__ import annotations

import dataclasses

from ..records import StepOutcome


@dataclasses.dataclass
class RigOutcome:
    """What one rig verb produced, per camera that got a frame or a notice in the call."""

    outcomes: dict[str, StepOutcome] = dataclasses.field(default_factory=dict)


# RigScale.source values.
PRIMARY, METRIC, TRAJECTORIES, UNKNOWN = "primary", "metric", "trajectories", "unknown"


@dataclasses.dataclass(frozen=True)
class RigScale:
    """A camera's scale against the primary camera's: ``value`` primary map units per unit of this
    camera's map (None: not known yet, the camera's map stays out of the rig's map)."""

    value: float | None
    source: str                # PRIMARY, METRIC (both maps in metres), TRAJECTORIES (estimated), UNKNOWN
    text: str                  # for status: how it was found, or why it is not known yet
    matched_poses: int = 0     # TRAJECTORIES: stamp-matched base poses it rests on

    @property
    def known(self) -> bool:
        return self.value is not None


@dataclasses.dataclass(frozen=True)
class SavedRigMap:
    """What ``RigMapper.save`` wrote: one map, one trajectory per camera."""

    ply_path: str
    tum_paths: dict[str, str]  # camera -> its trajectory file
    num_points: int
    num_poses: dict[str, int]  # camera -> poses written
    left_out: tuple[str, ...] = ()   # cameras whose scale is not known: their points are not in the map

    @property
    def message(self) -> str:
        poses = ", ".join(f"{self.num_poses[c]} poses of {c} to {p}" for c, p in self.tum_paths.items())
        out = f" (not in the map, scale against the primary unknown: {', '.join(self.left_out)})" if self.left_out else ""
        return f"wrote {self.num_points} points to {self.ply_path}{out}; {poses} (a top-down picture beside them: preview.png)"
