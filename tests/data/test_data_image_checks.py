"""check_image and decode_tolerantly on their own (the scan's image checks)."""

from __future__ import annotations

import numpy as np
import pytest
from data_helpers import write_image
from PIL import Image

from libreyolo_core.data.image_checks import (
    DARK_16BIT_MAX,
    ImageCheck,
    check_image,
    decode_tolerantly,
)


def test_a_good_image_has_its_displayed_size(tmp_path) -> None:
    assert check_image(write_image(tmp_path / "a.png", 48, 64)) == ImageCheck((48, 64))
    jpg = write_image(tmp_path / "a.jpg", 30, 20)
    assert check_image(jpg) == ImageCheck((30, 20))


def test_unopenable_files_raise(tmp_path) -> None:
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="zero-byte"):
        check_image(empty)
    garbage = tmp_path / "garbage.png"
    garbage.write_bytes(b"not an image" * 10)
    with pytest.raises(OSError):
        check_image(garbage)


def test_a_truncated_jpeg_is_damaged_and_decodes_tolerantly(tmp_path) -> None:
    noise = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(tmp_path / "full.jpg")
    raw = (tmp_path / "full.jpg").read_bytes()
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(raw[: len(raw) // 2])
    check = check_image(cut)
    assert check.shape == (64, 64) and check.damage and not check.bits16
    decode_tolerantly(cut)  # the missing part grey; no error


def test_sixteen_bit_images(tmp_path) -> None:
    full, low, small = tmp_path / "full.png", tmp_path / "low.png", tmp_path / "small.tif"
    Image.fromarray(np.full((8, 8), 40000, np.uint16)).save(full)
    Image.fromarray(np.full((8, 8), 255, np.uint16)).save(low)  # the low byte only
    Image.fromarray(np.full((8, 8), 200, np.int32)).save(small)  # 8-bit values, mode I
    assert Image.open(small).mode == "I"
    assert check_image(full) == ImageCheck((8, 8), bits16=True)
    dark = check_image(low)
    assert dark.bits16 and dark.dark16 is not None and dark.dark16 < DARK_16BIT_MAX
    assert check_image(small) == ImageCheck((8, 8))
