"""YOLOX family (sizes n, t, s): network, SimOTA loss and pre/post-processing.

Family protocol used by the engine (docs/architecture.md, "Models"):
``build_model(size, nc)``, ``build_loss(model, cfg)``, ``preprocess(images)``,
``postprocess(outputs, conf, iou, max_det)``, ``on_mosaic_disable(model, loss)`` and
``SIZES``.

Source: Ge et al., "YOLOX: Exceeding YOLO Series in 2021" (arXiv 2107.08430) and the
reference implementation (Megvii-BaseDetection/YOLOX); reference spec F.2, F.3.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from libreyolo_core.models.postprocess import postprocess_yolo9
from libreyolo_core.models.yolox.loss import SimOTAAssigner, YOLOXLoss, box_iou_cxcywh
from libreyolo_core.models.yolox.nn import CONFIGS, YOLOX, YOLOXConfig

__all__ = [
    "SIZES",
    "CONFIGS",
    "YOLOX",
    "YOLOXConfig",
    "YOLOXLoss",
    "SimOTAAssigner",
    "box_iou_cxcywh",
    "build_model",
    "arch_from_state",
    "class_tensors",
    "build_loss",
    "preprocess",
    "postprocess",
    "on_mosaic_disable",
]

SIZES = ("n", "t", "s")


def build_model(size: str, nc: int) -> YOLOX:
    """A freshly initialised YOLOX of ``size`` (``"n"``, ``"t"`` or ``"s"``) with ``nc`` classes.

    Raises:
        ValueError: unknown size or ``nc < 1``.
    """
    if size not in CONFIGS:
        raise ValueError(f"unknown YOLOX size {size!r}; choose one of {', '.join(SIZES)}")
    return YOLOX(CONFIGS[size], nc=int(nc))


def arch_from_state(state: dict[str, Tensor]) -> dict[str, Any]:
    """The ``build_model`` keywords a state dict was built with: none (YOLOX's widths do not
    depend on the class count)."""
    return {}


def class_tensors(state_names: list[str]) -> list[str]:
    """Names of the tensors whose shape depends on the class count (``head.cls_preds``)."""
    return [k for k in state_names if k.startswith("head.cls_preds.")]


def build_loss(model: nn.Module, cfg: Any = None) -> YOLOXLoss:
    """The YOLOX loss for ``model`` (L1 term off until :func:`on_mosaic_disable`).

    ``cfg`` may carry an optional ``iou_gain`` attribute (default 5.0); anything else in it
    is ignored.
    """
    kwargs = {}
    if getattr(cfg, "iou_gain", None) is not None:
        kwargs["iou_gain"] = float(cfg.iou_gain)
    loss = YOLOXLoss(model, **kwargs)
    try:
        device = next(model.parameters()).device
    except StopIteration:
        device = torch.device("cpu")
    return loss.to(device)


def preprocess(images: Tensor) -> Tensor:
    """``uint8 (B, 3, H, W)`` RGB -> ``float32`` **BGR in 0-255** (YOLOX's input
    convention, reference F.2) on the same device.

    Raises:
        ValueError: not a 4-D tensor with 3 channels.
    """
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be (B, 3, H, W), got {tuple(images.shape)}")
    return images.flip(1).to(torch.float32)


def postprocess(
    outputs: Tensor | tuple[Tensor, Any],
    conf: float = 0.25,
    iou: float = 0.45,
    max_det: int = 300,
) -> list[Tensor]:
    """Eval-mode model outputs -> per-image ``(n, 6)`` ``[x1, y1, x2, y2, score, cls]``.

    ``outputs`` is the ``(decoded, maps)`` tuple of an ``eval()`` forward (or just
    ``decoded (B, 5 + nc, A)``: ``xyxy``, objectness, class probabilities). Score = obj x
    class probability of each anchor's **best** class (YOLOX, reference F.3), kept when
    above ``conf``; then class-wise NMS and the ``max_det`` cap. Boxes stay in input
    pixels (use :func:`libreyolo_core.models.postprocess.scale_boxes` to map them back).

    Raises:
        ValueError: ``decoded`` is not ``(B, 5 + nc, A)`` or ``max_det < 1``.
    """
    decoded = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
    if decoded.ndim != 3 or decoded.shape[1] <= 5:
        raise ValueError(f"decoded must be (B, 5 + nc, A), got {tuple(decoded.shape)}")
    scored = torch.cat((decoded[:, :4], decoded[:, 4:5] * decoded[:, 5:]), 1)
    return postprocess_yolo9(scored, conf=conf, iou=iou, max_det=max_det, multi_label=False)


def on_mosaic_disable(model: nn.Module, loss: YOLOXLoss) -> bool:
    """Turn the L1 regression term on when mosaic closes (YOLOX recipe, reference F.2).

    The loss's computation changes, so the trainer announces a ``captured_region_changed``
    event (a captured CUDA graph of forward + loss must be re-captured).

    Returns:
        True (the captured region changed).
    """
    loss.use_l1 = True
    return True
