"""Model family registry: torch-free metadata for every trainable family.

The API process imports this module to validate requests (names, sizes, per-family
defaults), so nothing here imports torch. The heavy code of a family lives in the module
named by :attr:`FamilySpec.module` and is imported only by :func:`load_family`.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field
from types import MappingProxyType, ModuleType
from typing import Any

__all__ = [
    "FamilySpec",
    "ModelNameError",
    "register_family",
    "get_family",
    "list_models",
    "parse_model_name",
    "load_family",
]


class ModelNameError(ValueError):
    """A model name that is not ``<family>-<size>`` of a registered family."""


@dataclass(frozen=True)
class FamilySpec:
    """What the engine and the service know about a model family without importing torch.

    Attributes:
        name: family key used in model names (``yolo9`` in ``yolo9-t``).
        title: display name (``YOLOv9``).
        sizes: size letters in ascending model size.
        module: import path of the family module that exposes ``build_model(size, nc)``,
            ``build_loss(model, cfg)``, ``preprocess`` and ``postprocess``.
        default_imgsz: default training/inference size per size letter (pixels).
        overrides: TrainConfig defaults this family replaces (applied only to keys the
            user did not set).
        amp: whether the family trains with mixed precision by default.
        sync_bn: whether BatchNorm becomes SyncBatchNorm under DDP by default.
        cuda_graph: whether the family's forward/backward may be CUDA-graph captured.
        spawn: whether multi-GPU training may use the spawn launcher.
        stride: the largest output stride; ``imgsz`` must be a multiple of it.
        scale_loss_by_batch: the backward pass uses the loss times the images of the
            (global) micro-batch, the Ultralytics/YOLOv9 convention their ``lr0 = 0.01``
            recipes assume; False back-propagates the normalised loss as it is, like
            YOLOX's reference trainer (docs/architecture.md, "Trainer").
    """

    name: str
    title: str
    sizes: tuple[str, ...]
    module: str
    default_imgsz: dict[str, int]
    overrides: dict[str, Any] = field(default_factory=dict)
    amp: bool = True
    sync_bn: bool = True
    cuda_graph: bool = True
    spawn: bool = True
    stride: int = 32
    scale_loss_by_batch: bool = True

    def defaults(self, size: str) -> dict[str, Any]:
        """TrainConfig defaults of this family and size (overrides plus the flags above)."""
        return {
            "imgsz": self.default_imgsz[size],
            "amp": self.amp,
            "sync_bn": self.sync_bn,
            **self.overrides,
        }


_FAMILIES: dict[str, FamilySpec] = {}


def register_family(spec: FamilySpec) -> FamilySpec:
    """Add a family to the registry. Raises ``ValueError`` if the name is taken."""
    if spec.name in _FAMILIES:
        raise ValueError(f"model family {spec.name!r} is already registered")
    _FAMILIES[spec.name] = spec
    return spec


def get_family(name: str) -> FamilySpec:
    """Return the family registered as ``name``; ``ModelNameError`` names the choices."""
    try:
        return _FAMILIES[name]
    except KeyError:
        raise ModelNameError(
            f"unknown model family {name!r}; registered: {', '.join(sorted(_FAMILIES))}"
        ) from None


def list_models() -> list[str]:
    """All model names ``<family>-<size>``, e.g. ``['yolo9-t', 'yolo9-s']``."""
    return [f"{f.name}-{s}" for f in _FAMILIES.values() for s in f.sizes]


def parse_model_name(model: str) -> tuple[FamilySpec, str]:
    """Split ``'yolo9-t'`` into its family spec and size letter.

    Raises:
        ModelNameError: the name is not a registered ``<family>-<size>``; the message
            lists the valid names and suggests the closest one.
    """
    name = str(model).strip().lower()
    family, _, size = name.rpartition("-")
    if family in _FAMILIES and size in _FAMILIES[family].sizes:
        return _FAMILIES[family], size
    valid = list_models()
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ModelNameError(f"unknown model {model!r}.{hint} Valid models: {', '.join(valid)}")


def load_family(spec: FamilySpec) -> ModuleType:
    """Import the family's implementation module (this is where torch gets imported)."""
    return importlib.import_module(spec.module)


def families() -> MappingProxyType[str, FamilySpec]:
    """Read-only view of the registered families."""
    return MappingProxyType(_FAMILIES)


register_family(
    FamilySpec(
        name="yolo9",
        title="YOLOv9",
        sizes=("t", "s"),
        module="libreyolo_core.models.yolo9",
        default_imgsz={"t": 640, "s": 640},
        # YOLOv9 recipe (reference E.2): linear LR decay to 1 %, short warm-up, no
        # rotation/shear, gentler mosaic scale, no mixup, slower EMA.
        overrides={
            "scheduler": "linear",
            "warmup_epochs": 3.0,
            "warmup_lr_start": 1e-4,
            "min_lr_ratio": 0.01,
            "degrees": 0.0,
            "shear": 0.0,
            "scale": (0.5, 1.5),
            "mixup": 0.0,
            "ema_decay": 0.9999,
            "workers": 8,
        },
    )
)

register_family(
    FamilySpec(
        name="yolox",
        title="YOLOX",
        sizes=("n", "t", "s"),
        module="libreyolo_core.models.yolox",
        default_imgsz={"n": 416, "t": 416, "s": 640},
        # YOLOX's trainer steps on the num_fg-normalised loss itself, without clipping
        # (reference E.3); times the batch its lr0 = 0.01 diverges.
        scale_loss_by_batch=False,
        # YOLOX recipe (reference E.2): momentum 0.9, quadratic warm-up + cosine with a
        # flat tail over the last no_aug_epochs, then mosaic/mixup off and the L1 term on.
        overrides={
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
        },
    )
)
