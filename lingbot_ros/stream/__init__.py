"""Streaming inference: session state (caches, counters), preprocessing, per-frame results."""
from .preprocess import ImageError, Preprocessor, ResizePlan, resize_plan
from .multi_session import MultiStreamSession, StreamFrame
from .results import FrameResult
from .session import FrameError, StreamingSession
from .settings import SettingsError, StreamSettings

__all__ = ["FrameError", "FrameResult", "ImageError", "MultiStreamSession", "Preprocessor", "ResizePlan",
           "SettingsError", "StreamFrame", "StreamSettings", "StreamingSession", "resize_plan"]
