"""The validation report: what the model learned, per class, as a table, curves, a
confusion matrix, pictures of its detections and a COCO results file.

:func:`write_report` writes, under ``<run_dir>/val/``::

    report.json            everything below as data (layout in :func:`build_report`)
    predictions.json       COCO results format: [{image_id, category_id, bbox, score}]
    ground_truth.json      the same images' ground truth in COCO format (to re-score
                           predictions.json with pycocotools or any COCO tool)
    PR_curve.png           precision against recall per class and mean (IoU 0.50)
    F1_curve.png, P_curve.png, R_curve.png   against confidence; best-F1 marked
    confusion_matrix.png, confusion_matrix_normalized.png
    labels.png             training-set label statistics (when the train labels are given)
    detections/NNN_<stem>.jpg   the first N images: ground truth | predictions

Image ids in the COCO files are the file stem when it is a number (COCO's own names,
``000000000009.jpg`` -> 9), else the 1-based position; category ids are the class ids.

numpy only at import; matplotlib and Pillow are imported by
:mod:`~libreyolo_core.eval.plots` when the pictures are drawn.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from libreyolo_core.eval.coco import ImageDetections, ImageTargets

__all__ = ["build_report", "write_report", "format_table", "confusion_matrix", "coco_results",
           "REPORT_VERSION", "CONFUSION_CONF", "CONFUSION_IOU"]

log = logging.getLogger(__name__)

REPORT_VERSION = 1
#: The confusion matrix's detection score threshold and class-agnostic match IoU
#: (Ultralytics' defaults).
CONFUSION_CONF = 0.25
CONFUSION_IOU = 0.45


def _r(x: Any, nd: int = 4) -> Any:
    """Rounded floats (lists of them too) for a compact JSON file."""
    arr = np.asarray(x, dtype=np.float64)
    return np.round(arr, nd).tolist() if arr.ndim else round(float(arr), nd)


def confusion_matrix(detections: Sequence[ImageDetections], targets: Sequence[ImageTargets], nc: int,
                     conf: float = CONFUSION_CONF, iou: float = CONFUSION_IOU) -> np.ndarray:
    """(nc + 1, nc + 1) counts: row = true class, column = predicted class; the last row
    and column are background (a false positive sits in the last row, a missed box in the
    last column).

    Detections with score >= ``conf`` are matched to ground truth class-agnostically: the
    pairs of IoU > ``iou`` in descending IoU, each box at most once (Ultralytics'
    ``ConfusionMatrix.process_batch``).
    """
    from libreyolo_core.eval.match import _iou

    m = np.zeros((nc + 1, nc + 1), np.int64)
    for det, tgt in zip(detections, targets, strict=True):
        keep = np.asarray(det.scores).reshape(-1) >= conf
        db = np.asarray(det.boxes, np.float64).reshape(-1, 4)[keep]
        dc = np.asarray(det.classes).astype(np.int64).reshape(-1)[keep]
        gb = np.asarray(tgt.boxes, np.float64).reshape(-1, 4)
        gc = np.asarray(tgt.classes).astype(np.int64).reshape(-1)
        ious = _iou(db, gb, np.zeros(len(gc), bool))
        d_used, g_used = np.zeros(len(dc), bool), np.zeros(len(gc), bool)
        di, gi = np.nonzero(ious > iou)
        for k in np.argsort(-ious[di, gi], kind="mergesort"):
            a, b = di[k], gi[k]
            if d_used[a] or g_used[b]:
                continue
            d_used[a] = g_used[b] = True
            m[gc[b], dc[a]] += 1
        m[:, nc] += np.bincount(gc[~g_used], minlength=nc + 1)[: nc + 1]
        m[nc, :] += np.bincount(dc[~d_used], minlength=nc + 1)[: nc + 1]
    return m


def _image_id(path: str, index: int) -> int | str:
    stem = Path(path).stem
    return int(stem) if stem.isdigit() else index + 1


def coco_results(detections: Sequence[ImageDetections], paths: Sequence[str]) -> list[dict[str, Any]]:
    """Detections in COCO results format: ``bbox`` is [x, y, width, height] pixels of the
    original image, ``category_id`` the class id (see the module for image ids)."""
    out = []
    for i, (det, path) in enumerate(zip(detections, paths, strict=True)):
        img = _image_id(path, i)
        for b, s, c in zip(np.asarray(det.boxes, np.float64).reshape(-1, 4), np.asarray(det.scores).reshape(-1),
                           np.asarray(det.classes).reshape(-1), strict=True):
            out.append({"image_id": img, "category_id": int(c),
                        "bbox": [round(float(b[0]), 3), round(float(b[1]), 3), round(float(b[2] - b[0]), 3),
                                 round(float(b[3] - b[1]), 3)], "score": round(float(s), 5)})
    return out


def coco_ground_truth(targets: Sequence[ImageTargets], paths: Sequence[str],
                      names: dict[int, str]) -> dict[str, Any]:
    """The ground truth in COCO's instances format, ids as :func:`coco_results`."""
    images: list[dict[str, Any]] = []
    anns: list[dict[str, Any]] = []
    for i, (tgt, path) in enumerate(zip(targets, paths, strict=True)):
        img = _image_id(path, i)
        images.append({"id": img, "file_name": Path(path).name, "width": int(tgt.width), "height": int(tgt.height)})
        for b, c in zip(np.asarray(tgt.boxes, np.float64).reshape(-1, 4), np.asarray(tgt.classes).reshape(-1),
                        strict=True):
            w, h = float(b[2] - b[0]), float(b[3] - b[1])
            anns.append({"id": len(anns) + 1, "image_id": img, "category_id": int(c),
                         "bbox": [float(b[0]), float(b[1]), w, h], "area": w * h, "iscrowd": 0})
    return {"images": images, "annotations": anns,
            "categories": [{"id": int(k), "name": str(v)} for k, v in sorted(names.items())]}


def build_report(pass_: Any, names: dict[int, str], plot_images: int = 16,
                 meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report's data from one validation pass.

    Args:
        pass_: a :class:`~libreyolo_core.eval.validate.ValPredictions` (detections,
            targets, paths, ``metrics`` with ``detail``).
        names: class id -> name.
        plot_images: how many images :func:`write_report` draws (recorded here).
        meta: extra top-level keys (``epoch``, ``model``, ``imgsz``, ``split`` ...).

    Returns the ``report.json`` object::

        version         1
        metrics         {precision, recall, mAP50, mAP50-95}: the "all" row
        table           rows {class, id, images, instances, precision, recall, mAP50,
                        mAP50-95, no_instances}: "all" first (id null), then every class
                        in id order; a class without ground truth has no_instances true
                        and null metrics
        pr_curve        {"recall": [101 floats 0..1], "precision": {name: [101 floats]}
                        per class with instances, "mean": [101], "mAP50": float}:
                        COCO's interpolated precision at IoU 0.50
        confidence_curves {"conf": [101], "precision"|"recall"|"f1": {name: [101]},
                        "mean": {"precision", "recall", "f1": [101]}, "best_conf",
                        "best_f1"}: against the score threshold; P/R of the table are
                        at best_conf
        confusion_matrix {"conf", "iou", "labels": names + "background", "rows": "true",
                        "columns": "predicted", "counts": [[int]], "normalized": [[float]]
                        (each row divided by its sum)}
        images          the drawn pictures: {file, source, classes, tp, fp, fn,
                        fp_classes, fn_classes} at confusion_matrix.conf (filled by
                        :func:`write_report`)
        files           {name: file under val/} of the plots and COCO files
        plot_images, and the keys of ``meta``
    """
    metrics = pass_.metrics
    detail = metrics["detail"]
    nc = len(names)
    curves = detail["curves"]
    best = curves["best_index"]
    n_gt = curves["n_gt"]
    img_count = np.zeros(nc, np.int64)
    for tgt in pass_.targets:
        cls = np.unique(np.asarray(tgt.classes).astype(np.int64))
        img_count[cls[cls < nc]] += 1
    rows = [{"class": "all", "id": None, "images": len(pass_.targets), "instances": int(n_gt.sum()),
             "precision": _r(metrics["precision"]), "recall": _r(metrics["recall"]),
             "mAP50": _r(metrics["mAP50"]), "mAP50-95": _r(metrics["mAP50-95"]), "no_instances": False}]
    ap, ap50 = metrics.get("per_class_AP", {}), detail["per_class_AP50"]
    for c in range(nc):
        has = bool(n_gt[c])
        rows.append({"class": names.get(c, str(c)), "id": c, "images": int(img_count[c]),
                     "instances": int(n_gt[c]),
                     "precision": _r(curves["p_best"][c]) if has else None,
                     "recall": _r(curves["r_best"][c]) if has else None,
                     "mAP50": _r(ap50.get(c, 0.0)) if has else None,
                     "mAP50-95": _r(ap.get(c, 0.0)) if has else None, "no_instances": not has})
    present = [int(c) for c in curves["classes"]]
    pr50 = detail["pr50"]
    mean_pr = pr50[:, present].mean(1) if present else np.zeros(101)
    cls_name = {c: names.get(c, str(c)) for c in range(nc)}
    pick = lambda a: {cls_name[c]: _r(a[c]) for c in present}  # noqa: E731
    mean = lambda a: _r(a[present].mean(0) if present else np.zeros(a.shape[1]))  # noqa: E731
    mean_f1 = curves["f1"][present].mean(0) if present else np.zeros(101)
    cm = confusion_matrix(pass_.detections, pass_.targets, nc)
    with np.errstate(divide="ignore", invalid="ignore"):
        norm = np.where(cm.sum(1, keepdims=True) > 0, cm / np.maximum(cm.sum(1, keepdims=True), 1), 0.0)
    return {
        "version": REPORT_VERSION,
        **(meta or {}),
        "names": {str(k): v for k, v in sorted(names.items())},
        "metrics": {k: _r(metrics[k]) for k in ("precision", "recall", "mAP50", "mAP50-95")},
        "table": rows,
        "pr_curve": {"recall": _r(np.linspace(0, 1, 101)), "precision": {cls_name[c]: _r(pr50[:, c]) for c in present},
                     "mean": _r(mean_pr), "mAP50": _r(metrics["mAP50"])},
        "confidence_curves": {"conf": _r(curves["conf"]), "precision": pick(curves["precision"]),
                              "recall": pick(curves["recall"]), "f1": pick(curves["f1"]),
                              "mean": {"precision": mean(curves["precision"]), "recall": mean(curves["recall"]),
                                       "f1": _r(mean_f1)},
                              "best_conf": _r(curves["best_conf"]), "best_f1": _r(mean_f1[best])},
        "confusion_matrix": {"conf": CONFUSION_CONF, "iou": CONFUSION_IOU,
                             "labels": [cls_name[c] for c in range(nc)] + ["background"],
                             "rows": "true", "columns": "predicted", "counts": cm.tolist(),
                             "normalized": _r(norm, 3)},
        "images": [],
        "plot_images": int(plot_images),
        "files": {},
    }


def format_table(report: dict[str, Any]) -> str:
    """The per-class table as text (Ultralytics' layout); classes without instances say so."""
    width = max([len(r["class"]) for r in report["table"]] + [5]) + 2
    head = f"{'Class':>{width}} {'Images':>8} {'Instances':>10} {'P':>7} {'R':>7} {'mAP50':>7} {'mAP50-95':>9}"
    lines = [head]
    for r in report["table"]:
        if r["no_instances"]:
            lines.append(f"{r['class']:>{width}} {r['images']:>8} {0:>10}   (no instances in this split)")
            continue
        lines.append(f"{r['class']:>{width}} {r['images']:>8} {r['instances']:>10} {r['precision']:>7.3f} "
                     f"{r['recall']:>7.3f} {r['mAP50']:>7.3f} {r['mAP50-95']:>9.3f}")
    return "\n".join(lines)


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, separators=(",", ":")), encoding="utf-8")
    os.replace(tmp, path)


def write_report(out_dir: str | os.PathLike[str], pass_: Any, names: dict[int, str], plot_images: int = 16,
                 train_labels: Sequence[np.ndarray] | None = None, meta: dict[str, Any] | None = None,
                 plots: bool = True) -> dict[str, Any]:
    """Write the report of ``pass_`` under ``out_dir`` (the run's ``val/``; files in the
    module docstring) and return ``report.json``'s object (:func:`build_report`).

    Args:
        train_labels: the training set's label arrays ((n, 5) ``[cls, cx, cy, w, h]``
            normalised), for ``labels.png``; None skips that picture.
        plots: False writes only the JSON files (no matplotlib, no pictures).
    """
    t0 = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = build_report(pass_, names, plot_images, meta)
    _write_json(out / "predictions.json", coco_results(pass_.detections, pass_.paths))
    _write_json(out / "ground_truth.json", coco_ground_truth(pass_.targets, pass_.paths, names))
    files = {"report": "report.json", "predictions": "predictions.json", "ground_truth": "ground_truth.json"}
    timing = {"data_s": round(time.perf_counter() - t0, 3)}
    if plots:
        from libreyolo_core.eval import plots as P

        t1 = time.perf_counter()
        files.update(P.plot_curves(report, out))
        files.update(P.plot_confusion(report, out))
        if train_labels is not None:
            files["labels"] = P.plot_labels(train_labels, names, out / "labels.png")
        timing["plots_s"] = round(time.perf_counter() - t1, 3)
        t2 = time.perf_counter()
        report["images"] = P.draw_detections(pass_, names, out / "detections", plot_images, CONFUSION_CONF)
        timing["images_s"] = round(time.perf_counter() - t2, 3)
    report["files"] = files
    timing["total_s"] = round(time.perf_counter() - t0, 3)
    report["timing"] = timing
    _write_json(out / "report.json", report)
    return report
