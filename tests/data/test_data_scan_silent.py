"""The scan never drops or alters data without saying so: damaged-but-decodable images,
16-bit conversion, images sharing a label file, label files outside the rule's place."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from data_helpers import write_image
from PIL import Image

from libreyolo_core.data.config import load_data_config
from libreyolo_core.data.dataset import YOLODataset
from libreyolo_core.data.image import load_image
from libreyolo_core.data.report import DatasetWarning, format_report
from libreyolo_core.data.scan import scan_split

GOOD = "0 0.5 0.5 0.2 0.2\n"


def _scan(yaml_path: Path, cache: bool = False):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        report = scan_split(load_data_config(yaml_path), "train", cache=cache)
    return report, [str(w.message) for w in rec if issubclass(w.category, DatasetWarning)]


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_truncated_image_is_repaired_and_used_with_a_warning(yolo_dataset, fmt) -> None:
    y = yolo_dataset({"bad": GOOD, "ok": GOOD})
    bad = y.parent / "images/train/bad.png"
    rng = np.random.default_rng(0)
    buf = bad.with_suffix(".tmp")
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buf, format=fmt)
    raw = buf.read_bytes()
    buf.unlink()
    bad.write_bytes(raw[: len(raw) // 2] if fmt == "JPEG" else raw[:-30])
    report, msgs = _scan(y)
    assert report.defects["repaired_image"] == 1 and report.n_defects == 1
    assert report.n_usable == 2 and report.n_boxes == 2  # used, with its box
    assert len(msgs) == 1 and msgs[0].startswith(f"{bad}: ") and "missing part grey and used" in msgs[0]
    with pytest.raises(OSError, match="truncated"):
        load_image(bad)  # strict by default (predict names the file)
    ds = YOLODataset(report, 64, augment=False)
    img, labels, _ = ds[[r.im_file for r in report.records].index(bad)]
    assert img.shape == (3, 64, 64) and len(labels) == 1


def test_sixteen_bit_conversion_is_announced_and_dark_results_named(yolo_dataset) -> None:
    y = yolo_dataset({"full": GOOD, "low": GOOD, "rgb": GOOD})
    folder = y.parent / "images/train"
    Image.fromarray(np.full((48, 64), 40000, np.uint16)).save(folder / "full.png")
    Image.fromarray(np.full((48, 64), 255, np.uint16)).save(folder / "low.png")  # low byte only
    assert Image.open(folder / "low.png").mode.startswith("I;16")
    report, msgs = _scan(y)
    assert report.n_16bit == 2 and report.dark_16bit == [str(folder / "low.png")]
    assert load_image(folder / "low.png").max() == 1  # what reaches the model: worth a warning
    dark = [m for m in msgs if "near-black" in m and m.startswith(f"{folder / 'low.png'}: ")]
    assert len(dark) == 1 and "brightest pixel 1/255" in dark[0]
    summary = [m for m in msgs if "16-bit image(s) converted to 8 bits by value / 257" in m]
    assert len(summary) == 1 and ": 2 16-bit image(s)" in summary[0] and "1 of them near-black" in summary[0]
    assert report.n_defects == 0  # a conversion, not a defect
    assert "16-bit images: 2 converted by value / 257, 1 near-black" in format_report(report)
    cached, msgs2 = _scan(y, cache=True)
    cached, msgs2 = _scan(y, cache=True)
    assert cached.from_cache and cached.n_16bit == 2 and msgs2 == msgs


def test_images_sharing_a_label_file_are_named(yolo_dataset) -> None:
    y = yolo_dataset({"x": GOOD, "y": GOOD})
    folder = y.parent / "images/train"
    write_image(folder / "x.JPG", fmt="JPEG")
    report, msgs = _scan(y)
    assert report.defects["shared_label"] == 1 and report.n_usable == 3
    (msg,) = msgs
    lf = y.parent / "labels/train/x.txt"
    assert msg.startswith(f"{lf}: shared by ") and str(folder / "x.JPG") in msg and str(folder / "x.png") in msg


@pytest.mark.parametrize("where", ["beside", "sibling"])
def test_label_file_outside_the_rule_is_never_a_silent_background(tmp_path, where) -> None:
    # beside: images/train/a.png + images/train/a.txt (the rule looks in labels/train/)
    # sibling: imgs/a.png + labels/a.txt (no 'images' folder: the rule looks beside the image)
    root = tmp_path / "ds"
    folder = root / ("images/train" if where == "beside" else "imgs")
    write_image(folder / "a.png")
    write_image(folder / "b.png")
    found = folder / "a.txt" if where == "beside" else root / "labels" / "a.txt"
    found.parent.mkdir(parents=True, exist_ok=True)
    found.write_text(GOOD)
    (root / "data.yaml").write_text(f"train: {folder.relative_to(root)}\nnames: [a]\n")
    report, msgs = _scan(root / "data.yaml")
    assert report.defects["label_elsewhere"] == 1 and report.n_backgrounds == 2
    named = [m for m in msgs if "images/ -> labels/ rule" in m]
    assert len(named) == 1 and named[0].startswith(f"{folder / 'a.png'}: ") and str(found) in named[0]


def test_a_split_without_any_label_file_says_the_rule(tmp_path) -> None:
    root = tmp_path / "ds"
    for stem in ("a", "b"):
        write_image(root / "images" / "train" / f"{stem}.png")
        (root / "label" / "train").mkdir(parents=True, exist_ok=True)
        (root / "label" / "train" / f"{stem}.txt").write_text(GOOD)  # 'label', not 'labels'
    (root / "data.yaml").write_text("train: images/train\nnames: [a]\n")
    report, msgs = _scan(root / "data.yaml")
    assert report.n_backgrounds == 2
    assert any("none of the 2 images has a label file" in m and "'labels'" in m for m in msgs)
