"""Where files go by default: ``$ROS_HOME`` (ROS_HOME, or ~/.ros without it), as ROS 2 resolves it.

The map database's path and the node's save directory both resolve through ``ros_home``.
"""
from __future__ import annotations

import os
from pathlib import Path


def ros_home() -> Path:
    return Path(os.environ.get("ROS_HOME") or Path.home() / ".ros").expanduser()
