"""Where the project's shared folder (real camera sequences, fixtures, vendored packages) is, for
tools run from an installed copy.

An installed package lives in site-packages, far from the checkout, so the checkout's
``../shared`` is found by asking in this order: ``LINGBOT_SHARED`` (the explicit location, as the
tests and set-up scripts take it), the checkout pip installed the package from (its
``direct_url.json``, PEP 610), and the source tree the code runs from (``python -m`` in a
checkout). Each candidate comes with how it was found, for the tool to say which it used.
"""
from __future__ import annotations

import json
import os
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

ENV = "LINGBOT_SHARED"


def candidates() -> list[tuple[Path, str]]:
    """(shared folder, how it was found), in the order asked; they may not exist."""
    found = []
    if os.environ.get(ENV):
        found.append((Path(os.environ[ENV]), f"${ENV}"))
    checkout = installed_from()
    if checkout is not None:
        found.append((checkout.parent / "shared", f"beside {checkout}, the checkout this package was installed from"))
    source = Path(__file__).resolve().parents[2]
    found.append((source.parent / "shared", f"beside {source}, the source tree this runs from"))
    return found


def installed_from() -> Path | None:
    """The local directory ``pip install`` took this package from, if it was one."""
    try:
        text = metadata.distribution("lingbot_ros").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    if not text:
        return None
    try:
        url = urlparse(json.loads(text).get("url", ""))
    except (ValueError, AttributeError):
        return None
    return Path(unquote(url.path)) if url.scheme == "file" else None


def find(relative: str) -> tuple[Path, str] | None:
    """The first candidate holding ``relative`` (e.g. data/courthouse_jpg), with how it was found."""
    for shared, how in candidates():
        if (shared / relative).exists():
            return shared / relative, how
    return None
