"""Running an exported ONNX file in onnxruntime with our pre- and post-processing.

:class:`OnnxDetector` is the ONNX twin of :meth:`LibreYOLO.predict
<libreyolo_core.facade.LibreYOLO.predict>`: the same letterbox, the same family
post-processing (``raw`` layout) or the graph's own NMS (``nms`` layout), the same
:class:`~libreyolo_core.predict.Prediction` objects. The family, classes and size come from
the file's metadata (:func:`~libreyolo_core.export.onnx.read_metadata`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from libreyolo_core.export.onnx import read_metadata, require_onnx

__all__ = ["OnnxDetector"]


class OnnxDetector:
    """An exported detector in an onnxruntime session.

    Args:
        path: a ``.onnx`` file written by :func:`~libreyolo_core.export.onnx.export_onnx`.
        providers: onnxruntime execution providers (default CPU).
        threads: intra-op threads (0: onnxruntime's default).

    Raises:
        ExportError: onnxruntime missing. ValueError: the file has no LibreYOLO metadata.
    """

    def __init__(self, path: str | Path, providers: tuple[str, ...] = ("CPUExecutionProvider",),
                 threads: int = 0):
        from libreyolo_core.models.registry import get_family

        _, ort = require_onnx()
        self.path = Path(path)
        self.meta = read_metadata(self.path)
        if "family" not in self.meta:
            raise ValueError(f"{self.path} has no LibreYOLO metadata (family, names, imgsz)")
        self.family = get_family(self.meta["family"])
        self.names: dict[int, str] = self.meta["names"]
        self.imgsz: int = self.meta["imgsz"]
        self.layout: str = self.meta.get("layout", "raw")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(self.path), options, providers=list(providers))

    def run(self, images: np.ndarray) -> list[np.ndarray]:
        """The graph's outputs for ``uint8 (B, 3, H, W)`` RGB ``images`` (the layout's
        order: docs/export.md)."""
        return self.session.run(None, {"images": np.ascontiguousarray(images, dtype=np.uint8)})

    def detections(self, images: np.ndarray, conf: float = 0.25, iou: float = 0.45,
                   max_det: int = 300) -> list[torch.Tensor]:
        """Per-image ``(n, 6)`` ``[x1, y1, x2, y2, score, cls]`` in input pixels: the
        ``raw`` layout's ``decoded`` through the family's ``postprocess``; the ``nms``
        layout's rows as the graph made them (its thresholds were fixed at export)."""
        out = self.run(images)
        if self.layout == "nms":
            rows = torch.from_numpy(out[0])
            return [rows[rows[:, 0] == b, 1:] for b in range(images.shape[0])]
        return self.family.postprocess(torch.from_numpy(out[0]), conf=conf, iou=iou, max_det=max_det)

    def predict(self, source: Any, conf: float = 0.25, iou: float = 0.45, imgsz: int | None = None,
                max_det: int = 300) -> list[Any]:
        """Detect objects in ``source`` (as :meth:`LibreYOLO.predict`); one
        :class:`~libreyolo_core.predict.Prediction` per image, boxes in original pixels.
        A static export runs at its own ``imgsz`` only."""
        from libreyolo_core.data.augment import letterbox
        from libreyolo_core.models.postprocess import scale_boxes
        from libreyolo_core.predict import Prediction, as_rgb, expand_source, iter_frames

        size = int(imgsz or self.imgsz)
        out = []
        for img, src, _frame, _fps in iter_frames(expand_source(source), as_rgb):
            h0, w0 = img.shape[:2]
            canvas, _, ratio, pad = letterbox(img, size)
            x = np.ascontiguousarray(canvas.transpose(2, 0, 1))[None]
            pred = self.detections(x, conf=conf, iou=iou, max_det=max_det)[0].float()
            boxes = scale_boxes(pred[:, :4].clone(), ratio, pad, (h0, w0))
            classes = pred[:, 5].long().numpy()
            out.append(Prediction(boxes.numpy().astype(np.float32), pred[:, 4].numpy().astype(np.float32),
                                  classes, [self.names.get(int(c), str(int(c))) for c in classes],
                                  str(src.path) if src.kind != "array" else None, (h0, w0)))
        return out
