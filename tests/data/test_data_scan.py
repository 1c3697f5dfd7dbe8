"""scan_images: every defect kind, coco128 acceptance numbers, cache reuse/invalidation."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from data_helpers import write_image
from PIL import Image

from libreyolo_core.data.config import load_data_config
from libreyolo_core.data.labels import label_path_for
from libreyolo_core.data.report import DEFECT_KINDS, DatasetError, DatasetWarning, format_report
from libreyolo_core.data.scan import scan_images, scan_split

GOOD = "0 0.5 0.5 0.2 0.2\n"


def _scan(yaml_path: Path, cache: bool = False):
    cfg = load_data_config(yaml_path)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        report = scan_split(cfg, "train", cache=cache)
    msgs = [str(w.message) for w in rec if issubclass(w.category, DatasetWarning)]
    return report, msgs


def test_label_path_replaces_last_images_segment() -> None:
    assert label_path_for("/d/images/x/images/train/a.b.JPG") == Path(
        "/d/images/x/labels/train/a.b.txt"
    )
    assert label_path_for("/d/imgs/a.png") == Path("/d/imgs/a.txt")
    assert label_path_for("/d/images/images.png") == Path("/d/labels/images.txt")


# kind, label text, expected labels after the fix, line number named in the warning, fragment
DEFECTS = [
    ("malformed", GOOD + "1 0.5 0.5 0.2\n", [[0, 0.5, 0.5, 0.2, 0.2]], 2, "4 values"),
    ("non_numeric", "1 0.5 abc 0.2 0.2\n" + GOOD, [[0, 0.5, 0.5, 0.2, 0.2]], 1, "'abc'"),
    ("non_numeric", GOOD + "1 nan 0.5 0.2 0.2\n", [[0, 0.5, 0.5, 0.2, 0.2]], 2, "non-finite"),
    ("bad_class", GOOD + "3 0.5 0.5 0.2 0.2\n", [[0, 0.5, 0.5, 0.2, 0.2]], 2, "outside names"),
    ("bad_class", GOOD + "-1 0.5 0.5 0.2 0.2\n", [[0, 0.5, 0.5, 0.2, 0.2]], 2, "class id -1"),
    ("bad_class", "1.5 0.5 0.5 0.2 0.2\n" + GOOD, [[0, 0.5, 0.5, 0.2, 0.2]], 1, "not an integer"),
    ("zero_area", GOOD + "1 0.5 0.5 0.0 0.2\n", [[0, 0.5, 0.5, 0.2, 0.2]], 2, "<= 0"),
    (
        "duplicate",
        GOOD + "2 0.1 0.1 0.1 0.1\n" + GOOD,
        [[0, 0.5, 0.5, 0.2, 0.2], [2, 0.1, 0.1, 0.1, 0.1]],
        3,
        "duplicate",
    ),
    # box x in [0.8, 1.2] -> clipped to [0.8, 1.0]
    ("clipped", "1 1.0 0.5 0.4 0.2\n", [[1, 0.9, 0.5, 0.2, 0.2]], 1, "clipped to the image and kept"),
    # the row: right edge 1.0002 -> clipped and named
    ("clipped", "0 0.9 0.5 0.2004 0.2\n", [[0, 0.8999, 0.5, 0.2002, 0.2]], 1, "x 0.7998..1.0002"),
    # width > 1: not a box of this image -> dropped, never stretched to full width
    ("oversize", GOOD + "0 0.5 0.5 1.2 0.3\n", [[0, 0.5, 0.5, 0.2, 0.2]], 2, "1.2x0.3"),
    (
        "out_of_bounds",
        GOOD + "1 1.5 0.5 0.2 0.2\n",
        [[0, 0.5, 0.5, 0.2, 0.2]],
        2,
        "outside the image",
    ),
    # triangle polygon -> its bounding box x 0.2..0.6, y 0.1..0.5
    ("polygon", "2 0.2 0.5 0.6 0.5 0.4 0.1\n", [[2, 0.4, 0.3, 0.4, 0.4]], 1, "bounding box"),
]


@pytest.mark.parametrize(("kind", "text", "expected", "line", "fragment"), DEFECTS)
def test_each_defect_kind(yolo_dataset, kind, text, expected, line, fragment) -> None:
    y = yolo_dataset({"img": text, "ok": GOOD})
    report, msgs = _scan(y)
    label_file = y.parent / "labels/train/img.txt"
    assert report.defects[kind] == 1
    assert report.n_defects == 1, report.defects
    assert report.n_usable == 2
    rec = next(r for r in report.records if r.im_file.stem == "img")
    np.testing.assert_allclose(rec.labels, np.array(expected, np.float32), atol=1e-6)
    assert rec.labels.dtype == np.float32 and rec.labels.shape[1] == 5
    assert len(msgs) == 1
    assert msgs[0].startswith(f"{label_file}:{line}: "), msgs[0]
    assert fragment in msgs[0]


def test_label_rounding_is_snapped_silently(yolo_dataset) -> None:
    # coco128's 6-decimal labels overshoot by 5e-7: rounding, not a defect
    y = yolo_dataset({"img": "0 0.5 0.5 1.000001 0.2\n"})
    report, msgs = _scan(y)
    assert report.n_defects == 0 and msgs == []
    np.testing.assert_allclose(report.records[0].labels, [[0, 0.5, 0.5, 1.0, 0.2]], atol=1e-6)


def test_summary_counts_clipped_and_dropped_rows_apart(yolo_dataset) -> None:
    y = yolo_dataset({"img": "0 0.9 0.5 0.2004 0.2\n0 0.5 0.5 1.2 0.3\n0 0.1 0.1 0.1 0.1\n0 0.1 0.1 0.1 0.1\n"})
    report, msgs = _scan(y)
    assert (report.rows_clipped, report.rows_dropped) == (1, 2)
    assert "label rows:    1 clipped (kept), 2 dropped" in format_report(report)
    assert report.to_dict()["rows_clipped"] == 1 and report.to_dict()["rows_dropped"] == 2


@pytest.mark.parametrize("text", [None, "", "\n  \n"])
def test_missing_or_empty_label_is_background_without_warning(yolo_dataset, text) -> None:
    y = yolo_dataset({"bg": text, "ok": GOOD})
    report, msgs = _scan(y)
    assert msgs == []
    assert report.n_usable == 2 and report.n_backgrounds == 1 and report.n_boxes == 1
    assert report.n_missing_labels == (1 if text is None else 0)
    assert report.n_defects == 0


def _break_image(path: Path, how: str) -> None:
    if how == "zero_byte":
        path.write_bytes(b"")
    elif how == "garbage":
        path.write_bytes(b"this is not an image at all" * 10)
    elif how == "truncated_jpeg":
        data = path.with_suffix(".tmp")
        write_image(data, 64, 64, fmt="JPEG")
        raw = data.read_bytes()
        data.unlink()
        path.write_bytes(raw[: len(raw) // 2])
    elif how == "truncated_png":
        raw = path.read_bytes()
        path.write_bytes(raw[: len(raw) - 30])


@pytest.mark.parametrize("how", ["zero_byte", "garbage"])
def test_unreadable_image_is_skipped_with_warning(yolo_dataset, how) -> None:
    y = yolo_dataset({"bad": GOOD, "ok": GOOD})
    bad = y.parent / "images/train/bad.png"
    _break_image(bad, how)
    report, msgs = _scan(y)
    assert report.defects["unreadable_image"] == 1 and report.n_defects == 1
    assert report.n_images == 2 and report.n_usable == 1
    assert [r.im_file.stem for r in report.records] == ["ok"]
    assert report.skipped[0][0] == str(bad)
    assert len(msgs) == 1 and msgs[0].startswith(f"{bad}: ") and "skipped" in msgs[0]


def test_unreadable_label_file_skips_image(yolo_dataset) -> None:
    y = yolo_dataset({"bad": GOOD, "ok": GOOD})
    lf = y.parent / "labels/train/bad.txt"
    lf.write_bytes(b"\xff\xfe\x00 0.5 0.5 0.1 0.1\n")
    report, msgs = _scan(y)
    assert report.defects["unreadable_label"] == 1 and report.n_usable == 1
    assert msgs[0].startswith(f"{lf}: ")


def test_no_usable_images_raises_naming_split(yolo_dataset) -> None:
    y = yolo_dataset({"a": GOOD, "b": GOOD})
    for p in (y.parent / "images/train").iterdir():
        p.write_bytes(b"")
    with pytest.raises(DatasetError) as ei, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scan_split(load_data_config(y), "train", cache=False)
    assert f"{y}: split 'train'" in str(ei.value) and "no usable images" in str(ei.value)
    with pytest.raises(DatasetError, match="no images"):
        scan_images([], {0: "a"})


def test_exif_rotated_image_size(tmp_path: Path) -> None:
    im = Image.new("RGB", (60, 20), (10, 20, 30))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 CW on display
    p = tmp_path / "images" / "r.jpg"
    p.parent.mkdir()
    im.save(p, exif=exif)
    report = scan_images([p], {0: "a"}, cache=False)
    assert report.records[0].shape == (60, 20)  # (h, w) as displayed


def test_warnings_are_capped_per_kind(yolo_dataset, monkeypatch) -> None:
    import libreyolo_core.data.scan as scan_mod

    monkeypatch.setattr(scan_mod, "MAX_WARNINGS_PER_KIND", 3)
    y = yolo_dataset({"img": "".join(f"7 0.5 0.5 0.{i + 1} 0.1\n" for i in range(8))})
    report, msgs = _scan(y)
    assert report.defects["bad_class"] == 8
    assert len(msgs) == 4 and "5 more data issues" in msgs[-1]


# ------------------------------------------------------------------ coco128


def test_coco128_acceptance(coco128: Path) -> None:
    report, msgs = _scan(coco128, cache=True)
    assert msgs == []
    assert report.n_images == 128 and report.n_usable == 128
    assert report.n_backgrounds == 2 and report.n_missing_labels == 2
    assert report.n_boxes == 929
    assert len(report.names) == 80 and len(report.classes_present) == 71
    assert report.n_defects == 0
    assert sorted(p.name for p in report.orphan_labels) == ["000000000656.txt", "000000000659.txt"]
    text = format_report(report)
    for frag in (
        "images:        128",
        "boxes:         929",
        "80 named, 71 present",
        "orphan label files (no image): 2",
        "defects:       0",
    ):
        assert frag in text, text
    d = report.to_dict()
    assert d["boxes"] == 929 and d["class_counts"]["person"] == 254
    assert d["orphan_labels"][0].endswith("000000000656.txt")
    assert report.cache_path == coco128.parent / "labels" / "train2017.labels.cache"
    assert report.cache_path.is_file()


def test_coco128_with_five_planted_defects(coco128: Path) -> None:
    lab = coco128.parent / "labels/train2017"
    img = coco128.parent / "images/train2017"
    first = (lab / "000000000009.txt").read_text().splitlines()[0]
    with open(lab / "000000000009.txt", "a") as f:
        f.write(first + "\n")  # duplicate (line 9)
    with open(lab / "000000000025.txt", "a") as f:
        f.write("91 0.5 0.5 0.1 0.1\n")  # class outside names
    with open(lab / "000000000030.txt", "a") as f:
        f.write("3 0.5 0.5\n")  # wrong column count
    with open(lab / "000000000034.txt", "a") as f:
        f.write("3 0.5 0.5 0 0.1\n")  # zero area
    (img / "000000000036.jpg").write_bytes(b"")  # zero-byte image
    report, msgs = _scan(coco128, cache=True)
    expected = {
        "duplicate": 1,
        "bad_class": 1,
        "malformed": 1,
        "zero_area": 1,
        "unreadable_image": 1,
    }
    assert {k: v for k, v in report.defects.items() if v} == expected
    assert report.n_images == 128 and report.n_usable == 127
    assert len(msgs) == 5
    n9 = len((lab / "000000000009.txt").read_text().splitlines())  # the appended line
    assert any(m.startswith(f"{lab / '000000000009.txt'}:{n9}: duplicate") for m in msgs)
    assert any(m.startswith(f"{lab / '000000000025.txt'}:") and "91" in m for m in msgs)
    # a cached scan reports the same numbers and replays the same warnings
    report2, msgs2 = _scan(coco128, cache=True)
    assert report2.from_cache and report2.defects == report.defects
    assert msgs2 == msgs and report2.n_boxes == report.n_boxes


# ------------------------------------------------------------------ cache


def test_cache_reuse_and_invalidation(yolo_dataset) -> None:
    y = yolo_dataset({"a": GOOD, "b": "1 0.2 0.2 0.1 0.1\n3 0.5 0.5 0.1 0.1\n"})
    r1, m1 = _scan(y, cache=True)
    assert not r1.from_cache and r1.cache_path.is_file() and r1.defects["bad_class"] == 1
    r2, m2 = _scan(y, cache=True)
    assert r2.from_cache and m2 == m1 and r2.n_boxes == r1.n_boxes == 2
    for a, b in zip(r1.records, r2.records, strict=True):
        assert a.im_file == b.im_file and a.shape == b.shape
        np.testing.assert_array_equal(a.labels, b.labels)

    # edit a label (size changes) -> rescan
    (y.parent / "labels/train/b.txt").write_text("1 0.2 0.2 0.1 0.1\n")
    r3, m3 = _scan(y, cache=True)
    assert not r3.from_cache and r3.n_defects == 0 and m3 == []
    # same size, new mtime -> rescan
    lf = y.parent / "labels/train/a.txt"
    lf.write_text("2 0.5 0.5 0.2 0.2\n")
    st = lf.stat()
    os.utime(lf, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    r4, _ = _scan(y, cache=True)
    assert not r4.from_cache and r4.records[0].labels[0, 0] == 2
    # image touched -> rescan; then cached again
    im = y.parent / "images/train/a.png"
    os.utime(im, ns=(im.stat().st_atime_ns, im.stat().st_mtime_ns + 10**9))
    assert not _scan(y, cache=True)[0].from_cache
    assert _scan(y, cache=True)[0].from_cache
    # a new label file for a background image -> rescan
    (y.parent / "labels/train/a.txt").unlink()
    assert not _scan(y, cache=True)[0].from_cache


def test_corrupt_cache_is_ignored(yolo_dataset) -> None:
    y = yolo_dataset({"a": GOOD})
    r1, _ = _scan(y, cache=True)
    r1.cache_path.write_bytes(b"garbage")
    r2, _ = _scan(y, cache=True)
    assert not r2.from_cache and r2.n_boxes == 1


def test_unwritable_cache_location_continues(yolo_dataset) -> None:
    y = yolo_dataset({"a": GOOD})
    blocker = y.parent / "labels" / "train.labels.cache"
    blocker.mkdir()  # the cache path is a folder: writing it fails like a read-only dir
    report, msgs = _scan(y, cache=True)
    assert report.n_boxes == 1 and not report.from_cache
    assert len(msgs) == 1 and "cannot write label cache" in msgs[0]


def test_read_only_folder_is_left_untouched(yolo_dataset) -> None:
    y = yolo_dataset({"a": GOOD})
    labels = y.parent / "labels"
    labels.chmod(0o555)  # no write bits: respected even when running as root
    try:
        report, msgs = _scan(y, cache=True)
        assert report.n_boxes == 1 and msgs == []
        assert not report.cache_path.exists()
        assert [p.name for p in labels.iterdir()] == ["train"]
        assert _scan(y, cache=True)[0].n_boxes == 1  # scans again, still fine
    finally:
        labels.chmod(0o755)


def test_report_lists_every_defect_kind(yolo_dataset) -> None:
    y = yolo_dataset({"a": GOOD})
    text = format_report(_scan(y)[0])
    for kind in DEFECT_KINDS:
        assert kind in text


def test_orphans_only_in_scanned_label_folders(yolo_dataset) -> None:
    y = yolo_dataset({"a": GOOD})
    (y.parent / "labels/train/ghost.txt").write_text(GOOD)
    (y.parent / "labels/other").mkdir()
    (y.parent / "labels/other/ghost2.txt").write_text(GOOD)
    report, _ = _scan(y)
    assert report.orphan_labels == [y.parent / "labels/train/ghost.txt"]


def test_scan_without_images_segment(tmp_path: Path) -> None:
    img = write_image(tmp_path / "flat" / "x.png")
    (tmp_path / "flat" / "x.txt").write_text(GOOD)
    report = scan_images([img], {0: "a"}, cache=True)
    assert report.n_boxes == 1 and report.orphan_labels == []
    assert report.cache_path == tmp_path / "flat.labels.cache"


def test_shared_coco_copy_is_untouched(coco128_ro: Path) -> None:
    assert not list(coco128_ro.rglob("*.cache")) and not list(coco128_ro.rglob("*.npy"))


def test_bom_and_crlf_labels(yolo_dataset) -> None:
    y = yolo_dataset({"a": ""})
    (y.parent / "labels/train/a.txt").write_bytes(
        b"\xef\xbb\xbf0 0.5 0.5 0.2 0.2\r\n1 0.2 0.2 0.1 0.1\r\n"
    )
    report, msgs = _scan(y)
    assert msgs == [] and report.n_boxes == 2 and report.n_defects == 0


def test_all_backgrounds_without_label_folder(yolo_dataset) -> None:
    y = yolo_dataset({"a": None, "b": None})
    report, msgs = _scan(y, cache=True)
    assert report.n_backgrounds == 2 and report.n_boxes == 0
    (msg,) = msgs  # a split of backgrounds only is said once, with the rule
    assert "none of the 2 images has a label file" in msg and report.n_defects == 0
    assert not (y.parent / "labels").exists()  # nothing created


def test_cache_dir_keeps_the_dataset_folder_untouched(yolo_dataset, tmp_path) -> None:
    """With a cache_dir (what the service passes) the label cache lives there, keyed by
    the content, and nothing is written into the dataset's folders; the image disk cache too."""
    from libreyolo_core.data.dataset import YOLODataset

    y = yolo_dataset({"a": GOOD, "b": GOOD})
    before = sorted(p.relative_to(y.parent) for p in y.parent.rglob("*"))
    cfg = load_data_config(y)
    cache = tmp_path / "service-cache"
    r1 = scan_split(cfg, "train", cache_dir=cache)
    assert not r1.from_cache and r1.cache_path.parent == cache / "labels"
    r2 = scan_split(cfg, "train", cache_dir=cache)
    assert r2.from_cache and r2.cache_path == r1.cache_path and r2.n_boxes == 2
    (y.parent / "labels/train/b.txt").write_text("0 0.4 0.4 0.1 0.1\n0 0.5 0.5 0.1 0.1\n")
    r3 = scan_split(cfg, "train", cache_dir=cache)  # new content: another key, a rescan
    assert not r3.from_cache and r3.cache_path != r1.cache_path and r3.n_boxes == 3
    ds = YOLODataset(r3, 64, augment=False, cache="disk", cache_dir=cache)
    ds.load_image(0)
    assert len(list((cache / "images").glob("*.64.npy"))) == 1
    assert sorted(p.relative_to(y.parent) for p in y.parent.rglob("*")) == before


def test_train_split_without_a_usable_box_is_a_data_error(yolo_dataset) -> None:
    """#28.2: every class id outside names: the scan reports it, a run refuses it,
    naming the count of names and the dropped rows."""
    from libreyolo_core.data.scan import require_trainable

    y = yolo_dataset({"a": "5 0.5 0.5 0.2 0.2\n", "b": "5 0.3 0.3 0.1 0.1\n"}, names=["x", "y"])
    report, _ = _scan(y)
    assert report.n_boxes == 0 and report.defects["bad_class"] == 2
    with pytest.raises(DatasetError) as exc:
        require_trainable(report, "train")
    msg = str(exc.value)
    assert "no usable box in 2 images" in msg and "bad_class 2" in msg
    assert "names has 2 entries, so class ids must be 0..1" in msg and "split 'train'" in msg
    assert require_trainable(report, "val") is report  # a val split is only reported


def test_labels_beside_the_images_are_an_error_that_explains_the_rule(yolo_dataset) -> None:
    from libreyolo_core.data.scan import require_trainable

    y = yolo_dataset({"a": None, "b": None})
    for stem in ("a", "b"):
        (y.parent / "images/train" / f"{stem}.txt").write_text(GOOD, encoding="utf-8")
    report, _ = _scan(y)
    assert report.defects["label_elsewhere"] == 2
    with pytest.raises(DatasetError) as exc:
        require_trainable(report, "val")
    msg = str(exc.value)
    assert "images/train/a.jpg -> d/labels/train/a.txt" in msg.replace("d/images", "images")
    assert "none of the 2 images has its label file where LibreYOLO looks" in msg


def test_one_usable_box_is_enough(yolo_dataset) -> None:
    from libreyolo_core.data.scan import require_trainable

    y = yolo_dataset({"a": "5 0.5 0.5 0.2 0.2\n", "b": GOOD}, names=["x", "y"])
    report, _ = _scan(y)
    assert require_trainable(report, "train") is report
