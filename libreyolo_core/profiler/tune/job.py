"""The tune as a service job: :func:`run_tune_job` runs what a job's spec (``job.json``,
``kind: "tune"``) asks, with the job's events."""

from __future__ import annotations

from pathlib import Path

from libreyolo_core.profiler.tune.levers import TuneOptions
from libreyolo_core.profiler.tune.run import run_tune
from libreyolo_core.records.job import JobSpec

__all__ = ["run_tune_job"]


def run_tune_job(spec: JobSpec) -> int:
    """Run the tune a service job's spec (``job.json``, ``kind: "tune"``) describes: run
    dir ``<project>/<name>``, events in its ``events.jsonl``, options from ``spec.tune``.

    Returns:
        0 (an answer was written: a recommendation, "no significant lever", or what the
        budget allowed).

    Raises:
        TuneInterrupted: SIGTERM (the job was cancelled). ValueError: a bad tune option, or
            a spec without ``project`` or ``data``.
    """
    from libreyolo_core.engine.events import EventLog

    if spec.project is None or spec.data is None:
        raise ValueError("a tune job's spec needs project and data")
    run_dir = Path(spec.project) / str(spec.name or "run")
    run_dir.mkdir(parents=True, exist_ok=True)
    options = TuneOptions.from_mapping(spec.tune)
    events = EventLog(run_dir / "events.jsonl")
    try:
        run_tune(spec.data, spec.model or "yolo9-t", run_dir=run_dir,
                 base=dict(spec.params), options=options, events=events)
    finally:
        events.close()
    return 0
