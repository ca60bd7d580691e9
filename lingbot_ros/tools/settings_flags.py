"""Command-line flags of the mapping settings: ``sliding_window`` is ``--sliding-window``.

The flags, defaults and help texts come from MapperSettings itself, as the node's parameters
do, so the two front ends cannot drift apart.
"""
from __future__ import annotations

import argparse
import dataclasses

from lingbot_ros.mapping.settings import MapperSettings, SettingsError, coerce

# Other names a flag answers to: the original demo's.
ALIASES = {"long_run_policy": ("--mode",)}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_settings_arguments(parser: argparse.ArgumentParser, cls=MapperSettings, exclude=()) -> None:
    group = parser.add_argument_group("mapping settings (the node's parameters of the same names)")
    for field in dataclasses.fields(cls):
        if field.name in exclude:
            continue
        meta, default = field.metadata, field.default
        names = (flag(field.name), *ALIASES.get(field.name, ()))
        text = meta["help"].replace("%", "%%")
        if isinstance(default, bool):
            group.add_argument(*names, dest=field.name, action=argparse.BooleanOptionalAction,
                               default=default, help=f"{text} (default {str(default).lower()})")
        else:
            group.add_argument(*names, dest=field.name, type=type(default), default=default,
                               choices=meta.get("choices"), help=f"{text} (default {default!r})")


def settings_from_args(args: argparse.Namespace, cls=MapperSettings, **overrides):
    """The settings the flags describe; a SettingsError names the flags at fault."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    try:
        return coerce(cls, {**values, **overrides})
    except SettingsError as error:
        text = str(error)
        for field in dataclasses.fields(cls):
            text = text.replace(f"'{field.name}'", f"{flag(field.name)}")
        raise SettingsError(text) from None
