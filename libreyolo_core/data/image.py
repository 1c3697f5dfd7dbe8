"""Image decoding helpers (Pillow): every input mode to uint8 RGB, EXIF orientation applied.

Pillow is used rather than ``cv2.imread`` because it reads EXIF orientation, palette,
16-bit and CMYK files uniformly and accepts any path (spaces, non-ASCII) on every OS.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

__all__ = ["ImageDecodeError", "allow_truncated", "exif_size", "load_image", "to_rgb_array"]

_TRUNCATED_LOCK = threading.Lock()


@contextlib.contextmanager
def allow_truncated() -> Iterator[None]:
    """Decode truncated files inside the block (Pillow's process-global
    ``ImageFile.LOAD_TRUNCATED_IMAGES``, set under a lock and put back after): the missing
    rows come out grey, as ``cv2.imread`` also returns them (with a libjpeg warning)."""
    with _TRUNCATED_LOCK:
        before = ImageFile.LOAD_TRUNCATED_IMAGES
        ImageFile.LOAD_TRUNCATED_IMAGES = True
        try:
            yield
        finally:
            ImageFile.LOAD_TRUNCATED_IMAGES = before

#: EXIF orientation values that swap width and height (90/270-degree rotations).
_TRANSPOSING_ORIENTATIONS = {5, 6, 7, 8}
_EXIF_ORIENTATION_TAG = 0x0112


class ImageDecodeError(OSError):
    """An image file exists but cannot be decoded. The message names the file."""


def exif_size(im: Image.Image) -> tuple[int, int]:
    """``(width, height)`` of ``im`` as displayed, i.e. after its EXIF orientation.

    Reads only the header (no pixel decode).
    """
    w, h = im.size
    try:
        orientation = im.getexif().get(_EXIF_ORIENTATION_TAG, 1)
    except Exception:  # malformed EXIF block: treat as unrotated, like exif_transpose does
        orientation = 1
    return (h, w) if orientation in _TRANSPOSING_ORIENTATIONS else (w, h)


def load_image(path: str | Path, max_side: int | None = None, truncated_ok: bool = False) -> np.ndarray:
    """Decode an image file to an RGB array.

    Args:
        path: image file (any Pillow-readable format; spaces/non-ASCII in the path are fine).
        max_side: optional hint that the caller will shrink the image so its longest side is
            ``max_side``; JPEGs are then decoded with DCT scaling (``Image.draft``) to the
            smallest size that is still >= that target, which is much faster for large
            photos. The result can therefore be smaller than the file's full resolution
            (never smaller than the target). ``None`` decodes at full resolution.
        truncated_ok: decode a truncated file with its missing part grey (the dataset
            passes True: the scan has already warned about that file by name).

    Returns:
        ``np.ndarray`` uint8, shape ``(H, W, 3)``, RGB, C-contiguous, with the EXIF
        orientation applied (so ``H, W`` are the displayed height/width). Grayscale,
        RGBA/LA (alpha dropped), palette, 16-bit (``I;16*``, ``I``: scaled by 1/257),
        float (``F``) and CMYK inputs are converted to 8-bit RGB.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ImageDecodeError: the file is not a decodable image (message names the file).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image {path} does not exist")
    try:
        try:
            return _decode(path, max_side)
        except (OSError, SyntaxError) as e:
            if not truncated_ok or isinstance(e, FileNotFoundError):
                raise
            with allow_truncated():
                return _decode(path, max_side)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ImageDecodeError(f"cannot decode image {path}: {e}") from e


def _decode(path: Path, max_side: int | None) -> np.ndarray:
    with Image.open(path) as im:
        if max_side is not None and im.format == "JPEG":
            w, h = exif_size(im)
            r = max_side / max(w, h)
            if r < 1.0:
                # draft() works in stored (pre-rotation) orientation; the ratio is kept.
                sw, sh = im.size
                im.draft("RGB", (max(1, int(sw * r)), max(1, int(sh * r))))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # palette-transparency chatter
            im.load()
            return to_rgb_array(ImageOps.exif_transpose(im))


def to_rgb_array(im: Image.Image) -> np.ndarray:
    """Convert a loaded Pillow image of any mode to a uint8 ``(H, W, 3)`` RGB array."""
    mode = im.mode
    if mode.startswith("I;16") or mode in ("I", "F"):
        a = np.asarray(im)
        if mode == "F":
            a = a * 255.0 if np.nanmax(a, initial=0.0) <= 1.0 else a
            a = np.clip(np.nan_to_num(a), 0, 255)
        elif mode == "I" and int(a.max(initial=0)) <= 255:
            a = np.clip(a, 0, 255)  # 8-bit data stored in a 32-bit container
        else:
            a = np.clip(a.astype(np.float64) / 257.0 + 0.5, 0, 255)  # 16-bit -> 8-bit
        a = a.astype(np.uint8)
        return np.ascontiguousarray(np.repeat(a[..., None], 3, axis=2))
    if mode == "P" or mode == "PA":
        im = im.convert("RGBA")
    if im.mode != "RGB":
        im = im.convert("RGB")
    return np.ascontiguousarray(np.asarray(im, dtype=np.uint8))
