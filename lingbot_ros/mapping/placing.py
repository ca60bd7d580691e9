"""Where a placed frame's output goes: the trajectory and the map (MapStore), the map database
(the recorder) and the caller's StepOutcome; and ``undo``, where a rolled-back frame leaves them.

A windowed run's provisional outputs are held by its windows until final (published now, final
when the next window ran them again or the stream ended); a final keyframe is one more sample for
the stream's scale estimate, and its points wait in MapStore as the undoable newest keyframe.
"""
from __future__ import annotations

import dataclasses

from .database.recorder import StoredFrame
from .records import BOUND, MapperOutput, Notice, StepOutcome


class Placing:
    def __init__(self, store, recorder, settings):
        self.store, self.recorder, self.settings = store, recorder, settings
        self.warned_bound = False   # the trajectory's bound reached (said once per Mapper)

    def add_pose(self, outcome: StepOutcome, output: MapperOutput) -> None:
        """A frame's first pose into the trajectory (its oldest dropped once full: said once)."""
        store = self.store
        if store.num_poses() == store.max_poses and not self.warned_bound:
            self.warned_bound = True
            outcome.notices.append(Notice(BOUND, (
                f"the trajectory holds max_trajectory_poses={store.max_poses} poses: the oldest "
                "are dropped from now on (the saved trajectory starts later)")))
        store.add_pose(output.index, output.stamp_ns, output.internal_pose)

    def first(self, outcome: StepOutcome, stream, output: MapperOutput) -> None:
        """A frame's first output (its pose already added): published now."""
        outcome.new.append(output)
        self._final_or_held(outcome, stream, output)

    def again(self, outcome: StepOutcome, stream, output: MapperOutput) -> None:
        """An overlap frame run again by the next window: this run's value replaces the earlier
        one, final unless the frame is in this window's overlap too (overlap > L - overlap)."""
        self.store.replace_pose(output.index, output.internal_pose)
        if not output.provisional:
            stream.windows.finalised(output.index)
        self._final_or_held(outcome, stream, output)
        if output.provisional:
            outcome.revised.append(output)

    def final(self, outcome: StepOutcome, stream, output: MapperOutput) -> None:
        outcome.final.append(output)
        windows = stream.windows
        self.recorder.frame(output, windows.number if windows is not None else 0, final=True)
        if output.is_keyframe:   # the previous keyframe can no longer be rolled back on its own
            frames = stream.frames
            frames.keyframe(output.stamp_ns, output.internal_pose)
            self.store.set_pitch(frames.conversion)
            self.store.hold(output.index, output.internal_points(self.settings.min_confidence,
                                                                 self.settings.map_points_stride))

    def windows_end(self, outcome: StepOutcome, stream) -> None:
        """The stream's input ended: a resumed window's frames that no re-run reached keep their
        stored values, and every provisional output becomes final."""
        windows = stream.windows
        resumed, outputs = windows.end()
        for index, (stamp_ns, points) in resumed.items():
            self.recorder.frame(StoredFrame(index, stamp_ns, self.store.internal_pose(index), points is not None),
                                windows.number, final=True)
            if points is not None:
                self.store.hold(index, points)
        for output in outputs:
            self.final(outcome, stream, dataclasses.replace(output, provisional=False))

    def undo(self, stream, index: int) -> str:
        """Frame ``index``, the newest placed, rolled back: out of the trajectory, the database
        and the windows; what became of its points."""
        self.store.remove_pose(index)
        self.recorder.removed(index)
        provisional = stream.windows.forget_newest(had_result=True) if stream.windows is not None else None
        if provisional is not None:
            return "it was provisional: its points were never in the map"
        if self.store.drop_held(index):
            return "its points left the map"
        return "its points were already merged into the map and stay"

    def _final_or_held(self, outcome: StepOutcome, stream, output: MapperOutput) -> None:
        if not output.provisional:
            self.final(outcome, stream, output)
        else:
            stream.windows.hold(output)
            self.recorder.frame(output, stream.windows.number, final=False)
