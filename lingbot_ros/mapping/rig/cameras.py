"""A rig's cameras and its primary camera, checked where the rig is built, and what a rig
refuses of the mapping settings. The names follow grouping.py's rule (the one place it lives)."""
from __future__ import annotations

from typing import Sequence

from ..settings import SettingsError
from .grouping import cameras_error


def check_cameras(cameras: Sequence[str], primary: str | None = None) -> tuple[tuple[str, ...], str]:
    """(the camera names, the primary camera: ``primary``, default the first) or SettingsError
    saying what to change."""
    error = cameras_error(cameras)
    if error:
        raise SettingsError(f"cameras {error}")
    cameras = tuple(cameras)
    if primary is None or primary == "":
        return cameras, cameras[0]
    if primary not in cameras:
        raise SettingsError(f"primary_camera {primary!r} is not one of cameras ({', '.join(cameras)}): "
                            "set it to one of them, or leave it empty for the first")
    return cameras, primary


def check_rig_settings(settings) -> None:
    """What a rig refuses of the mapping settings (MapperSettings), with what to change."""
    if settings.window_switch_ahead:
        raise SettingsError("window_switch_ahead is set but a rig's cameras step together in one batched call, "
                            "which has no spare session yet: set window_switch_ahead to false")
    if settings.resume:
        raise SettingsError("resume is set but a rig of several cameras cannot continue a stored run yet: set "
                            "resume to false (a new rig run starts in the map database; lingbot-ros-offline: "
                            "leave out --resume)")
