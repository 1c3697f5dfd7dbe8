"""Image checks of the label scan: an image's displayed size, read from its header, and the
signs that it needs care before training.

:func:`check_image` opens the file (no full decode for 8-bit images), applies the EXIF
orientation to its size, runs Pillow's structure/CRC checks, looks for a JPEG's
end-of-image marker, and decodes 16/32-bit integer images to see what the 1/257 scaling of
:func:`~libreyolo_core.data.image.to_rgb_array` leaves. :func:`decode_tolerantly` is the
second chance of a damaged file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from libreyolo_core.data.image import allow_truncated, exif_size, to_rgb_array

__all__ = ["DARK_16BIT_MAX", "ImageCheck", "check_image", "decode_tolerantly"]

#: A 16-bit image whose converted 8-bit maximum is below this is warned about as near-black.
DARK_16BIT_MAX = 16


@dataclass(frozen=True)
class ImageCheck:
    """What :func:`check_image` found.

    Attributes:
        shape: ``(h, w)`` in pixels as displayed (EXIF orientation applied).
        damage: why a tolerant decode is needed (a failed check, a truncated JPEG), or None.
        bits16: a 16/32-bit integer image that is scaled by 1/257 to 8 bits.
        dark16: the converted 8-bit maximum of such an image when it is below
            :data:`DARK_16BIT_MAX` (its data likely uses only the low byte), else None.
    """

    shape: tuple[int, int]
    damage: str | None = None
    bits16: bool = False
    dark16: int | None = None


def check_image(im_file: Path) -> ImageCheck:
    """Check one image (see the module docstring).

    Raises:
        ValueError: a zero-byte file or a size below 1x1.
        OSError: (or any decoder error) the file cannot even be opened (unknown format).
    """
    if os.path.getsize(im_file) == 0:
        raise ValueError("zero-byte file")
    with Image.open(im_file) as im:
        fmt = im.format
        w, h = exif_size(im)
        mode = im.mode
    if w < 1 or h < 1:
        raise ValueError(f"invalid size {w}x{h}")
    damage = None
    try:
        with Image.open(im_file) as im:
            im.verify()  # structure / CRC checks without a full decode
    except Exception as e:  # noqa: BLE001 - any check failure: try a tolerant decode later
        damage = str(e) or type(e).__name__
    if fmt == "JPEG" and damage is None:
        with open(im_file, "rb") as f:
            f.seek(-min(64, os.path.getsize(im_file)), os.SEEK_END)
            tail = f.read()
        if not tail.rstrip(b"\x00\r\n ").endswith(b"\xff\xd9"):
            damage = "truncated JPEG (no end-of-image marker)"
    if damage is None and (mode.startswith("I;16") or mode == "I"):
        bits16, dark16 = _check_16bit(im_file)
        return ImageCheck((h, w), bits16=bits16, dark16=dark16)
    return ImageCheck((h, w), damage=damage)


def _check_16bit(im_file: Path) -> tuple[bool, int | None]:
    """Decode a 16/32-bit integer image: ``(bits16, dark16)`` of :class:`ImageCheck`
    (``bits16`` False for 8-bit values in a 32-bit container, which are copied as is)."""
    with Image.open(im_file) as im:
        im.load()
        raw = np.asarray(im)
        mode = im.mode
        if mode == "I" and int(raw.max(initial=0)) <= 255:
            return False, None  # 8-bit values in a 32-bit container: copied as is
        top = int(to_rgb_array(im).max(initial=0))
    return True, (top if top < DARK_16BIT_MAX else None)


def decode_tolerantly(im_file: Path) -> None:
    """Decode a damaged image fully with Pillow's ``LOAD_TRUNCATED_IMAGES`` (the missing
    part grey). Call serially: the flag is global (:func:`allow_truncated` holds a lock).

    Raises:
        Exception: whatever the decoder raises when the file is undecodable even so.
    """
    with allow_truncated(), Image.open(im_file) as im:
        im.load()
