"""COCO's matching of detections to ground truth at one IoU threshold, and the
precision / recall / F1 curves against confidence built from it.

The matching is a port of ``COCOeval.evaluateImg`` (pycocotools, cocoapi
PythonAPI/pycocotools/cocoeval.py) for the ``all`` area range: per image and class,
detections in descending score order (the first ``max_det``) each take the unmatched
ground-truth box of highest IoU >= the threshold, non-crowd boxes before crowd boxes; a
detection matched to a crowd box is ignored (neither TP nor FP), and a crowd box may be
matched many times. IoU against a crowd box is intersection over the detection's area
(``maskUtils.iou`` with ``iscrowd``).

numpy only (no torch): the validation report and the service can use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ImageMatch", "match_image", "match_all", "confidence_curves", "CONF_GRID"]

#: Confidence thresholds of the P / R / F1 curves: 0, 0.01, ..., 1.
CONF_GRID = np.linspace(0.0, 1.0, 101)


@dataclass
class ImageMatch:
    """One image's matching.

    Attributes:
        dt_state: (N,) int8 per detection: 1 true positive, 0 false positive, -1 ignored
            (matched to a crowd box, or beyond ``max_det`` of its class).
        gt_score: (M,) float64 per ground-truth box: the score of the detection matched to
            it (0.0 when none: a false negative at any confidence; ``inf`` for crowd boxes,
            which are never false negatives).
        gt_match: (M,) int64 the index of the detection matched to each box (-1 when none).
    """

    dt_state: np.ndarray
    gt_score: np.ndarray
    gt_match: np.ndarray


def _iou(dt: np.ndarray, gt: np.ndarray, crowd: np.ndarray) -> np.ndarray:
    """(N, M) IoU of xyxy boxes; for a crowd column, intersection / detection area."""
    if not len(dt) or not len(gt):
        return np.zeros((len(dt), len(gt)))
    lt = np.maximum(dt[:, None, :2], gt[None, :, :2])
    rb = np.minimum(dt[:, None, 2:], gt[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(2)
    area_d = ((dt[:, 2] - dt[:, 0]) * (dt[:, 3] - dt[:, 1]))[:, None]
    area_g = ((gt[:, 2] - gt[:, 0]) * (gt[:, 3] - gt[:, 1]))[None, :]
    union = np.where(crowd[None, :], area_d, area_d + area_g - inter)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(union > 0, inter / union, 0.0)


def match_image(dt_boxes: np.ndarray, dt_scores: np.ndarray, dt_cls: np.ndarray, gt_boxes: np.ndarray,
                gt_cls: np.ndarray, gt_crowd: np.ndarray | None = None, iou_thr: float = 0.5,
                max_det: int = 100) -> ImageMatch:
    """Match one image's detections to its ground truth, class by class (see the module).

    Args:
        dt_boxes: (N, 4) xyxy; dt_scores: (N,); dt_cls: (N,) int.
        gt_boxes: (M, 4) xyxy; gt_cls: (M,) int; gt_crowd: (M,) bool or None.
        iou_thr: the IoU a match needs. max_det: detections per class considered.
    """
    n, m = len(dt_scores), len(gt_cls)
    crowd = np.zeros(m, bool) if gt_crowd is None else np.asarray(gt_crowd, bool)
    state = np.zeros(n, np.int8)
    gt_score = np.where(crowd, np.inf, 0.0)
    gt_match = np.full(m, -1, np.int64)
    for c in np.unique(np.concatenate([dt_cls, gt_cls]).astype(np.int64)):
        d_idx = np.flatnonzero(dt_cls == c)
        d_idx = d_idx[np.argsort(-dt_scores[d_idx], kind="mergesort")]
        state[d_idx[max_det:]] = -1
        d_idx = d_idx[:max_det]
        g_idx = np.flatnonzero(gt_cls == c)
        g_idx = g_idx[np.argsort(crowd[g_idx], kind="mergesort")]  # non-crowd first
        if not len(d_idx) or not len(g_idx):
            continue
        g_crowd = crowd[g_idx]
        ious = _iou(dt_boxes[d_idx], gt_boxes[g_idx], g_crowd)
        taken = np.zeros(len(g_idx), bool)
        for di in range(len(d_idx)):
            best, mi = min(iou_thr, 1 - 1e-10), -1
            for gi in range(len(g_idx)):
                if taken[gi] and not g_crowd[gi]:
                    continue
                if mi > -1 and not g_crowd[mi] and g_crowd[gi]:
                    break
                if ious[di, gi] < best:
                    continue
                best, mi = ious[di, gi], gi
            if mi == -1:
                continue
            taken[mi] = True
            if g_crowd[mi]:
                state[d_idx[di]] = -1
            else:
                state[d_idx[di]] = 1
                gt_score[g_idx[mi]] = dt_scores[d_idx[di]]
                gt_match[g_idx[mi]] = d_idx[di]
    return ImageMatch(state, gt_score, gt_match)


def match_all(detections: Sequence[Any], targets: Sequence[Any], iou_thr: float = 0.5,
              max_det: int = 100) -> list[ImageMatch]:
    """:func:`match_image` over ``ImageDetections`` / ``ImageTargets`` pairs (numpy arrays)."""
    out = []
    for det, tgt in zip(detections, targets, strict=True):
        crowd = None if getattr(tgt, "crowd", None) is None else np.asarray(tgt.crowd, bool)
        out.append(match_image(np.asarray(det.boxes, np.float64).reshape(-1, 4),
                               np.asarray(det.scores, np.float64).reshape(-1),
                               np.asarray(det.classes).astype(np.int64).reshape(-1),
                               np.asarray(tgt.boxes, np.float64).reshape(-1, 4),
                               np.asarray(tgt.classes).astype(np.int64).reshape(-1), crowd, iou_thr, max_det))
    return out


def confidence_curves(detections: Sequence[Any], targets: Sequence[Any], matches: Sequence[ImageMatch],
                      nc: int) -> dict[str, Any]:
    """Precision, recall and F1 of each class against the confidence threshold.

    At threshold ``c`` a class's detections with score >= ``c`` count: P = TP / (TP + FP)
    (1.0 when none is left, as Ultralytics draws it), R = TP / ground-truth boxes (crowd
    boxes excluded), F1 = 2PR / (P + R).

    Returns:
        ``conf`` (101,) the thresholds (:data:`CONF_GRID`); ``precision``, ``recall``,
        ``f1``: (nc, 101) arrays; ``classes``: the class ids with ground truth (the mean
        curves average these rows); ``best_conf``: the threshold of the highest mean F1
        (the lowest such, when tied); ``n_gt``: (nc,) ground-truth boxes per class;
        ``p_best``, ``r_best``: (nc,) P and R at ``best_conf`` (P 0.0 where the class has
        no detection left: the curve's 1.0 there is only how it is drawn).
    """
    n_gt = np.zeros(nc, np.int64)
    all_c, all_s, all_t = [], [], []
    for det, tgt, mt in zip(detections, targets, matches, strict=True):
        keep = mt.dt_state >= 0
        all_c.append(np.asarray(det.classes).astype(np.int64).reshape(-1)[keep])
        all_s.append(np.asarray(det.scores, np.float64).reshape(-1)[keep])
        all_t.append(mt.dt_state[keep].astype(np.int64))
        gcls = np.asarray(tgt.classes).astype(np.int64).reshape(-1)
        n_gt += np.bincount(gcls[np.isfinite(mt.gt_score)], minlength=nc)[:nc]
    cls = np.concatenate(all_c) if all_c else np.zeros(0, np.int64)
    sc = np.concatenate(all_s) if all_s else np.zeros(0)
    tp_flag = np.concatenate(all_t) if all_t else np.zeros(0, np.int64)
    order = np.lexsort((-sc, cls))  # by class, then descending score (stable)
    cls, sc, tp_flag = cls[order], sc[order], tp_flag[order]
    bounds = np.searchsorted(cls, np.arange(nc + 1))
    precision = np.ones((nc, len(CONF_GRID)))
    recall = np.zeros((nc, len(CONF_GRID)))
    n_det = np.zeros((nc, len(CONF_GRID)), np.int64)
    for c in range(nc):
        lo, hi = bounds[c], bounds[c + 1]
        if lo == hi:
            continue
        s, t = sc[lo:hi], tp_flag[lo:hi]
        ctp = np.concatenate([[0], np.cumsum(t)])
        k = np.searchsorted(-s, -CONF_GRID, side="right")  # detections with score >= c
        tp, n = ctp[k], k
        n_det[c] = n
        precision[c] = np.where(n > 0, tp / np.maximum(n, 1), 1.0)
        recall[c] = tp / n_gt[c] if n_gt[c] else 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        f1 = np.where(precision + recall > 0, 2 * precision * recall / (precision + recall), 0.0)
    classes = np.flatnonzero(n_gt > 0)
    mean_f1 = f1[classes].mean(0) if len(classes) else np.zeros(len(CONF_GRID))
    best = int(np.argmax(mean_f1))
    # the table's P at best_conf: 0 for a class with no detection left there (the curve's
    # 1.0 is a drawing convention, not a measured precision)
    p_best = np.where(n_det[:, best] > 0, precision[:, best], 0.0)
    return {"conf": CONF_GRID.copy(), "precision": precision, "recall": recall, "f1": f1,
            "classes": classes, "best_conf": float(CONF_GRID[best]), "best_index": best, "n_gt": n_gt,
            "p_best": p_best, "r_best": recall[:, best].copy()}
