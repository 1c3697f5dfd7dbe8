"""YOLOX family (sizes n, t, s): the :class:`Family` contract over ``nn.py`` and ``loss.py``.

Torch-free to import; the builders import the network and loss. Source: Ge et al.,
"YOLOX: Exceeding YOLO Series in 2021" (arXiv 2107.08430) and the reference
implementation (Megvii-BaseDetection/YOLOX).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from libreyolo_core.models.family import Family
from libreyolo_core.models.registry import register_family

if TYPE_CHECKING:
    from torch import Tensor, nn

    from libreyolo_core.config import TrainConfig
    from libreyolo_core.models.yolox.loss import YOLOXLoss
    from libreyolo_core.models.yolox.nn import YOLOX

__all__ = ["Yolox"]


@register_family
class Yolox(Family):
    """YOLOX: CSPDarknet + PAFPN + decoupled head, SimOTA assigner (docs/architecture.md,
    "Models")."""

    name = "yolox"
    title = "YOLOX"
    sizes = {"n": 416, "t": 416, "s": 640}
    # YOLOX's trainer steps on the num_fg-normalised loss itself, without clipping; times
    # the batch its lr0 = 0.01 diverges.
    scale_loss_by_batch = False
    # YOLOX recipe: momentum 0.9, quadratic warm-up + cosine with a flat tail over the last
    # no_aug_epochs, then mosaic/mixup off and the L1 term on.
    overrides = {
        "momentum": 0.9,
        "scheduler": "yoloxwarmcos",
        "warmup_epochs": 5.0,
        "warmup_lr_start": 0.0,
        "no_aug_epochs": 15,
        "min_lr_ratio": 0.05,
        "degrees": 10.0,
        "shear": 2.0,
        "scale": (0.1, 2.0),
        "mixup": 1.0,
        "ema_decay": 0.9998,
        "workers": 4,
        "clip_max_norm": None,
    }

    def build_model(self, size: str, nc: int) -> YOLOX:
        """A freshly initialised YOLOX of ``size`` with ``nc`` classes.

        Raises:
            ValueError: unknown size or ``nc < 1``.
        """
        from libreyolo_core.models.yolox.nn import CONFIGS, YOLOX

        self.check_size(size)
        return YOLOX(CONFIGS[size], nc=int(nc))

    def class_tensors(self, state_names: list[str]) -> list[str]:
        """``head.cls_preds.*`` (YOLOX's widths do not depend on the class count)."""
        return [k for k in state_names if k.startswith("head.cls_preds.")]

    def build_loss(self, model: nn.Module, cfg: TrainConfig | None = None) -> YOLOXLoss:
        """The YOLOX loss for ``model`` (IoU gain 5.0; L1 term off until
        :meth:`on_mosaic_disable`) on its device."""
        from libreyolo_core.models.yolox.loss import YOLOXLoss

        return self._on_model_device(YOLOXLoss(model), model)

    def preprocess(self, images: Tensor) -> Tensor:
        """``uint8 (B, 3, H, W)`` RGB -> ``float32`` **BGR in 0-255** (YOLOX's input
        convention) on the same device.

        Raises:
            ValueError: not a 4-D tensor with 3 channels.
        """
        import torch

        self._check_images(images)
        return images.flip(1).to(torch.float32)

    def postprocess(
        self, outputs: Tensor | tuple[Tensor, Any], conf: float = 0.25, iou: float = 0.45,
        max_det: int = 300,
    ) -> list[Tensor]:
        """Eval-mode outputs -> per-image ``(n, 6)`` ``[x1, y1, x2, y2, score, cls]``.

        ``outputs`` is the ``(decoded, maps)`` tuple of an ``eval()`` forward (or just
        ``decoded (B, 5 + nc, A)``: ``xyxy``, objectness, class probabilities). Score = obj x
        class probability of each anchor's **best** class (YOLOX), kept when above
        ``conf``; then class-wise NMS and the ``max_det`` cap. Boxes stay in input pixels
        (use :func:`libreyolo_core.models.postprocess.scale_boxes` to map them back).

        Raises:
            ValueError: ``decoded`` is not ``(B, 5 + nc, A)`` or ``max_det < 1``.
        """
        import torch

        from libreyolo_core.models.postprocess import select_detections

        decoded = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
        if decoded.ndim != 3 or decoded.shape[1] <= 5:
            raise ValueError(f"decoded must be (B, 5 + nc, A), got {tuple(decoded.shape)}")
        scored = torch.cat((decoded[:, :4], decoded[:, 4:5] * decoded[:, 5:]), 1)
        return select_detections(scored, conf=conf, iou=iou, max_det=max_det, multi_label=False)

    def on_mosaic_disable(self, model: nn.Module, loss: nn.Module) -> bool:
        """Turn the L1 regression term on when mosaic closes (YOLOX recipe).

        Returns:
            True: the loss's computation changed, so a captured CUDA graph of forward +
            loss must be re-captured.

        Raises:
            TypeError: ``loss`` is not the :class:`YOLOXLoss` :meth:`build_loss` made.
        """
        from libreyolo_core.models.yolox.loss import YOLOXLoss

        if not isinstance(loss, YOLOXLoss):
            raise TypeError(f"on_mosaic_disable needs a YOLOXLoss, got {type(loss).__name__}")
        loss.use_l1 = True
        return True
