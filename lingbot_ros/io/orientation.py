"""EXIF orientation: read tag 0x0112 from a TIFF block, and turn the pixels upright.

Spec §3: the demo opens files with PIL and applies the EXIF orientation (``exif_transpose``);
:func:`apply_orientation` gives the same pixels for all eight values. The TIFF block is what a
JPEG's APP1 "Exif" segment holds after its 6-byte header, and what a PNG ``eXIf`` chunk holds.
Only IFD0's tag is read (not an XMP orientation). Broken EXIF is metadata, not image data:
it reads as orientation 1 (upright) instead of rejecting an image that decodes fine.
"""
from __future__ import annotations

import struct

import numpy as np

_ORIENTATION_TAG = 0x0112
_SHORT = 3


def tiff_orientation(tiff: bytes) -> int:
    """The orientation (1..8) in IFD0 of a TIFF block; 1 when absent or unreadable."""
    if len(tiff) < 8 or tiff[:4] not in (b"II*\0", b"MM\0*"):
        return 1
    order = "<" if tiff[:2] == b"II" else ">"
    (ifd,) = struct.unpack_from(order + "I", tiff, 4)
    if ifd + 2 > len(tiff):
        return 1
    (count,) = struct.unpack_from(order + "H", tiff, ifd)
    for entry in range(ifd + 2, min(ifd + 2 + 12 * count, len(tiff) - 11), 12):
        tag, kind, _, value = struct.unpack_from(order + "HHIH", tiff, entry)
        if tag == _ORIENTATION_TAG:
            return value if kind == _SHORT and 1 <= value <= 8 else 1
    return 1


# orientation -> the operation that turns the stored pixels upright (EXIF 2.3, tag 0x0112).
_UPRIGHT = {
    2: lambda a: a[:, ::-1],                        # mirrored left-right
    3: lambda a: a[::-1, ::-1],                     # rotated 180
    4: lambda a: a[::-1],                           # mirrored top-bottom
    5: lambda a: a.transpose(1, 0, 2),              # mirrored along the main diagonal
    6: lambda a: np.rot90(a, -1),                   # stored 90 counter-clockwise: turn clockwise
    7: lambda a: a[::-1, ::-1].transpose(1, 0, 2),  # mirrored along the anti-diagonal
    8: lambda a: np.rot90(a, 1),                    # stored 90 clockwise: turn counter-clockwise
}


def apply_orientation(rgb: np.ndarray, orientation: int) -> np.ndarray:
    """``[H, W, C]`` as stored -> as displayed (a contiguous copy unless ``orientation`` is 1)."""
    if orientation == 1:
        return rgb
    return np.ascontiguousarray(_UPRIGHT[orientation](rgb))
