"""A rig's camera names and its primary camera, checked where the rig is built.

A name becomes part of topic names (``~/<name>/pose``) and of file names (``trajectory_<name>.tum``),
so it is one ROS name token: a letter, then letters, digits and underscores.
"""
from __future__ import annotations

import re
from typing import Sequence

from ..settings import SettingsError

# One model step batches every camera: past this many, the rig is a configuration error.
MAX_CAMERAS = 16
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")


def check_cameras(cameras: Sequence[str], primary: str | None = None) -> tuple[tuple[str, ...], str]:
    """(the camera names, the primary camera) or SettingsError saying what to change."""
    if isinstance(cameras, str) or not all(isinstance(c, str) for c in cameras):
        raise SettingsError(f"cameras must be a list of names, got {cameras!r}")
    cameras = tuple(cameras)
    if not cameras:
        raise SettingsError("cameras is empty: name at least one camera (e.g. cameras: [front])")
    if len(cameras) > MAX_CAMERAS:
        raise SettingsError(f"cameras names {len(cameras)} cameras; a rig takes at most {MAX_CAMERAS} "
                            "(one batched model step runs them all): name fewer")
    bad = [c for c in cameras if not _NAME.fullmatch(c)]
    if bad:
        raise SettingsError(f"cameras: {', '.join(repr(c) for c in bad)} is not a camera name: use a letter, then "
                            "letters, digits or underscores (at most 64; it names topics and files)")
    twice = sorted({c for c in cameras if cameras.count(c) > 1})
    if twice:
        raise SettingsError(f"cameras names {', '.join(twice)} more than once: give each camera one name")
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
