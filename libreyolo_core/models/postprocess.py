"""Detection post-processing: score selection, NMS and the letterbox inverse.

Shared by every family: a family's ``postprocess`` turns its raw outputs into per-class
scores and calls :func:`select_detections` (score selection, candidate cap, class-wise
NMS with ``torchvision.ops.batched_nms``). Multi-label selection (every anchor x class
pair above the threshold) is YOLOv9's; best-class selection is YOLOX's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchvision.ops import batched_nms

__all__ = [
    "MAX_NMS_CANDIDATES",
    "select_detections",
    "nms_detections",
    "scale_boxes",
    "scale_detections",
]

MAX_NMS_CANDIDATES = 30000


def nms_detections(
    boxes: Tensor, scores: Tensor, classes: Tensor, iou: float, max_det: int
) -> Tensor:
    """Class-wise NMS on one image's candidates.

    Args:
        boxes: ``(n, 4)`` ``xyxy``; any float dtype (computed in float32).
        scores: ``(n,)`` confidences.
        classes: ``(n,)`` class ids.
        iou: IoU threshold in [0, 1]; a box is suppressed by a higher-scoring box of the same
            class overlapping it by more than this.
        max_det: at most this many rows are returned.

    Returns:
        ``(k, 6)`` float32 ``[x1, y1, x2, y2, score, cls]`` sorted by descending score;
        rows with a non-finite box or score are dropped first.
    """
    boxes, scores = boxes.float(), scores.float()
    finite = torch.isfinite(boxes).all(1) & torch.isfinite(scores)
    boxes, scores, classes = boxes[finite], scores[finite], classes[finite]
    # translate to non-negative coordinates: IoU is unchanged and batched_nms' per-class
    # offset trick assumes boxes >= 0
    shifted = boxes - boxes.amin() if boxes.numel() else boxes
    keep = batched_nms(shifted, scores, classes, iou)[:max_det]
    return torch.cat((boxes[keep], scores[keep, None], classes[keep, None].float()), 1)


def select_detections(
    decoded: Tensor,
    conf: float = 0.25,
    iou: float = 0.45,
    max_det: int = 300,
    multi_label: bool = True,
) -> list[Tensor]:
    """Turn per-class scored boxes into per-image detections (any family).

    Args:
        decoded: ``(B, 4 + nc, A)``: ``xyxy`` (input pixels) then per-class scores in [0, 1].
        conf: keep (anchor, class) pairs with score strictly above this.
        iou: class-wise NMS IoU threshold.
        max_det: maximum detections per image (>= 1).
        multi_label: every class above ``conf`` per anchor (YOLOv9) when True,
            otherwise only each anchor's best class (YOLOX).

    Returns:
        ``B`` tensors ``(n, 6)`` float32 ``[x1, y1, x2, y2, score, cls]`` in input pixels,
        sorted by score. Before NMS at most ``max(max_det, 30000)`` candidates (highest
        scores) are kept per image.

    Raises:
        ValueError: ``decoded`` is not 3-D with more than 4 channels, or ``max_det < 1``.
    """
    if decoded.ndim != 3 or decoded.shape[1] <= 4:
        raise ValueError(f"decoded must be (B, 4 + nc, A), got {tuple(decoded.shape)}")
    if max_det < 1:
        raise ValueError(f"max_det must be >= 1, got {max_det}")
    cap = max(max_det, MAX_NMS_CANDIDATES)
    out = []
    for pred in decoded.transpose(1, 2):  # (A, 4 + nc) per image
        boxes, scores = pred[:, :4], pred[:, 4:]
        if multi_label:
            anchor, cls = (scores > conf).nonzero(as_tuple=True)
            score = scores[anchor, cls]
        else:
            score, cls = scores.max(1)
            anchor = (score > conf).nonzero(as_tuple=True)[0]
            score, cls = score[anchor], cls[anchor]
        if score.numel() > cap:
            score, top = score.topk(cap)
            anchor, cls = anchor[top], cls[top]
        out.append(nms_detections(boxes[anchor], score, cls, iou, max_det))
    return out


def scale_boxes(
    boxes: Tensor,
    ratio: float | Sequence[float],
    pad: Sequence[float],
    orig_shape: Sequence[int],
) -> Tensor:
    """Map ``xyxy`` boxes from a letterboxed canvas back to the original image.

    Inverse of ``canvas = resize(image, ratio) placed at (left, top) = pad``: subtracts
    the pad, divides by the ratio and clips to the image.

    Args:
        boxes: ``(..., 4)`` ``xyxy`` in canvas pixels.
        ratio: resize factor (scalar, or ``(rw, rh)``).
        pad: ``(left, top)`` offset of the resized image on the canvas (pixels).
        orig_shape: ``(h, w)`` of the original image.

    Returns:
        a new tensor of the same shape, in original-image pixels, clipped to
        ``[0, w] x [0, h]``.
    """
    rw, rh = (ratio, ratio) if isinstance(ratio, (int, float)) else (ratio[0], ratio[1])
    h, w = orig_shape[0], orig_shape[1]
    out = boxes.clone()
    out[..., 0::2] = ((out[..., 0::2] - pad[0]) / rw).clamp(0, w)
    out[..., 1::2] = ((out[..., 1::2] - pad[1]) / rh).clamp(0, h)
    return out


def scale_detections(
    dets: Tensor,
    ratio: float | Sequence[float],
    pad: Sequence[float],
    orig_shape: Sequence[int],
) -> Tensor:
    """:func:`scale_boxes` on ``(n, 6)`` detections, dropping boxes of zero area after clipping."""
    out = dets.clone()
    out[:, :4] = scale_boxes(dets[:, :4], ratio, pad, orig_shape)
    keep = (out[:, 2] > out[:, 0]) & (out[:, 3] > out[:, 1])
    return out[keep]
