"""lingbot-ros-replay's progress: the position in the bag (seconds played of the selected range),
the playback rate (bag seconds per second) and the time left, with the messages published so far
(tools/progress.py draws it: a bar on a terminal, a line every few seconds otherwise)."""
from __future__ import annotations

from lingbot_ros.tools.progress import Progress


class PlaybackProgress:
    def __init__(self, t0_ns: int, t_end_ns: int, enabled: bool):
        self.t0_ns = t0_ns
        self.messages = 0
        self._display = Progress(max(t_end_ns - t0_ns, 0) / 1e9, "lingbot-ros-replay", "s", decimals=1) \
            if enabled else None

    def published(self, timestamp_ns: int) -> None:
        self.messages += 1
        if self._display is not None:
            self._display.update((timestamp_ns - self.t0_ns) / 1e9, f"{self.messages} messages")

    def close(self) -> None:
        """The pass played to its end: the display ends at the full range."""
        if self._display is not None:
            self._display.update(self._display.total, f"{self.messages} messages")
            self._display.close()
