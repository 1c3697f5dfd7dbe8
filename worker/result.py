"""A finished attempt's result summary: final metrics, best epoch, the profiler's verdict,
the preflight estimate beside what the run took, a tune job's answer.

Read from what the runner observed (:class:`worker.tail.Observed`) and from the files the
engine leaves in the run directory (``preflight.json``, ``tune.json``, ``results.csv``).
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from libreyolo_core.records.events import RunEndEvent
from libreyolo_core.records.result import JobResult, PreflightResult
from libreyolo_core.records.tune import TUNE_FILE, TuneRecord
from worker.tail import Observed

__all__ = ["actual_timing", "job_result", "result_summary"]

log = logging.getLogger(__name__)


def job_result(seen: Observed, run_dir: Path, kind: str) -> JobResult:
    """The job's ``result`` (:class:`~libreyolo_core.records.result.JobResult`): ``status``
    (the engine's ``run_end``), ``best_epoch``, ``metrics``, ``epochs_completed``, ``names``
    (class id -> name: the keys of ``metrics.per_class_AP``), ``data`` (each split's scan:
    images, boxes, defect counts); ``verdict``, ``bound_why``, ``lever`` and ``profile``
    after a profile event; ``preflight`` (with its ``actual`` timing) when
    ``preflight.json`` exists; for ``kind == "tune"``, ``tune``, ``answer`` and
    ``recommended_params`` from ``tune.json``; for ``kind == "predict"``, ``predict`` from
    ``predict.json`` (images, detections, names, files). A key is set only where the run
    gave it, so the stored JSON (:meth:`JobResult.to_dict`) has the keys it always had."""
    end = seen.run_end
    progress = seen.progress
    fields: dict[str, Any] = {
        "status": end.status if end is not None else None,
        "best_epoch": end.best_epoch if end is not None and end.has("best_epoch")
        else progress.get("best_epoch"),
        "metrics": (end.metrics if end is not None else None) or progress.get("metrics"),
        # the last epoch_end's epoch: a progress event's epoch may be one cut off
        "epochs_completed": progress.get("epochs_completed", 0),
        "names": end.names if end is not None else None,  # the keys of metrics.per_class_AP
    }
    if end is not None and end.data:  # the scan's counts: images, boxes, label defects
        fields["data"] = end.data
    if seen.profile is not None:
        fields.update(verdict=seen.profile.verdict, bound_why=seen.profile.bound_why,
                      lever=seen.profile.lever, profile=seen.profile)
    fields.update(_file_fields(run_dir, kind, end))
    return JobResult(**fields)


def _file_fields(run_dir: Path, kind: str, end: RunEndEvent | None) -> dict[str, Any]:
    """The result's keys read from the run directory's files (``preflight.json``,
    ``predict.json``, ``tune.json``)."""
    fields: dict[str, Any] = {}
    preflight = _read_json(run_dir / "preflight.json")
    if preflight is not None:
        preflight.pop("trial_dir", None)
        try:
            fields["preflight"] = PreflightResult.model_validate(
                {**preflight, "actual": actual_timing(run_dir, end)})
        except ValidationError as exc:  # a file no engine of ours writes: left out
            log.warning("%s: preflight.json left out of the result: %s", run_dir, exc)
    if kind == "predict":  # libreyolo_core.predict_job's summary
        fields["predict"] = _read_json(run_dir / "predict.json")
    if kind == "tune":
        tune = _read_tune(run_dir / TUNE_FILE)
        if tune is not None:
            fields.update(tune=tune, answer=tune.answer if "answer" in tune.model_fields_set
                          else None, recommended_params=tune.recommended_params
                          if "recommended_params" in tune.model_fields_set else None)
    return fields


def result_summary(seen: Observed, run_dir: Path, kind: str) -> dict[str, Any]:
    """:func:`job_result` as the job row's JSON (what the runner stores)."""
    return job_result(seen, run_dir, kind).to_dict()


def _read_tune(path: Path) -> TuneRecord | None:
    """``tune.json``; ``None`` when missing, unreadable or not a tune record."""
    try:
        return TuneRecord.read(path)
    except (OSError, ValueError):
        return None


def _read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``; ``None`` when missing or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def actual_timing(run_dir: Path, run_end: RunEndEvent | None) -> dict[str, Any]:
    """What the run took, seconds, beside its preflight estimate: from ``results.csv`` (every
    completed epoch, earlier attempts included) ``epochs``, ``epoch_time_s`` (mean training
    time of an epoch), ``first_epoch_s``, ``train_s``, ``val_s`` (sums) and ``val_time_s``
    (mean of the validated epochs); ``wall_s`` of the engine's last attempt (``run_end``)."""
    rows: list[dict[str, str]] = []
    with contextlib.suppress(OSError, csv.Error), \
            open(run_dir / "results.csv", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))

    def floats(key: str, only_validated: bool = False) -> list[float]:
        out = []
        for r in rows:
            if only_validated and r.get("validated") not in ("1", "True", "true"):
                continue
            with contextlib.suppress(TypeError, ValueError):
                out.append(float(r[key]))
        return out

    train, val = floats("epoch_time_s"), floats("val_time_s", only_validated=True)
    timing = (run_end.timing if run_end is not None else None) or {}
    return {"epochs": len(train),
            "epoch_time_s": round(sum(train) / len(train), 3) if train else None,
            "first_epoch_s": train[0] if train else None,
            "train_s": round(sum(train), 3), "val_s": round(sum(val), 3),
            "val_time_s": round(sum(val) / len(val), 3) if val else None,
            "wall_s": timing.get("wall_s")}
