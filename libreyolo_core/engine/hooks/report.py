"""The validation report written at the end of a finished run (rank 0)."""

from __future__ import annotations

import logging
from typing import Any

from libreyolo_core.engine import fence
from libreyolo_core.engine.hooks.base import HookBase
from libreyolo_core.engine.hooks.validation import ValidationHook
from libreyolo_core.records.events import ArtifactEvent

__all__ = ["ReportHook"]

log = logging.getLogger(__name__)


class ReportHook(HookBase):
    """Rank 0, at the end of a run that finished: the validation report of the last
    validated epoch under ``<run_dir>/val/`` (:func:`~libreyolo_core.eval.report.write_report`;
    pictures unless ``plots=False``), its table printed, one ``artifact`` event per file.
    It reuses that epoch's predictions: no extra validation pass."""

    def __init__(self, validation: ValidationHook) -> None:
        self.validation = validation

    def after_train(self) -> None:
        t, vh = self.trainer, self.validation
        if t.status not in ("succeeded", "early_stopped") or vh.last_pass is None:
            return
        from libreyolo_core.eval.report import format_table, write_report

        labels = None
        if t.cfg.plots and getattr(t.parts, "train_set", None) is not None:
            labels = [r.labels for r in t.parts.train_set.records]
        meta = {"epoch": vh.last_epoch, "model": f"{t.family.name}-{t.size}", "imgsz": t.cfg.imgsz,
                "split": "val", "data": str(t.cfg.data), "val_time_s": round(t.state.val_s[-1], 3)
                if t.state.val_s else None}
        fence.check("the validation report (val/)")  # an attempt given up writes nothing
        try:
            report = write_report(t.run_dir / "val", vh.last_pass, dict(t.names or {}), t.cfg.plot_images,
                                  labels, meta, plots=t.cfg.plots)
        except Exception as exc:  # noqa: BLE001 - a failed report never fails a finished run
            log.warning("validation report not written: %s: %s", type(exc).__name__, exc)
            return
        print(f"validation report (epoch {vh.last_epoch}), {t.run_dir / 'val'}:\n{format_table(report)}", flush=True)
        print(f"report: {report['timing']['total_s']:.2f} s (the validation pass took "
              f"{meta['val_time_s']} s)", flush=True)
        for rel in _report_files(report):
            t.events.write(ArtifactEvent(path=f"val/{rel}", kind=_report_kind(rel)))


def _report_files(report: dict[str, Any]) -> list[str]:
    """The files of a written report, relative to ``val/``."""
    return list(report["files"].values()) + [img["file"] for img in report["images"]]


def _report_kind(rel: str) -> str:
    """The artifact kind of a report file: report, predictions, plot or detections."""
    if rel.startswith("detections/"):
        return "detections"
    if rel.endswith(".png"):
        return "plot"
    return "predictions" if rel in ("predictions.json", "ground_truth.json") else "report"
