"""YOLOv9 family (sizes t, s): the :class:`Family` contract over ``nn.py`` and ``loss.py``.

Torch-free to import; the builders import the network and loss. Source: Wang et al.,
"YOLOv9: Learning What You Want to Learn Using Programmable Gradient Information" (2024).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from libreyolo_core.models.family import Family
from libreyolo_core.models.registry import register_family

if TYPE_CHECKING:
    from torch import Tensor, nn

    from libreyolo_core.config import TrainConfig
    from libreyolo_core.models.yolo9.loss import YOLO9Loss
    from libreyolo_core.models.yolo9.nn import YOLO9

__all__ = ["Yolo9"]


@register_family
class Yolo9(Family):
    """YOLOv9: GELAN backbone, anchor-free DFL head, TAL assigner (docs/architecture.md,
    "Models")."""

    name = "yolo9"
    title = "YOLOv9"
    sizes = {"t": 640, "s": 640}
    # YOLOv9 recipe: linear LR decay to 1 %, short warm-up, no rotation/shear, gentler
    # mosaic scale, no mixup, slower EMA (docs/architecture.md, "Models").
    overrides = {
        "scheduler": "linear",
        "warmup_epochs": 3.0,
        "warmup_lr_start": 1e-4,
        "min_lr_ratio": 0.01,
        "degrees": 0.0,
        "shear": 0.0,
        "scale": (0.5, 1.5),
        "mixup": 0.0,
        "ema_decay": 0.9999,
    }

    def build_model(self, size: str, nc: int, cls_width: int | None = None) -> YOLO9:
        """A freshly initialised YOLOv9 of ``size`` with ``nc`` classes.

        ``cls_width`` sets the head's class-tower width (default: from ``nc``); see
        :meth:`arch_from_state`.

        Raises:
            ValueError: unknown size or ``nc < 1``.
        """
        from libreyolo_core.models.yolo9.nn import CONFIGS, YOLO9

        self.check_size(size)
        return YOLO9(CONFIGS[size], nc=int(nc), cls_width=cls_width)

    def arch_from_state(self, state: Mapping[str, Tensor]) -> dict[str, Any]:
        """The class-tower width a state dict (our names) was built with, which a model
        fine-tuned from COCO keeps at 80 whatever its class count."""
        tower = state.get("head.cls.0.0.conv.weight")
        return {"cls_width": int(tower.shape[0])} if tower is not None else {}

    def class_tensors(self, state_names: list[str]) -> list[str]:
        """The last conv of each level's class tower (our names)."""
        return [k for k in state_names if re.fullmatch(r"head\.cls\.\d+\.2\.(weight|bias)", k)]

    def build_loss(self, model: nn.Module, cfg: TrainConfig | None = None) -> YOLO9Loss:
        """The YOLOv9 loss for ``model`` (box 7.5, DFL 1.5, cls 0.5) on its device."""
        from libreyolo_core.models.yolo9.loss import YOLO9Loss

        return self._on_model_device(YOLO9Loss(model), model)

    def preprocess(self, images: Tensor) -> Tensor:
        """``uint8 (B, 3, H, W)`` RGB -> ``float32`` in [0, 1] on the same device.

        Raises:
            ValueError: not a 4-D tensor with 3 channels.
        """
        import torch

        self._check_images(images)
        return images.to(torch.float32).div_(255.0)

    def postprocess(
        self, outputs: Tensor | tuple[Tensor, Any], conf: float = 0.25, iou: float = 0.45,
        max_det: int = 300,
    ) -> list[Tensor]:
        """Eval-mode outputs -> per-image ``(n, 6)`` ``[x1, y1, x2, y2, score, cls]``.

        ``outputs`` is the ``(decoded, maps)`` tuple of an ``eval()`` forward (or just
        ``decoded (B, 4 + nc, A)``); every (anchor, class) pair above ``conf`` is a
        candidate (multi-label, as the YOLOv9 reference). Boxes stay in input pixels (use
        :func:`libreyolo_core.models.postprocess.scale_boxes` to map them back).
        """
        from libreyolo_core.models.postprocess import select_detections

        decoded = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
        return select_detections(decoded, conf=conf, iou=iou, max_det=max_det)
