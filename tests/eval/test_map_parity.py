"""mAP parity: the same predictions scored by pycocotools (the reference COCO API) and by
our evaluator (:func:`libreyolo_core.eval.coco.coco_metrics`, faster-coco-eval inside)
agree to 1e-4, on coco128 and on constructed edge cases."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

from libreyolo_core.eval.coco import ImageDetections, ImageTargets, coco_metrics

pycocotools = pytest.importorskip("pycocotools")


def _pycocotools_map(dets: list[ImageDetections], tgts: list[ImageTargets], nc: int) -> tuple[float, float]:
    """(mAP50-95, mAP50) from pycocotools on the same boxes (xyxy -> COCO xywh)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    images, gts, res = [], [], []
    for i, (d, t) in enumerate(zip(dets, tgts, strict=True), 1):
        images.append({"id": i, "width": t.width, "height": t.height})
        crowd = np.zeros(len(t.classes), bool) if t.crowd is None else np.asarray(t.crowd, bool)
        for b, c, cr in zip(np.asarray(t.boxes, float).reshape(-1, 4), t.classes, crowd, strict=True):
            w, h = b[2] - b[0], b[3] - b[1]
            gts.append({"id": len(gts) + 1, "image_id": i, "category_id": int(c) + 1,
                        "bbox": [b[0], b[1], w, h], "area": w * h, "iscrowd": int(cr)})
        for b, s, c in zip(np.asarray(d.boxes, float).reshape(-1, 4), d.scores, d.classes, strict=True):
            res.append({"image_id": i, "category_id": int(c) + 1,
                        "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]], "score": float(s)})
    if not gts:
        return 0.0, 0.0
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = {"images": images, "annotations": gts,
                      "categories": [{"id": c + 1, "name": str(c)} for c in range(nc)]}
        gt.createIndex()
        if not res:
            return 0.0, 0.0
        dt = gt.loadRes(res)
        ev = COCOeval(gt, dt, "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return max(float(ev.stats[0]), 0.0), max(float(ev.stats[1]), 0.0)


def _assert_parity(dets, tgts, nc):
    ours = coco_metrics(dets, tgts, nc)
    ref = _pycocotools_map(dets, tgts, nc)
    assert ours["mAP50-95"] == pytest.approx(ref[0], abs=1e-4)
    assert ours["mAP50"] == pytest.approx(ref[1], abs=1e-4)
    return ours, ref


def _noisy(tgts: list[ImageTargets], nc: int, seed: int) -> list[ImageDetections]:
    """Predictions made from the ground truth: jittered boxes, missed boxes, wrong classes,
    duplicates and background false positives, random scores."""
    rng = np.random.default_rng(seed)
    dets = []
    for t in tgts:
        boxes = np.asarray(t.boxes, float).reshape(-1, 4)
        cls = np.asarray(t.classes).astype(int)
        keep = rng.random(len(cls)) > 0.2
        b, c = boxes[keep], cls[keep].copy()
        wh = np.maximum(b[:, 2:] - b[:, :2], 1)
        b = b + rng.normal(0, 0.08, b.shape) * np.concatenate([wh, wh], 1)
        flip = rng.random(len(c)) < 0.1
        c[flip] = rng.integers(0, nc, flip.sum())
        dup = rng.random(len(c)) < 0.15
        extra = rng.uniform(0, [t.width, t.height, t.width, t.height], (rng.integers(0, 4), 4))
        extra = np.concatenate([np.minimum(extra[:, :2], extra[:, 2:]), np.maximum(extra[:, :2], extra[:, 2:])], 1)
        all_b = np.concatenate([b, b[dup] + 3, extra])
        all_c = np.concatenate([c, c[dup], rng.integers(0, nc, len(extra))])
        dets.append(ImageDetections(all_b, rng.random(len(all_c)), all_c))
    return dets


def _coco128_targets(root) -> tuple[list[ImageTargets], int]:
    from libreyolo_core.data.config import load_data_config
    from libreyolo_core.data.scan import scan_split

    dc = load_data_config(root / "coco128.yaml")
    report = scan_split(dc, "val")
    tgts = []
    for rec in report.records:
        h, w = rec.shape
        lab = rec.labels
        cx, cy, bw, bh = lab[:, 1] * w, lab[:, 2] * h, lab[:, 3] * w, lab[:, 4] * h
        boxes = np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], 1)
        tgts.append(ImageTargets(boxes, lab[:, 0].astype(int), w, h))
    return tgts, len(dc.names)


def test_coco128_predictions_agree_with_pycocotools(coco128_dir):
    tgts, nc = _coco128_targets(coco128_dir)
    for seed in (0, 1):
        ours, ref = _assert_parity(_noisy(tgts, nc, seed), tgts, nc)
        assert 0.05 < ref[0] < 0.95  # a real spread of scores, not a trivial case


def _scene():
    return [
        ImageTargets(np.array([[10, 10, 50, 60], [100, 100, 200, 180], [300, 300, 310, 305]]),
                     np.array([0, 2, 1]), 640, 480),
        ImageTargets(np.zeros((0, 4)), np.zeros(0, int), 640, 480),
        ImageTargets(np.array([[5, 5, 30, 30], [40, 40, 42, 43]]), np.array([1, 1]), 320, 320),
    ]


def test_empty_predictions():
    tgts = _scene()
    empty = [ImageDetections(np.zeros((0, 4)), np.zeros(0), np.zeros(0, int)) for _ in tgts]
    ours, ref = _assert_parity(empty, tgts, 4)
    assert ours["mAP50-95"] == 0.0


def test_crowd_boxes():
    tgts = _scene()
    tgts[0].crowd = np.array([False, True, False])  # class 2's box is a crowd region
    dets = [ImageDetections(np.array([[10, 10, 50, 60], [110, 105, 150, 150], [120, 110, 190, 170],
                                      [300, 300, 310, 305]]), np.array([0.9, 0.8, 0.7, 0.6]),
                            np.array([0, 2, 2, 1])),
            ImageDetections(np.array([[0, 0, 20, 20]]), np.array([0.5]), np.array([0])),
            ImageDetections(np.array([[5, 5, 31, 30]]), np.array([0.95]), np.array([1]))]
    _assert_parity(dets, tgts, 4)


def test_tiny_boxes():
    tgts = [ImageTargets(np.array([[10, 10, 11, 11], [20, 20, 22.5, 21.5], [0, 0, 3, 3]]),
                         np.array([0, 0, 1]), 64, 64)]
    dets = [ImageDetections(np.array([[10, 10, 11, 11.2], [20.2, 20, 22.5, 21.5], [0.5, 0.5, 3, 3],
                                      [30, 30, 30.5, 30.5]]), np.array([0.9, 0.3, 0.6, 0.8]),
                            np.array([0, 0, 1, 0]))]
    _assert_parity(dets, tgts, 2)


def test_classes_absent_from_one_side():
    tgts = _scene()  # class 3 never in the ground truth
    dets = [ImageDetections(np.array([[10, 10, 50, 60], [400, 400, 450, 450]]), np.array([0.9, 0.99]),
                            np.array([0, 3])),  # a class-3 detection; class 2 never predicted
            ImageDetections(np.array([[1, 1, 9, 9]]), np.array([0.4]), np.array([3])),
            ImageDetections(np.array([[5, 5, 30, 30]]), np.array([0.7]), np.array([1]))]
    ours, _ = _assert_parity(dets, tgts, 4)
    assert ours["per_class_AP"][2] == 0.0 and 3 not in ours["per_class_AP"]


def test_many_detections_per_image_cut_at_max_det():
    rng = np.random.default_rng(3)
    xy = rng.uniform(0, 500, (60, 2))
    gt = np.concatenate([xy, xy + rng.uniform(5, 60, (60, 2))], 1)
    tgts = [ImageTargets(gt, rng.integers(0, 2, 60), 600, 600)]
    db = np.concatenate([gt + rng.normal(0, 3, gt.shape)] * 3)
    dets = [ImageDetections(db, rng.random(len(db)), np.concatenate([tgts[0].classes] * 3))]
    _assert_parity(dets, tgts, 2)
