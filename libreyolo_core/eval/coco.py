"""COCO-style detection metrics with faster-coco-eval.

The metric definitions are COCO's (Lin et al. 2014, https://cocodataset.org/#detection-eval):
AP averaged over IoU 0.50:0.05:0.95 (``mAP50-95``) and at IoU 0.50 (``mAP50``), 101-point
interpolated precision, up to 100 detections per image, computed by faster-coco-eval
(tests/eval/test_map_parity.py checks it against pycocotools to 1e-4). Precision and
recall are the class-averaged values at the confidence of best mean F1, from COCO's
matching at IoU 0.50 (:mod:`~libreyolo_core.eval.match`).

Unlike the COCO tooling, boxes here are xyxy pixels, and the area ranges (small/medium/
large) are kept only for the ``all`` range we report.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from libreyolo_core.eval.match import confidence_curves, match_all

__all__ = ["ImageDetections", "ImageTargets", "coco_metrics", "METRIC_KEYS"]

METRIC_KEYS = ("precision", "recall", "mAP50", "mAP50-95")


@dataclass
class ImageTargets:
    """Ground truth of one image.

    Attributes:
        boxes: (M, 4) xyxy pixels of the image the predictions refer to.
        classes: (M,) integer class ids.
        width, height: image size in pixels (COCO needs it; the metric does not use it).
        crowd: optional (M,) booleans: COCO ``iscrowd`` boxes (a detection matching one is
            neither a TP nor an FP; YOLO labels have none).
    """

    boxes: Any
    classes: Any
    width: int = 0
    height: int = 0
    crowd: Any = None


@dataclass
class ImageDetections:
    """Predictions for one image: (N, 4) xyxy pixel ``boxes``, (N,) ``scores``, (N,) ``classes``."""

    boxes: Any
    scores: Any
    classes: Any
    extra: dict = field(default_factory=dict)


def _np(x: Any, shape: tuple[int, ...]) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x, dtype=np.float64)
    return arr.reshape(shape) if arr.size == 0 else arr


def _xywh(boxes: np.ndarray) -> np.ndarray:
    out = boxes.copy()
    out[:, 2:] = boxes[:, 2:] - boxes[:, :2]
    return out


def _coco_dataset(
    detections: Sequence[ImageDetections], targets: Sequence[ImageTargets], nc: int
) -> tuple[list[dict], list[dict], list[dict]]:
    """COCO's ``images``, ground-truth and detection annotation lists for
    :func:`coco_metrics` (image ids from 1, category ids ``class + 1``, boxes as xywh).

    Raises:
        ValueError: a class id outside ``[0, nc)``.
    """
    images: list[dict] = []
    gt_anns: list[dict] = []
    dt_anns: list[dict] = []
    for img_id, (det, tgt) in enumerate(zip(detections, targets, strict=True), start=1):
        gt_boxes, gt_cls = _np(tgt.boxes, (0, 4)), _np(tgt.classes, (0,)).astype(np.int64)
        dt_boxes, dt_cls = _np(det.boxes, (0, 4)), _np(det.classes, (0,)).astype(np.int64)
        scores = _np(det.scores, (0,))
        for name, cls in (("ground-truth", gt_cls), ("detection", dt_cls)):
            if cls.size and (cls.min() < 0 or cls.max() >= nc):
                raise ValueError(f"image {img_id - 1}: {name} class id outside [0, {nc})")
        width = int(tgt.width) or int(math.ceil(max(gt_boxes[:, 2].max(initial=1), 1)))
        height = int(tgt.height) or int(math.ceil(max(gt_boxes[:, 3].max(initial=1), 1)))
        images.append({"id": img_id, "width": width, "height": height})
        crowd = (np.zeros(len(gt_cls), bool) if tgt.crowd is None
                 else _np(tgt.crowd, (0,)).astype(bool))
        for box, c, cr in zip(_xywh(gt_boxes), gt_cls, crowd, strict=True):
            gt_anns.append({
                "id": len(gt_anns) + 1, "image_id": img_id, "category_id": int(c) + 1,
                "bbox": box.tolist(), "area": float(box[2] * box[3]), "iscrowd": int(cr),
            })
        for box, c, s in zip(_xywh(dt_boxes), dt_cls, scores, strict=True):
            dt_anns.append({
                "id": len(dt_anns) + 1, "image_id": img_id, "category_id": int(c) + 1,
                "bbox": box.tolist(), "score": float(s), "area": float(box[2] * box[3]),
            })
    return images, gt_anns, dt_anns


def coco_metrics(
    detections: Sequence[ImageDetections],
    targets: Sequence[ImageTargets],
    nc: int,
    max_det: int = 100,
    detail: bool = False,
) -> dict[str, Any]:
    """Score detections against ground truth with COCO's bbox protocol.

    Args:
        detections: one entry per image, same order as ``targets``.
        targets: one entry per image (an image without objects has M = 0).
        nc: number of classes; class ids must lie in ``[0, nc)``.
        max_det: detections per image COCO considers (COCO uses 100).
        detail: also return ``"detail"`` (what the validation report draws, below).

    Returns:
        ``{"mAP50-95", "mAP50", "precision", "recall"}`` as floats in [0, 1] and
        ``"per_class_AP"``: ``{class_id: AP50-95}`` for the classes present in the ground
        truth. With no ground-truth box at all every metric is 0.0.

        ``precision`` and ``recall`` are the class means at the confidence of best mean F1,
        from COCO's matching at IoU 0.50 (:mod:`~libreyolo_core.eval.match`).

        With ``detail``, ``"detail"`` holds: ``per_class_AP50`` ``{class_id: AP50}``,
        ``pr50`` a (101, nc) float array: COCO's interpolated precision at IoU 0.50 on
        recall 0, 0.01, ..., 1 (-1 for a class without ground truth), ``matches``: one
        :class:`~libreyolo_core.eval.match.ImageMatch` per image (IoU 0.50), and
        ``curves``: :func:`~libreyolo_core.eval.match.confidence_curves`.

    Raises:
        ValueError: the two sequences differ in length, or a class id is outside [0, nc).
    """
    from faster_coco_eval import COCO, COCOeval_faster

    if len(detections) != len(targets):
        raise ValueError(f"{len(detections)} detection entries for {len(targets)} images")
    images, gt_anns, dt_anns = _coco_dataset(detections, targets, nc)
    zero = {"precision": 0.0, "recall": 0.0, "mAP50": 0.0, "mAP50-95": 0.0, "per_class_AP": {}}
    if not gt_anns:
        return {**zero, "detail": _empty_detail(detections, targets, nc)} if detail else zero
    categories = [{"id": c + 1, "name": str(c)} for c in range(nc)]
    quiet = contextlib.redirect_stdout(io.StringIO())
    with quiet:
        coco_gt = COCO()
        coco_gt.dataset = {"images": images, "annotations": gt_anns, "categories": categories}
        coco_gt.createIndex()
        if not dt_anns:
            out = {**zero, "per_class_AP": {int(a["category_id"]) - 1: 0.0 for a in gt_anns}}
            if detail:
                out["detail"] = _empty_detail(detections, targets, nc, gt_anns)
            return out
        coco_dt = COCO()
        coco_dt.dataset = {"images": images, "annotations": dt_anns, "categories": categories}
        coco_dt.createIndex()
        ev = COCOeval_faster(coco_gt, coco_dt, iouType="bbox", print_function=lambda *a, **k: None)
        ev.params.maxDets = [1, 10, max_det]
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    # precision: [T IoU thresholds, R recall points, K classes, A areas, M max-dets]
    prec = ev.eval["precision"][:, :, :, 0, -1]
    present = sorted({a["category_id"] for a in gt_anns})
    per_class = {}
    for cat in present:
        p = prec[:, :, cat - 1]
        valid = p[p > -1]
        per_class[cat - 1] = float(valid.mean()) if valid.size else 0.0
    matches = match_all(detections, targets, 0.5, max_det)
    curves = confidence_curves(detections, targets, matches, nc)
    present0 = curves["classes"]
    out = {
        "precision": float(curves["p_best"][present0].mean()) if len(present0) else 0.0,
        "recall": float(curves["r_best"][present0].mean()) if len(present0) else 0.0,
        "mAP50": max(float(ev.stats[1]), 0.0),
        "mAP50-95": max(float(ev.stats[0]), 0.0),
        "per_class_AP": per_class,
    }
    if detail:
        pr50 = np.full((101, nc), -1.0)
        ap50 = {}
        for cat in present:
            p = prec[0, :, cat - 1]
            pr50[:, cat - 1] = np.maximum(p, 0.0)
            ap50[cat - 1] = float(p[p > -1].mean()) if (p > -1).any() else 0.0
        out["detail"] = {"per_class_AP50": ap50, "pr50": pr50, "matches": matches, "curves": curves}
    return out


def _empty_detail(detections: Sequence[ImageDetections], targets: Sequence[ImageTargets], nc: int,
                  gt_anns: list[dict] | None = None) -> dict[str, Any]:
    """The ``detail`` of a run without a detection or without ground truth."""
    present = sorted({int(a["category_id"]) - 1 for a in gt_anns or []})
    pr50 = np.full((101, nc), -1.0)
    pr50[:, present] = 0.0
    matches = match_all(detections, targets)
    return {"per_class_AP50": dict.fromkeys(present, 0.0), "pr50": pr50, "matches": matches,
            "curves": confidence_curves(detections, targets, matches, nc)}


def _split(flat: np.ndarray, counts: list[int]) -> list[np.ndarray]:
    return np.split(flat, np.cumsum(counts)[:-1]) if counts else []


