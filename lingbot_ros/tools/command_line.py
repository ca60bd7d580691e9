"""The tools' argument parser: a flag is taken whole, never as a prefix of another.

argparse takes any unambiguous prefix of a flag by default, so a flag that does not exist can
quietly mean one that does: `lingbot-ros-offline --no-map-database` ran as
`--no-map-database-images`, and the run was still recorded into the default database.
"""
from __future__ import annotations

import argparse


class Parser(argparse.ArgumentParser):
    """argparse.ArgumentParser with ``allow_abbrev=False``; its subcommands' parsers are Parsers too
    (argparse makes them of the parent's class)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
