"""load_image: every pixel mode to uint8 RGB, EXIF orientation, awkward paths, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from libreyolo_core.data.image import ImageDecodeError, jpeg_frame, load_image, load_image_fast


def _check(a: np.ndarray, h: int, w: int) -> None:
    assert a.dtype == np.uint8 and a.shape == (h, w, 3) and a.flags.c_contiguous


def test_rgb_png_roundtrip(tmp_path: Path) -> None:
    arr = np.random.default_rng(0).integers(0, 256, (7, 9, 3), dtype=np.uint8)
    Image.fromarray(arr).save(tmp_path / "a.png")
    out = load_image(tmp_path / "a.png")
    _check(out, 7, 9)
    np.testing.assert_array_equal(out, arr)  # RGB order, not BGR


def test_exif_orientation_applied(tmp_path: Path) -> None:
    arr = np.zeros((20, 60, 3), np.uint8)
    arr[:, :30] = (255, 0, 0)  # left half red, right half blue (as stored)
    arr[:, 30:] = (0, 0, 255)
    exif = Image.Exif()
    exif[0x0112] = 6  # display rotated 90 degrees clockwise
    Image.fromarray(arr).save(tmp_path / "r.jpg", exif=exif, quality=95)
    out = load_image(tmp_path / "r.jpg")
    _check(out, 60, 20)
    # after a clockwise rotation the stored left (red) part is on top
    assert out[5, 10, 0] > 200 and out[5, 10, 2] < 60
    assert out[55, 10, 2] > 200 and out[55, 10, 0] < 60


def test_grayscale(tmp_path: Path) -> None:
    Image.fromarray(np.full((5, 6), 77, np.uint8), mode="L").save(tmp_path / "g.png")
    out = load_image(tmp_path / "g.png")
    _check(out, 5, 6)
    assert (out == 77).all()


def test_one_bit(tmp_path: Path) -> None:
    Image.new("1", (8, 4), 1).save(tmp_path / "b.bmp")
    out = load_image(tmp_path / "b.bmp")
    _check(out, 4, 8)
    assert (out == 255).all()


def test_rgba_alpha_dropped(tmp_path: Path) -> None:
    Image.new("RGBA", (6, 5), (10, 20, 30, 0)).save(tmp_path / "a.png")
    out = load_image(tmp_path / "a.png")
    _check(out, 5, 6)
    assert (out == [10, 20, 30]).all()


def test_palette_with_transparency(tmp_path: Path) -> None:
    im = Image.new("P", (6, 5), 1)
    im.putpalette([0, 0, 0, 200, 100, 50] + [0] * 762)
    im.info["transparency"] = 0
    im.save(tmp_path / "p.png", transparency=0)
    out = load_image(tmp_path / "p.png")
    _check(out, 5, 6)
    assert (out == [200, 100, 50]).all()


def test_sixteen_bit(tmp_path: Path) -> None:
    arr = np.array([[0, 257 * 100, 65535]], dtype=np.uint16)
    Image.fromarray(arr).save(tmp_path / "d.png")
    with Image.open(tmp_path / "d.png") as im:
        assert im.mode in ("I;16", "I")
    out = load_image(tmp_path / "d.png")
    _check(out, 1, 3)
    assert out[0, :, 0].tolist() == [0, 100, 255]


def test_sixteen_bit_tiff_and_int32(tmp_path: Path) -> None:
    Image.fromarray(np.full((2, 2), 51400, np.uint16)).save(tmp_path / "d.tif")
    assert (load_image(tmp_path / "d.tif") == 200).all()
    Image.fromarray(np.full((2, 2), 42, np.int32), mode="I").save(tmp_path / "i.tif")
    assert (load_image(tmp_path / "i.tif") == 42).all()


def test_cmyk_jpeg(tmp_path: Path) -> None:
    Image.new("CMYK", (8, 8), (0, 255, 255, 0)).save(tmp_path / "c.jpg", quality=100)
    out = load_image(tmp_path / "c.jpg")
    _check(out, 8, 8)
    r, g, b = out[4, 4].astype(int)
    assert r > 200 and g < 60 and b < 60  # cyan 0, magenta+yellow full = red


@pytest.mark.parametrize("name", ["UPPER.JPG", "with space/a b.jpeg", "ñandú/日本 ü.webp"])
def test_awkward_names(tmp_path: Path, name: str) -> None:
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    kwargs = {"lossless": True} if p.suffix == ".webp" else {"quality": 100}
    Image.new("RGB", (10, 6), (0, 128, 255)).save(p, **kwargs)
    out = load_image(p)
    _check(out, 6, 10)
    assert abs(int(out[3, 5, 1]) - 128) < 8


def test_draft_decode_keeps_target_size(tmp_path: Path) -> None:
    Image.new("RGB", (1600, 1200), (40, 50, 60)).save(tmp_path / "big.jpg")
    out = load_image(tmp_path / "big.jpg", max_side=320)
    assert max(out.shape[:2]) >= 320 and max(out.shape[:2]) < 1600
    assert out.shape[1] * 3 == out.shape[0] * 4  # aspect kept


def test_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not an image")
    with pytest.raises(ImageDecodeError, match="bad.jpg"):
        load_image(bad)
    with pytest.raises(FileNotFoundError, match="nope.png"):
        load_image(tmp_path / "nope.png")
    trunc = tmp_path / "trunc.png"
    Image.new("RGB", (64, 64), (1, 2, 3)).save(trunc)
    trunc.write_bytes(trunc.read_bytes()[:60])
    with pytest.raises(ImageDecodeError, match="trunc.png"):
        load_image(trunc)


# ---------------------------------------------------------------- load_image_fast
@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("max_side", [None, 40, 17, 8])
def test_fast_decode_equals_pillow_for_jpegs(tmp_path: Path, orientation: int, max_side) -> None:
    """OpenCV's decode (EXIF orientation, DCT scaling) gives Pillow's pixels exactly."""
    rng = np.random.default_rng(orientation)
    arr = rng.integers(0, 255, (48, 80, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = orientation
    p = tmp_path / "o.jpg"
    Image.fromarray(arr).save(p, exif=exif, quality=90)
    a, b = load_image(p, max_side=max_side), load_image_fast(p, max_side=max_side)
    assert a.shape == b.shape and a.dtype == b.dtype and (a == b).all()


@pytest.mark.parametrize("kind", ["grey", "progressive", "cmyk", "truncated", "png", "exif_only"])
def test_fast_decode_other_files(tmp_path: Path, kind: str) -> None:
    """Grey and progressive JPEGs decode the same; CMYK, truncated JPEGs and other formats
    go to Pillow (same result by construction)."""
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 255, (30, 50, 3), dtype=np.uint8)
    p = tmp_path / ("x.png" if kind == "png" else "x.jpg")
    if kind == "grey":
        Image.fromarray(rgb[..., 0]).save(p)
    elif kind == "progressive":
        Image.fromarray(rgb).save(p, progressive=True)
    elif kind == "cmyk":
        Image.fromarray(rgb).convert("CMYK").save(p)
        assert jpeg_frame(p.read_bytes())[2] == 4
    elif kind == "truncated":
        Image.fromarray(rgb).save(p, quality=95)
        p.write_bytes(p.read_bytes()[:-200])
    elif kind == "exif_only":  # a JPEG whose header segments come before the frame
        exif = Image.Exif()
        exif[0x010F] = "x" * 300
        Image.fromarray(rgb).save(p, exif=exif, icc_profile=b"\0" * 500)
    else:
        Image.fromarray(rgb).save(p)
    truncated = kind == "truncated"
    a = load_image(p, max_side=25, truncated_ok=truncated)
    b = load_image_fast(p, max_side=25, truncated_ok=truncated)
    assert a.shape == b.shape and (a == b).all()
    if kind not in ("png",):
        assert jpeg_frame(p.read_bytes())[:2] == (30, 50)


def test_fast_decode_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.jpg"):
        load_image_fast(tmp_path / "nope.jpg")
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    with pytest.raises(ImageDecodeError, match="bad.jpg"):
        load_image_fast(bad)
    assert jpeg_frame(b"GIF89a") is None and jpeg_frame(bad.read_bytes()) is None
