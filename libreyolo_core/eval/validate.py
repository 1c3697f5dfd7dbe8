"""Validation pass: decode + NMS on a letterboxed loader, boxes mapped back to the original
images, then COCO metrics (:mod:`libreyolo_core.eval.coco`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from libreyolo_core.eval.coco import ImageDetections, ImageTargets, coco_metrics
from libreyolo_core.models.postprocess import scale_boxes

__all__ = ["validate", "ValPredictions"]


@dataclass
class ValPredictions:
    """What one validation pass saw, in original-image pixels (the report's input).

    Attributes:
        detections / targets: one entry per image, loader order.
        paths: the image files, same order.
        metrics: the ``coco_metrics(..., detail=True)`` output of the pass.
    """

    detections: list[ImageDetections] = field(default_factory=list)
    targets: list[ImageTargets] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)


@torch.no_grad()
def validate(
    net: nn.Module,
    family: Any,
    loader,
    device: torch.device,
    nc: int,
    conf: float = 0.001,
    iou: float = 0.7,
    max_det: int = 300,
    amp=None,
    on_batch: Callable[[int, int], None] | None = None,
    keep: ValPredictions | None = None,
) -> dict[str, Any]:
    """Evaluate ``net`` on every batch of ``loader`` (no augmentation).

    Args:
        net: the network (put in eval mode here; the caller restores train mode).
        family: the model's :class:`~libreyolo_core.models.family.Family` (``preprocess``,
            ``postprocess``).
        loader: yields ``Batch`` (uint8 images, targets (N, 6) canvas pixels, metas with
            ``ratio``, ``pad`` and ``orig_shape``).
        nc: number of classes.
        conf, iou, max_det: score threshold, NMS IoU, detections kept per image.
        amp: an ``AmpPolicy`` whose autocast wraps the forward pass (optional).
        on_batch: called as ``on_batch(k, n)`` after batch ``k`` of ``n`` (1-based), for
            progress reports.
        keep: when given, filled with the pass's predictions, targets, image paths and
            detailed metrics (for :mod:`~libreyolo_core.eval.report`).

    Returns:
        ``coco_metrics`` output: ``mAP50-95``, ``mAP50``, ``precision``, ``recall``,
        ``per_class_AP``; boxes are scored in original-image pixels.
    """
    net.eval()
    detections: list[ImageDetections] = []
    targets: list[ImageTargets] = []
    paths: list[str] = []
    n = len(loader)
    for k, batch in enumerate(loader, 1):
        imgs = family.preprocess(batch.images.to(device, non_blocking=True))
        if amp is not None:
            with amp.autocast():
                outputs = net(imgs)
        else:
            outputs = net(imgs)
        preds = family.postprocess(outputs, conf=conf, iou=iou, max_det=max_det)
        tgt = batch.targets
        for j, (pred, meta) in enumerate(zip(preds, batch.metas, strict=True)):
            pred = pred.float().cpu()
            h0, w0 = meta["orig_shape"]
            boxes = scale_boxes(pred[:, :4].clone(), meta["ratio"], meta["pad"], (h0, w0))
            detections.append(ImageDetections(boxes, pred[:, 4], pred[:, 5].long()))
            rows = tgt[tgt[:, 0] == j]
            gt = scale_boxes(rows[:, 2:6].clone().float(), meta["ratio"], meta["pad"], (h0, w0))
            targets.append(ImageTargets(gt, rows[:, 1].long(), int(w0), int(h0)))
            paths.append(str(meta.get("path", "")))
        if on_batch is not None:
            on_batch(k, n)
    if keep is None:
        return coco_metrics(detections, targets, nc, max_det=min(max_det, 100))
    as_np = [ImageDetections(d.boxes.numpy(), d.scores.numpy(), d.classes.numpy()) for d in detections]
    tg_np = [ImageTargets(t.boxes.numpy(), t.classes.numpy(), t.width, t.height) for t in targets]
    metrics = coco_metrics(as_np, tg_np, nc, max_det=min(max_det, 100), detail=True)
    keep.detections, keep.targets, keep.paths, keep.metrics = as_np, tg_np, paths, metrics
    return {k: v for k, v in metrics.items() if k != "detail"}
