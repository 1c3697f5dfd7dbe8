"""YOLODataset: sample format, label geometry, determinism, mosaic switch, caches."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from data_helpers import write_image
from PIL import Image

from libreyolo_core.config import AugmentConfig
from libreyolo_core.data import augment as A
from libreyolo_core.data import dataset as dataset_mod
from libreyolo_core.data.dataset import YOLODataset
from libreyolo_core.data.report import DatasetWarning
from libreyolo_core.data.scan import scan_images

COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]
SIZES = [(40, 90), (120, 60), (200, 200), (30, 30), (64, 100), (90, 50)]  # (h, w)
S = 64


@pytest.fixture
def boxes_report(tmp_path: Path):
    """6 grey images of varied sizes, each with one rectangle of its class colour."""
    files, rng = [], np.random.default_rng(0)
    for i, (h, w) in enumerate(SIZES):
        cls = i % 4
        x1, y1 = int(rng.integers(0, w // 2)), int(rng.integers(0, h // 2))
        x2, y2 = int(rng.integers(x1 + w // 4, w + 1)), int(rng.integers(y1 + h // 4, h + 1))
        img = np.full((h, w, 3), 100, np.uint8)
        img[y1:y2, x1:x2] = COLOURS[cls]
        p = tmp_path / "images" / f"im{i}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(p)
        lp = tmp_path / "labels" / f"im{i}.txt"
        lp.parent.mkdir(parents=True, exist_ok=True)
        cx, cy, bw, bh = (x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h
        lp.write_text(f"{cls} {cx:.6f} {cy:.6f} {bw:.6f} {bh:.6f}\n")
        files.append(p)
    return scan_images(files, {0: "r", 1: "g", 2: "b", 3: "y"}, cache=False)


def _assert_boxes_on_colour(
    image: torch.Tensor, labels: torch.Tensor, tol: float, min_fill: float = 0.5
) -> None:
    """Pure-colour pixels of class k lie inside a box of class k (within ``tol``), and each
    box of at least 3x3 px is at least ``min_fill`` covered by its colour."""
    img = image.permute(1, 2, 0).numpy().astype(np.int16)
    boxes = labels.tolist()
    for k, colour in enumerate(COLOURS):
        mask = np.abs(img - colour).max(axis=2) <= 40
        ys, xs = np.nonzero(mask)
        inside = np.zeros(len(xs), bool)
        for cls, x1, y1, x2, y2 in boxes:
            if int(cls) != k:
                continue
            inside |= (
                (xs >= x1 - tol) & (xs + 1 <= x2 + tol) & (ys >= y1 - tol) & (ys + 1 <= y2 + tol)
            )
            if min(x2 - x1, y2 - y1) >= 3:
                sub = mask[int(np.ceil(y1)) : int(y2), int(np.ceil(x1)) : int(x2)]
                assert sub.mean() >= min_fill, (k, x1, y1, x2, y2, sub.mean())
        assert inside.all(), (k, boxes)


def test_validation_sample_format_and_letterbox_geometry(boxes_report) -> None:
    ds = YOLODataset(boxes_report, S, augment=False)
    for i, rec in enumerate(boxes_report.records):
        image, labels, meta = ds[i]
        assert image.dtype == torch.uint8 and image.shape == (3, S, S) and image.is_contiguous()
        assert labels.dtype == torch.float32 and labels.shape == (1, 5)
        h0, w0 = rec.shape
        assert meta["orig_shape"] == (h0, w0) and meta["path"] == str(rec.im_file)
        assert meta["ratio"] == pytest.approx(S / max(h0, w0)) and meta["mosaic"] is False
        # map the canvas box back to the original image: matches the label file
        left, top = meta["pad"]
        r = meta["ratio"]
        back = (labels[0, 1:].numpy() - [left, top, left, top]) / r
        c, cx, cy, bw, bh = rec.labels[0]
        want = [(cx - bw / 2) * w0, (cy - bh / 2) * h0, (cx + bw / 2) * w0, (cy + bh / 2) * h0]
        np.testing.assert_allclose(back, want, atol=1.0 / r)
        _assert_boxes_on_colour(image, labels, tol=1.5)
        # padding is grey 114
        if left:
            assert (image[:, :, :left] == 114).all()
        if top:
            assert (image[:, :top, :] == 114).all()


@pytest.mark.parametrize("degrees", [0.0, 10.0])
def test_augmented_boxes_follow_objects(boxes_report, degrees, monkeypatch) -> None:
    # keep every box with area (no candidate filter) so no visible object lacks its box
    monkeypatch.setattr(A, "box_candidates", lambda b, a: (a[:, 2] > a[:, 0]) & (a[:, 3] > a[:, 1]))
    monkeypatch.setattr(dataset_mod, "MIN_BOX_SIDE", 0.0)
    aug = AugmentConfig(mosaic=1.0, mixup=0.0, hsv_prob=0.0, degrees=degrees, shear=0.0,
                        scale=(0.5, 1.5), fliplr=0.5, flipud=0.5)
    ds = YOLODataset(boxes_report, S, augment=True, aug=aug)
    n_boxes = 0
    for epoch in range(3):
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            image, labels, meta = ds[i]
            assert image.shape == (3, S, S) and meta["mosaic"] is True
            assert (labels[:, 1:] >= 0).all() and (labels[:, 1:] <= S).all()
            # a rotated box clipped at the border can hold only its empty corner: no fill check
            _assert_boxes_on_colour(image, labels, 2.0, 0.5 if degrees == 0 else 0.0)
            n_boxes += len(labels)
    assert n_boxes > 0


def test_augmentation_is_pure_function_of_seed_rank_epoch_index(boxes_report) -> None:
    aug = AugmentConfig(mixup=0.5)
    a = YOLODataset(boxes_report, S, augment=True, aug=aug, seed=3)
    b = YOLODataset(boxes_report, S, augment=True, aug=aug, seed=3)

    def same(x, y) -> bool:
        return torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])

    a.set_epoch(5)
    b.set_epoch(5)
    assert same(a[2], b[2]) and same(a[2], a[2])
    b.set_epoch(6)
    assert not same(a[2], b[2])
    c = YOLODataset(boxes_report, S, augment=True, aug=aug, seed=3, rank=1)
    c.set_epoch(5)
    assert not same(a[2], c[2])
    d = YOLODataset(boxes_report, S, augment=True, aug=aug, seed=4)
    d.set_epoch(5)
    assert not same(a[2], d[2])


def test_close_mosaic(boxes_report) -> None:
    ds = YOLODataset(boxes_report, S, augment=True, aug=AugmentConfig(mosaic=1.0, mixup=1.0))
    assert ds.mosaic_enabled and ds[0][2]["mosaic"] is True
    ds.close_mosaic()
    assert not ds.mosaic_enabled
    image, labels, meta = ds[0]
    assert meta["mosaic"] is False and len(labels) == 1  # letterbox, no mixup partner
    assert "mosaic=False" in repr(ds)


def test_augment_config_validation() -> None:
    assert AugmentConfig(scale=0.5).scale == (0.5, 1.5)
    assert AugmentConfig().hsv_h == 5.0
    with pytest.raises(ValueError, match="mosaic"):
        AugmentConfig(mosaic=1.5)
    with pytest.raises(ValueError, match="scale"):
        AugmentConfig(scale=(0, 1))
    with pytest.raises(ValueError, match="degrees"):
        AugmentConfig(degrees=-1)
    with pytest.raises(ValueError, match="mixup_scale"):
        AugmentConfig(mixup_scale=(0.5, 1.5))  # not a dataset key


def test_train_config_hands_its_validated_augmentation_down() -> None:
    from libreyolo_core.config import resolve_config

    cfg = resolve_config({"model": "yolo9-t", "mosaic": 0.5, "scale": 0.25})
    assert cfg.augment == AugmentConfig(mosaic=0.5, scale=(0.75, 1.25), mixup=0.0, degrees=0.0, shear=0.0)
    # one declaration: TrainConfig's fields are AugmentConfig's (default, range, description)
    assert all(repr(type(cfg).model_fields[k]) == repr(f) for k, f in AugmentConfig.model_fields.items())


def test_constructor_errors(boxes_report) -> None:
    with pytest.raises(ValueError, match="at least one"):
        YOLODataset([], S, augment=False)
    with pytest.raises(ValueError, match="Invalid cache mode"):
        YOLODataset(boxes_report, S, augment=False, cache="gpu")
    with pytest.raises(ValueError, match="imgsz"):
        YOLODataset(boxes_report, 16, augment=False)


def test_ram_cache_matches_uncached(boxes_report, monkeypatch) -> None:
    plain = YOLODataset(boxes_report, S, augment=True)
    ram = YOLODataset(boxes_report, S, augment=True, cache="ram")
    assert ram.cache == "ram"

    def boom(*a, **k):
        raise AssertionError("decoded although cached in RAM")

    monkeypatch.setattr(dataset_mod, "load_image", boom)
    for i in range(len(ram)):
        assert torch.equal(ram[i][0], plain.__class__.__getitem__(ram, i)[0])
    monkeypatch.undo()
    for i in range(len(ram)):
        assert torch.equal(ram[i][0], plain[i][0]) and torch.equal(ram[i][1], plain[i][1])


def test_disk_cache_written_reused_and_refreshed(boxes_report, monkeypatch) -> None:
    ds = YOLODataset(boxes_report, S, augment=False, cache="disk")
    ref = [ds[i][0] for i in range(len(ds))]
    rec0 = boxes_report.records[0]
    npy = rec0.im_file.with_name(f"{rec0.im_file.name}.{S}.npy")
    assert npy.is_file() and np.load(npy).shape[2] == 3
    assert len(list(rec0.im_file.parent.glob(f"*.{S}.npy"))) == len(ds)

    def boom(*a, **k):
        raise AssertionError("decoded although cached on disk")

    monkeypatch.setattr(dataset_mod, "load_image", boom)
    ds2 = YOLODataset(boxes_report, S, augment=False, cache="disk")
    assert all(torch.equal(ds2[i][0], ref[i]) for i in range(len(ds2)))
    monkeypatch.undo()

    # a newer source image invalidates its cache file
    arr = np.full((*rec0.shape, 3), 7, np.uint8)
    Image.fromarray(arr).save(rec0.im_file)
    st = npy.stat()
    os.utime(rec0.im_file, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    img = ds2[0][0]
    assert (img[:, S // 2, S // 2] == 7).all()
    # a corrupt cache file is rebuilt
    npy.write_bytes(b"junk")
    assert torch.equal(ds2[0][0], img)


def test_disk_cache_read_only_falls_back_with_one_warning(boxes_report) -> None:
    folder = boxes_report.records[0].im_file.parent
    folder.chmod(0o555)  # no write bits: respected even when running as root
    try:
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            ds = YOLODataset(boxes_report, S, augment=False, cache="disk")
            _ = [ds[i] for i in range(len(ds))]
    finally:
        folder.chmod(0o755)
    msgs = [str(w.message) for w in rec if issubclass(w.category, DatasetWarning)]
    assert len(msgs) == 1 and "not writable" in msgs[0]
    assert ds.cache is False
    assert not list(boxes_report.records[0].im_file.parent.glob("*.npy"))


def test_upscaling_and_exif_image(tmp_path: Path) -> None:
    im = Image.new("RGB", (20, 10), (100, 100, 100))
    im.paste((255, 0, 0), (0, 0, 10, 10))  # left half red as stored
    exif = Image.Exif()
    exif[0x0112] = 6  # shown rotated 90 CW: red on top, displayed 10 wide x 20 high
    p = tmp_path / "images" / "e.jpg"
    p.parent.mkdir()
    im.save(p, exif=exif, quality=100)
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "e.txt").write_text("0 0.5 0.25 1.0 0.5\n")  # top half of display
    report = scan_images([p], {0: "red"}, cache=False)
    image, labels, meta = YOLODataset(report, S, augment=False)[0]
    assert meta["orig_shape"] == (20, 10) and meta["pad"] == (16, 0)
    np.testing.assert_allclose(labels[0, 1:].numpy(), [16, 0, 48, 32], atol=1e-4)
    assert image[0, 8, 32] > 200 and image[1, 8, 32] < 60  # red where the box is
    assert image[0, 56, 32] < 150  # grey below


def test_sample_dataset_through_dataset(tmp_path: Path) -> None:
    from libreyolo_core.data import generate_sample_dataset, load_data_config, scan_split

    cfg = load_data_config(generate_sample_dataset(tmp_path / "s", n_train=4, n_val=2, imgsz=96))
    ds = YOLODataset(scan_split(cfg, "val"), 96, augment=False)
    image, labels, meta = ds[0]
    assert image.shape == (3, 96, 96) and meta["path"].endswith(".jpg")


def test_write_image_helper_sanity(tmp_path: Path) -> None:
    p = write_image(tmp_path / "x.png", 5, 7)
    with Image.open(p) as im:
        assert im.size == (7, 5)
