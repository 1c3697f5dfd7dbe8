"""``Detector``: a model of a registered family, built from a name or read from a weights
file, with its classes and training size. The public :class:`~libreyolo_core.facade.LibreYOLO`
adds train / val / predict / export on top; the engine (:func:`~libreyolo_core.engine.
train_run.train_run`), the end-of-run export and the profiler's trial use this class, so they
need not import the facade."""

from __future__ import annotations

import logging
from pathlib import Path

from libreyolo_core.models.registry import get_family, parse_model_name
from libreyolo_core.weights.load import LoadedWeights, load_weights

__all__ = ["Detector", "is_weights_path", "inference_size"]

#: the public API's logger: its records keep the name users configure (the facade's)
log = logging.getLogger("libreyolo_core.facade")


def is_weights_path(model: str | Path) -> bool:
    """True when ``model`` names a weights file (``.pt`` / ``.pth`` or an existing file)
    rather than a registry name like ``yolo9-t``."""
    text = str(model)
    return text.endswith((".pt", ".pth")) or Path(text).is_file()


class Detector:
    """A detector of a registered family, built from a name or from a checkpoint.

    Args:
        model: ``"yolo9-t"`` (family-size) or a path to a weights file: ours, LibreYOLO
            1.x, the upstream YOLOv9 release or Megvii's YOLOX (read with
            ``weights_only=True`` by :func:`~libreyolo_core.weights.load_weights`).
        nc: number of classes of a freshly built model (training re-syncs it from the data).
        names: class names of a freshly built model.
        expect: with a weights file, the model you meant (``"yolo9-t"``): another family
            or size in the file gets one log line naming both (the file's model is used).

    Raises:
        ModelNameError: unknown model name. CheckpointError: bad or unsafe weights file.
    """

    def __init__(self, model: str | Path = "yolo9-t", nc: int = 80, names: dict[int, str] | None = None,
                 expect: str | None = None):
        self.checkpoint: Path | None = None
        self.weights_format: str | None = None
        if is_weights_path(model):
            self._adopt(load_weights(model, expect=expect))
        else:
            text = str(model)
            self.family, self.size = parse_model_name(text)
            self.nc = nc
            self.names = dict(names) if names else {i: str(i) for i in range(nc)}
            self.model = self.family.build_model(self.size, nc)
            self.imgsz = self.family.sizes[self.size]
        self.name = f"{self.family.name}-{self.size}"
        self.model.eval()

    def _adopt(self, weights: LoadedWeights) -> None:
        """Become the model stored in ``weights`` (family, size, classes, weights)."""
        self.family, self.size = get_family(weights.family), weights.size
        self.nc, self.names = weights.nc, dict(weights.names)
        self.model = weights.build()
        self.imgsz = weights.imgsz or self.family.sizes[self.size]
        self.checkpoint, self.weights_format = weights.path, weights.format
        self.name = f"{self.family.name}-{self.size}"

    def _inference_size(self, imgsz: int | None) -> int:
        """``imgsz`` (default: the training size) rounded up to the stride
        (:func:`inference_size`)."""
        return inference_size(self.imgsz if imgsz is None else imgsz, self.family.stride, self.name)


def inference_size(imgsz: int, stride: int, name: str) -> int:
    """``imgsz`` pixels rounded up to a multiple of ``stride``, with a warning naming the
    model ``name`` (as Ultralytics does): the feature maps of the levels must line up for
    the neck to concatenate them.

    Raises:
        ValueError: ``imgsz`` under the stride.
    """
    size = int(imgsz)
    if size < stride:
        raise ValueError(f"imgsz={size} must be >= {stride} (pixels)")
    if size % stride:
        fixed = -(-size // stride) * stride
        log.warning("imgsz=%d is not a multiple of %s's stride %d; using imgsz=%d", size, name,
                    stride, fixed)
        size = fixed
    return size
