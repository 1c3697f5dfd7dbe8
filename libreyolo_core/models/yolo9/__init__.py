"""YOLOv9 family (sizes t, s): network, loss and pre/post-processing.

Family protocol used by the engine (docs/architecture.md, "Models"):
``build_model(size, nc)``, ``build_loss(model, cfg)``, ``preprocess(images)``,
``postprocess(outputs, conf, iou, max_det)`` and ``SIZES``.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import Tensor, nn

from libreyolo_core.models.postprocess import postprocess_yolo9
from libreyolo_core.models.yolo9.loss import TaskAlignedAssigner, YOLO9Loss, pad_targets
from libreyolo_core.models.yolo9.nn import CONFIGS, YOLO9, YOLO9Config

__all__ = [
    "SIZES",
    "CONFIGS",
    "YOLO9",
    "YOLO9Config",
    "YOLO9Loss",
    "TaskAlignedAssigner",
    "pad_targets",
    "build_model",
    "arch_from_state",
    "class_tensors",
    "build_loss",
    "preprocess",
    "postprocess",
]

SIZES = ("t", "s")


def build_model(size: str, nc: int, cls_width: int | None = None) -> YOLO9:
    """A freshly initialised YOLOv9 of ``size`` (``"t"`` or ``"s"``) with ``nc`` classes.

    ``cls_width`` sets the head's class-tower width (default: from ``nc``); see
    :func:`arch_from_state`.

    Raises:
        ValueError: unknown size or ``nc < 1``.
    """
    if size not in CONFIGS:
        raise ValueError(f"unknown YOLOv9 size {size!r}; choose one of {', '.join(SIZES)}")
    return YOLO9(CONFIGS[size], nc=int(nc), cls_width=cls_width)


def arch_from_state(state: dict[str, Tensor]) -> dict[str, Any]:
    """The ``build_model`` keywords a state dict (our names) was built with: the class-tower
    width, which a model fine-tuned from COCO keeps at 80 whatever its class count."""
    tower = state.get("head.cls.0.0.conv.weight")
    return {"cls_width": int(tower.shape[0])} if tower is not None else {}


def class_tensors(state_names: list[str]) -> list[str]:
    """Names of the tensors whose shape depends on the class count (the last conv of each
    level's class tower), our names."""
    return [k for k in state_names if re.fullmatch(r"head\.cls\.\d+\.2\.(weight|bias)", k)]


def build_loss(model: nn.Module, cfg: Any = None) -> YOLO9Loss:
    """The YOLOv9 loss for ``model``.

    ``cfg`` may carry optional ``box_gain``, ``dfl_gain`` and ``cls_gain`` attributes
    (defaults 7.5, 1.5, 0.5); anything else in it is ignored.
    """
    gains = {
        k: float(getattr(cfg, f"{k}_gain"))
        for k in ("box", "dfl", "cls")
        if getattr(cfg, f"{k}_gain", None) is not None
    }
    loss = YOLO9Loss(model, **gains)
    try:
        device = next(model.parameters()).device
    except StopIteration:
        device = torch.device("cpu")
    return loss.to(device)


def preprocess(images: Tensor) -> Tensor:
    """``uint8 (B, 3, H, W)`` RGB -> ``float32`` in [0, 1] on the same device.

    Raises:
        ValueError: not a 4-D tensor with 3 channels.
    """
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be (B, 3, H, W), got {tuple(images.shape)}")
    return images.to(torch.float32).div_(255.0)


def postprocess(
    outputs: Tensor | tuple[Tensor, Any],
    conf: float = 0.25,
    iou: float = 0.45,
    max_det: int = 300,
) -> list[Tensor]:
    """Eval-mode model outputs -> per-image ``(n, 6)`` ``[x1, y1, x2, y2, score, cls]``.

    ``outputs`` is the ``(decoded, maps)`` tuple of an ``eval()`` forward (or just
    ``decoded (B, 4 + nc, A)``); boxes stay in input pixels (use
    :func:`libreyolo_core.models.postprocess.scale_boxes` to map them back).
    """
    decoded = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
    return postprocess_yolo9(decoded, conf=conf, iou=iou, max_det=max_det)
