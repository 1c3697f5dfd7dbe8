"""generate_sample_dataset: deterministic, synthetic-labelled, scans clean, boxes tight."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from libreyolo_core.data import load_data_config, load_image, scan_split
from libreyolo_core.data.sample import _COLOURS, SAMPLE_NAMES, generate_sample_dataset, main


def _labels(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.txt"))}


def test_same_seed_identical_different_seed_differs(tmp_path: Path) -> None:
    a = generate_sample_dataset(tmp_path / "a", n_train=10, n_val=3, imgsz=96, seed=5)
    b = generate_sample_dataset(tmp_path / "b", n_train=10, n_val=3, imgsz=96, seed=5)
    c = generate_sample_dataset(tmp_path / "c", n_train=10, n_val=3, imgsz=96, seed=6)
    la, lb, lc = _labels(a.parent), _labels(b.parent), _labels(c.parent)
    assert la == lb and la != lc
    imgs = sorted((a.parent / "images").rglob("*.jpg"))
    assert len(imgs) == 13
    assert imgs[0].read_bytes() == (b.parent / imgs[0].relative_to(a.parent)).read_bytes()


def test_layout_yaml_and_clean_scan(tmp_path: Path) -> None:
    y = generate_sample_dataset(tmp_path / "s", n_train=30, n_val=5, imgsz=128, seed=0)
    assert "SYNTHETIC" in y.read_text() and "SYNTHETIC" in (y.parent / "README.txt").read_text()
    cfg = load_data_config(y)
    assert cfg.names == SAMPLE_NAMES and len(cfg.train) == 30 and len(cfg.val) == 5
    r = scan_split(cfg, "train")
    assert r.n_defects == 0 and r.n_usable == 30
    assert 1 <= r.n_backgrounds < 15
    per_image = [len(x.labels) for x in r.records if len(x.labels)]
    assert min(per_image) >= 1 and max(per_image) <= 6
    assert set(r.classes_present) == set(SAMPLE_NAMES)
    assert {x.shape[1] for x in r.records} == {128}  # width = imgsz, heights vary
    assert len({x.shape[0] for x in r.records}) > 1


def test_boxes_enclose_their_shapes(tmp_path: Path) -> None:
    y = generate_sample_dataset(tmp_path / "s", n_train=8, n_val=0, imgsz=128, seed=2)
    r = scan_split(load_data_config(y), "train")
    checked = 0
    for rec in r.records:
        img = load_image(rec.im_file).astype(np.int16)
        h, w = rec.shape
        for cls, cx, cy, bw, bh in rec.labels:
            x1, x2 = (cx - bw / 2) * w, (cx + bw / 2) * w
            y1, y2 = (cy - bh / 2) * h, (cy + bh / 2) * h
            colour = np.array(_COLOURS[int(cls)])
            m = 3  # look 3 px beyond the box
            ox, oy = max(0, int(x1) - m), max(0, int(y1) - m)
            region = img[oy : int(y2) + m + 1, ox : int(x2) + m + 1]
            ys, xs = np.nonzero(np.abs(region - colour).max(axis=2) <= 45)
            assert len(xs) > 0.1 * bw * w * bh * h, (rec.im_file, cls)
            # the shape's pixels lie inside the box and reach (nearly) all four edges
            # (a triangle's sharp apex and corners blur away in the JPEG: up to 4 px)
            ext = np.array([xs.min() + ox, ys.min() + oy, xs.max() + ox + 1, ys.max() + oy + 1])
            box = np.array([x1, y1, x2, y2])
            assert (ext[:2] >= box[:2] - 1.5).all() and (ext[2:] <= box[2:] + 1.5).all()
            np.testing.assert_allclose(ext, box, atol=4.0)
            checked += 1
    assert checked > 5


def test_cli(tmp_path: Path, capsys) -> None:
    assert main([str(tmp_path / "cli"), "--seed", "3", "--n-train", "2", "--n-val", "1"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.endswith("data.yaml") and Path(out).is_file()
    proc = subprocess.run(
        [sys.executable, "-m", "libreyolo_core.data.sample", "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert "SYNTHETIC" in proc.stdout


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="n_train"):
        generate_sample_dataset(tmp_path, n_train=0)
    with pytest.raises(ValueError, match="imgsz"):
        generate_sample_dataset(tmp_path, imgsz=10)
