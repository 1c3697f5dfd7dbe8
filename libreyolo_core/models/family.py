"""The model-family contract: what the engine and the service may ask of a family.

A family is a subclass of :class:`Family` whose class constants say what it is (name,
sizes with their default ``imgsz``, stride, TrainConfig defaults, capability flags) and
whose methods build its parts. Importing a family class is torch-free: the builders
import torch and the network inside, so the API process can validate requests with the
constants alone. Optional hooks (:meth:`Family.arch_from_state`,
:meth:`Family.on_mosaic_disable`) have no-op defaults; the trainer calls them
unconditionally. See docs/architecture.md, "Models".
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

if TYPE_CHECKING:
    from torch import Tensor, nn

    from libreyolo_core.config import TrainConfig

_Loss = TypeVar("_Loss", bound="nn.Module")

__all__ = ["Family"]


class Family:
    """Base class of a model family; subclasses set the constants and the builders.

    Class constants (the contract; ``tests/models/test_family_contract.py`` checks them):
        name: family key used in model names (``yolo9`` in ``yolo9-t``).
        title: display name (``YOLOv9``).
        sizes: size letter -> default training/inference ``imgsz`` (pixels), in ascending
            model size. The ONE list of a family's sizes.
        stride: the largest output stride; ``imgsz`` must be a multiple of it.
        overrides: TrainConfig defaults this family replaces (applied only to keys the
            user did not set, :func:`libreyolo_core.config.resolve_config`).
        amp: whether the family trains with mixed precision by default.
        sync_bn: whether BatchNorm becomes SyncBatchNorm under DDP by default.
        cuda_graph: whether the family's forward/backward may be CUDA-graph captured.
        spawn: whether multi-GPU training may use the spawn launcher.
        scale_loss_by_batch: the backward pass uses the loss times the images of the
            (global) micro-batch, the Ultralytics/YOLOv9 convention their ``lr0 = 0.01``
            recipes assume; False back-propagates the normalised loss as it is, like
            YOLOX's reference trainer (docs/architecture.md, "Trainer").
    """

    name: ClassVar[str]
    title: ClassVar[str]
    sizes: ClassVar[Mapping[str, int]]
    stride: ClassVar[int] = 32
    overrides: ClassVar[Mapping[str, Any]] = MappingProxyType({})
    amp: ClassVar[bool] = True
    sync_bn: ClassVar[bool] = True
    cuda_graph: ClassVar[bool] = True
    spawn: ClassVar[bool] = True
    scale_loss_by_batch: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for attr in ("sizes", "overrides"):  # read-only, so no caller can change a family
            if attr in cls.__dict__:
                setattr(cls, attr, MappingProxyType(dict(cls.__dict__[attr])))

    def __repr__(self) -> str:
        return f"<family {self.name} ({self.title}), sizes {', '.join(self.sizes)}>"

    def defaults(self, size: str) -> dict[str, Any]:
        """TrainConfig defaults of this family and ``size``: ``imgsz``, ``amp``,
        ``sync_bn`` and :attr:`overrides`.

        Raises:
            KeyError: ``size`` is not one of :attr:`sizes`.
        """
        return {"imgsz": self.sizes[size], "amp": self.amp, "sync_bn": self.sync_bn, **self.overrides}

    def check_size(self, size: str) -> None:
        """Raise ``ValueError`` naming the choices when ``size`` is not one of :attr:`sizes`."""
        if size not in self.sizes:
            raise ValueError(f"unknown {self.title} size {size!r}; choose one of {', '.join(self.sizes)}")

    # -- builders (every family implements these) ---------------------------------------
    def build_model(self, size: str, nc: int) -> nn.Module:
        """A freshly initialised network of ``size`` with ``nc`` classes. A family whose
        architecture varies beyond those adds optional keywords: the ones
        :meth:`arch_from_state` returns.

        Raises:
            ValueError: unknown size or ``nc < 1``.
        """
        raise NotImplementedError

    def build_loss(self, model: nn.Module, cfg: TrainConfig | None = None) -> nn.Module:
        """The family's loss for ``model``, on the model's device. Called as
        ``loss(outputs, targets (N, 6), batch_size) -> (total, items)``."""
        raise NotImplementedError

    def preprocess(self, images: Tensor) -> Tensor:
        """``uint8 (B, 3, H, W)`` RGB on the device -> the network's float input.

        Raises:
            ValueError: not a 4-D tensor with 3 channels.
        """
        raise NotImplementedError

    def postprocess(
        self, outputs: Any, conf: float = 0.25, iou: float = 0.45, max_det: int = 300
    ) -> list[Tensor]:
        """Eval-mode outputs -> per-image ``(n, 6)`` float32 ``[x1, y1, x2, y2, score, cls]``
        in input pixels, sorted by score."""
        raise NotImplementedError

    def class_tensors(self, state_names: list[str]) -> list[str]:
        """Names (ours) of the tensors whose shape depends on the class count."""
        raise NotImplementedError

    # -- hooks (no-op defaults) ---------------------------------------------------------
    def arch_from_state(self, state: Mapping[str, Tensor]) -> dict[str, Any]:
        """The :meth:`build_model` keywords a state dict (our names) was built with.
        Default: none (the architecture follows from size and class count)."""
        return {}

    def on_mosaic_disable(self, model: nn.Module, loss: nn.Module) -> bool:
        """Called once when mosaic closes (the last ``no_aug_epochs``).

        Returns:
            True when the hook changed what forward + loss compute (the trainer then emits
            ``captured_region_changed`` and a captured CUDA graph is re-captured).
            Default: nothing changes, False.
        """
        return False

    # -- shared helpers -----------------------------------------------------------------
    @staticmethod
    def _on_model_device(loss: _Loss, model: nn.Module) -> _Loss:
        """``loss`` moved to the device of ``model``'s parameters (CPU when it has none)."""
        import torch

        try:
            device = next(model.parameters()).device
        except StopIteration:
            device = torch.device("cpu")
        return loss.to(device)

    @staticmethod
    def _check_images(images: Tensor) -> None:
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be (B, 3, H, W), got {tuple(images.shape)}")
