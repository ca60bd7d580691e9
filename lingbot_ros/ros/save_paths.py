"""Where ~/save_map writes: save_directory and a request's directory, resolved and checked.

    save_directory relative   -> under $ROS_HOME (default ~/.ros), where ROS keeps a node's files
    request directory ''      -> save_directory
    request directory relative-> under save_directory, and it must stay there ('..' and symlinks
                                 that lead out are refused)
    request directory absolute-> as given (the caller named it)
Answers carry the resolved absolute paths.
"""
from __future__ import annotations

from pathlib import Path

from lingbot_ros.mapping.files.paths import ros_home


class SavePathError(ValueError):
    """A requested directory that is refused; the text says why."""


def save_root(save_directory: str) -> Path:
    path = Path(save_directory).expanduser()
    return (path if path.is_absolute() else ros_home() / path).resolve()


def save_target(save_directory: str, requested: str) -> Path:
    """The absolute directory a save writes to; SavePathError when a relative request leaves
    save_directory."""
    root = save_root(save_directory)
    if not requested:
        return root
    path = Path(requested).expanduser()
    if path.is_absolute():
        return path.resolve()
    target = (root / path).resolve()
    if target != root and root not in target.parents:
        raise SavePathError(f"directory '{requested}' leaves save_directory {root}: refused (give a path "
                            f"inside it, or an absolute one)")
    return target
