"""Checkpoint loading (spec 1): strict about what the model uses, tolerant of known extras."""
from __future__ import annotations

import logging
import zipfile
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger(__name__)

# In the released files but never used by the streaming model: may be absent from a checkpoint.
UNUSED_KEYS = frozenset({"aggregator.patch_embed.mask_token"})
# The stage-1 file's 4-channel point head, which this model does not build.
HARMLESS_PREFIXES = ("point_head.",)
_LIST_LIMIT = 8


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be loaded into the model; the message names the file and the problem."""


def read_state_dict(path) -> dict[str, torch.Tensor]:
    """Load ``{"model": sd}`` or a bare state dict of tensors (weights only, mmap where possible)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    is_zip = zipfile.is_zipfile(path)
    try:
        # mmap needs the zip format of torch.save; legacy pickles load fully.
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=is_zip)
    except Exception as e:   # the weights-only unpickler raises assorted types on garbage input
        if is_zip or _starts_like_zip(path):
            raise CheckpointError(f"{path}: truncated or corrupt checkpoint ({_first_line(e)})") from e
        raise CheckpointError(f"{path}: not a PyTorch checkpoint of tensors ({_first_line(e)})") from e
    sd = obj.get("model", obj) if isinstance(obj, Mapping) else obj
    if not isinstance(sd, Mapping) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{path}: not a state dict (expected a dict of tensors or {{'model': ...}}, "
                              f"got {type(obj).__name__})")
    return dict(sd)


def load_checkpoint(model: nn.Module, path) -> list[str]:
    """Copy the checkpoint's tensors into ``model``; returns the unexpected keys (already logged)."""
    sd = read_state_dict(path)
    own = model.state_dict()
    missing = sorted(k for k in own if k not in sd and k not in UNUSED_KEYS)
    if missing:
        raise CheckpointError(f"{path}: {len(missing)} tensors the model uses are missing "
                              f"(another architecture or a partial file?): {_short(missing)}")
    mismatched = [f"{k} {tuple(sd[k].shape)} vs model {tuple(v.shape)}"
                  for k, v in own.items() if k in sd and sd[k].shape != v.shape]
    if mismatched:
        raise CheckpointError(f"{path}: {len(mismatched)} shape mismatches (checkpoint of another "
                              f"architecture? check the model config): {_short(mismatched)}")
    unexpected = sorted(k for k in sd if k not in own)
    if unexpected:
        harmless = [k for k in unexpected if k.startswith(HARMLESS_PREFIXES)]
        others = [k for k in unexpected if not k.startswith(HARMLESS_PREFIXES)]
        parts = [_short(others)] if others else []
        if harmless:
            parts.append(f"{len(harmless)} point_head.* tensors (stage-1 point head, not built; harmless)")
        log.warning("%s: ignoring %d unexpected tensors: %s", path, len(unexpected), "; ".join(parts))
    with torch.no_grad():
        for k, v in own.items():
            if k in sd:
                v.copy_(sd[k])
    log.info("%s: loaded %d tensors", path, len(own) - sum(k not in sd for k in own))
    return unexpected


def _starts_like_zip(path: Path) -> bool:
    # A truncated torch.save zip has lost its central directory but keeps its local-header magic.
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"


def _short(items: list[str]) -> str:
    more = f" ... (+{len(items) - _LIST_LIMIT} more)" if len(items) > _LIST_LIMIT else ""
    return ", ".join(items[:_LIST_LIMIT]) + more


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
