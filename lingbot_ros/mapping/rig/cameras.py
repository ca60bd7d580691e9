"""A rig's cameras and its primary camera, checked where the rig is built, and what a rig
refuses of the mapping settings. The names follow grouping.py's rule (the one place it lives)."""
from __future__ import annotations

from typing import Sequence

from ..settings import SettingsError
from .grouping import cameras_error


def check_cameras(cameras: Sequence[str], primary: str | None = None) -> tuple[tuple[str, ...], str]:
    """(the camera names, the primary camera: ``primary``, default the first) or SettingsError
    saying what to change."""
    if isinstance(cameras, str) or not isinstance(cameras, (list, tuple)):
        raise SettingsError(f"cameras must be a list of names, got {cameras!r}")
    cameras = tuple(cameras)
    error = cameras_error(cameras)
    if error:
        raise SettingsError(f"cameras {error}")
    if primary is None or primary == "":
        return cameras, cameras[0]
    if primary not in cameras:
        raise SettingsError(f"primary_camera {primary!r} is not one of cameras ({', '.join(cameras)}): "
                            "set it to one of them, or leave it empty for the first")
    return cameras, primary


def check_rig_settings(settings) -> None:
    """What a rig refuses of the mapping settings (MapperSettings), with what to change."""
    if settings.map_database:
        raise SettingsError(f"map_database is set ({settings.map_database!r}) but a rig of several cameras has no "
                            "map database yet: set map_database to '' (off; lingbot-ros-offline "
                            "--map-database '') and save the map instead")
