"""Streaming inference: session state (caches, counters), preprocessing, per-frame results."""
from .preprocess import ImageError, Preprocessor, ResizePlan, resize_plan
from .results import FrameResult
from .session import FrameError, StreamingSession
from .settings import SettingsError, StreamSettings

__all__ = ["FrameError", "FrameResult", "ImageError", "Preprocessor", "ResizePlan", "SettingsError",
           "StreamSettings", "StreamingSession", "resize_plan"]
