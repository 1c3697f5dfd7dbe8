"""Exporting a trained detector to other runtimes (ONNX, checked by onnxruntime).

:func:`~libreyolo_core.export.onnx.export_onnx` writes and checks the file;
:class:`~libreyolo_core.export.runtime.OnnxDetector` runs one with our pre- and
post-processing. Both need the ``onnx`` extra (``pip install 'libreyolo-service[onnx]'``);
importing this package does not.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EXPORT_FORMATS", "export_onnx", "ExportError", "ExportCheckError", "OnnxDetector"]

#: the formats ``export`` accepts
EXPORT_FORMATS = ("onnx",)


def __getattr__(name: str) -> Any:
    if name in ("export_onnx", "ExportError", "ExportCheckError"):
        from libreyolo_core.export import onnx

        return getattr(onnx, name)
    if name == "OnnxDetector":
        from libreyolo_core.export.runtime import OnnxDetector

        return OnnxDetector
    raise AttributeError(f"module 'libreyolo_core.export' has no attribute {name!r}")
