"""Export a :class:`~libreyolo_core.weights.detector.Detector`: the body of
:meth:`LibreYOLO.export <libreyolo_core.facade.LibreYOLO.export>`, and of the end-of-run
export (:class:`~libreyolo_core.export.hook.ExportHook`), which reads ``best.pt`` itself and
so needs no facade."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from libreyolo_core.weights.detector import Detector

__all__ = ["export_detector"]


def export_detector(det: Detector, format: str = "onnx", file: str | Path | None = None,
                    imgsz: int | None = None, **options: Any) -> Any:
    """Export ``det`` to ``format`` (``"onnx"``), checked by onnxruntime before it is kept.

    Args:
        det: the model, its family, classes and training size.
        file: the output path (default: the checkpoint's path with ``.onnx``, or
            ``<name>.onnx`` in the current folder for a registry model).
        imgsz: input size in pixels (default: the training size; rounded up to the stride).
        options: :func:`~libreyolo_core.export.onnx.export_onnx`'s ``dynamic``, ``half``,
            ``opset``, ``nms``, ``simplify``, ``conf``, ``iou``, ``max_det``, ``batch``.

    Returns:
        :class:`~libreyolo_core.export.onnx.ExportResult`.

    Raises:
        ValueError: an unknown format. ExportError / ExportCheckError: as ``export_onnx``.
    """
    from libreyolo_core.export import EXPORT_FORMATS
    from libreyolo_core.export.onnx import export_onnx

    if str(format).lower() not in EXPORT_FORMATS:
        raise ValueError(f"format={format!r}: choose one of {', '.join(EXPORT_FORMATS)}")
    if file is None:
        file = det.checkpoint.with_suffix(".onnx") if det.checkpoint else Path(f"{det.name}.onnx")
    return export_onnx(det.model, det.family, file, names=det.names, model_name=det.name,
                       imgsz=det._inference_size(imgsz), **options)
