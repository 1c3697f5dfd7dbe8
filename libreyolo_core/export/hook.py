"""The ``export`` training key: rank 0 exports ``weights/best.pt`` when the run ends.

``export=[onnx]`` writes ``weights/best.onnx`` (checked by onnxruntime like every export,
:func:`~libreyolo_core.export.onnx.export_onnx`) and ``weights/best.onnx.json`` (the
:class:`~libreyolo_core.export.onnx.ExportResult`: layout, opset, the check's figure),
both announced as ``artifact`` events (kind ``export``). A failed export (a failed check,
onnx not installed) is one warning and ``best.onnx.json`` with ``{"error": ...}``; the
training result stands.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from libreyolo_core.engine import fence
from libreyolo_core.engine.hooks.base import HookBase
from libreyolo_core.records.events import ArtifactEvent

__all__ = ["ExportHook"]

log = logging.getLogger(__name__)


class ExportHook(HookBase):
    """Rank 0: export ``best.pt`` to each format of ``cfg.export`` after a run that ended
    well (succeeded or early-stopped)."""

    trainer: Any  # its events log and run folder exist once training ran

    def after_train(self) -> None:
        t = self.trainer
        if t.status not in ("succeeded", "early_stopped") or t.run_dir is None:
            return
        best = Path(t.run_dir) / "weights" / "best.pt"
        if not best.is_file():
            return
        for fmt in t.cfg.export:
            target = best.with_suffix(f".{fmt}")
            record = target.with_name(target.name + ".json")
            fence.check(f"weights/{target.name}")  # an attempt given up writes nothing
            try:
                from libreyolo_core.export.model import export_detector
                from libreyolo_core.weights.detector import Detector

                result = export_detector(Detector(best), format=fmt, file=target, imgsz=t.cfg.imgsz)
                fence.check(f"weights/{record.name}", leftover=target)  # the export took a while
                record.write_text(json.dumps(result.to_dict() | {"path": f"weights/{target.name}"}),
                                  encoding="utf-8")
                t.events.write(ArtifactEvent(path=f"weights/{target.name}", kind="export"))
            except Exception as exc:  # noqa: BLE001 - the training result stands
                log.warning("export=%s: %s", fmt, exc)
                fence.check(f"weights/{record.name}")
                record.write_text(json.dumps({"format": fmt, "error": str(exc)}), encoding="utf-8")
            t.events.write(ArtifactEvent(path=f"weights/{record.name}", kind="export"))
