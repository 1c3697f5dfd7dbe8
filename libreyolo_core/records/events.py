"""``events.jsonl`` lines as typed records: one frozen class per event the engine writes.

The engine builds a record and writes it through
:meth:`~libreyolo_core.engine.events.EventLog.write`; the readers (the worker's tail,
:func:`~libreyolo_core.engine.events.read_events`) parse each line with :func:`parse_event`
and read by attribute. A line is ``{"event": <name>, "time": <unix s>, <fields>}``; a record
writes back exactly the fields it was given (:meth:`EngineEvent.to_dict`), in declaration
order, so the file, the service's ``job_events`` rows and what the SDK reads stay the shape
they were. Unknown keys are kept (``extra="allow"``): a newer engine's line passes an older
reader unchanged. Values are made JSON-safe on the way in (tensors and numpy scalars to
numbers, non-finite floats to ``None``, paths to strings).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from libreyolo_core.profiler.record import HEADLINE_FIELDS, ProfileHeadline, ordered

__all__ = ["EVENT_TYPES", "ArtifactEvent", "CapturedRegionChangedEvent", "EngineEvent",
           "EpochEndEvent", "EpochStartEvent", "PreflightEvent", "PreflightFields",
           "ProfileEvent", "ProgressEvent", "RunEndEvent", "RunStartEvent", "TuneCandidateEvent", "TuneEvent",
           "json_safe", "parse_event"]

Number = int | float


def json_safe(value: Any) -> Any:
    """JSON-safe copy: tensors/numpy scalars to numbers, non-finite floats to None, paths to
    strings, tuples to lists, dict keys to strings."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value


def _now() -> float:
    return round(time.time(), 3)


class EngineEvent(BaseModel):
    """One ``events.jsonl`` line: ``event`` (its name) and ``time`` (unix seconds, ms
    resolution), then the event's fields. A subclass per event names its fields; this base
    class also stands for a line of an unknown event (its fields kept as extras)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    #: The name a subclass writes (``event`` defaults to it).
    NAME: ClassVar[str] = ""

    event: str = ""
    time: float = Field(default_factory=_now)

    @model_validator(mode="before")
    @classmethod
    def _safe(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            data = json_safe(dict(data))
            data.setdefault("event", cls.NAME or "unknown")
        return data

    def to_dict(self) -> dict[str, Any]:
        """The line's JSON object: ``event``, ``time``, then the fields that were set."""
        fields = self.model_dump(mode="json", exclude_unset=True, exclude={"event", "time"})
        return {"event": self.event, "time": self.time, **fields}

    def payload(self) -> dict[str, Any]:
        """The fields that were set, without ``event`` and ``time``."""
        return self.model_dump(mode="json", exclude_unset=True, exclude={"event", "time"})

    def has(self, name: str) -> bool:
        """Whether the line carried field ``name`` (a declared field's default is not)."""
        return name in self.model_fields_set or name in (self.model_extra or {})


class RunStartEvent(EngineEvent):
    """A run (or a tune job) starts: its ``config`` (the training keys as JSON), ``run_dir``
    (absolute); a training run adds ``start_epoch`` (1-based), ``device``, ``amp`` (the
    autocast mode), ``world_size``, ``batch`` (per rank); a tune job its ``tune`` options."""

    NAME = "run_start"
    config: dict[str, Any] = {}
    run_dir: str | None = None
    start_epoch: int | None = None
    device: str | None = None
    amp: str | None = None
    world_size: int | None = None
    batch: int | None = None
    tune: dict[str, Any] | None = None


class ProgressEvent(EngineEvent):
    """Where a run is: ``phase`` (``training``, ``validating``, ``profiling``, ``tuning``)
    and the counters of that phase (1-based ``epoch``/``step``, ``val_batch``; the profile
    window's ``warmup``/``measured`` steps; a tune job's ``candidate``, ``trial`` and trial
    counts), ``eta_s`` (seconds left), ``img_per_s``, ``losses`` (mean so far)."""

    NAME = "progress"
    phase: str | None = None
    epoch: int | None = None
    epochs: int | None = None
    step: int | None = None
    steps: int | None = None
    val_batch: int | None = None
    val_batches: int | None = None
    warmup: int | None = None
    measured: int | None = None
    candidate: str | None = None
    candidate_index: int | None = None
    candidates: int | None = None
    trial: int | None = None
    trials: int | None = None
    trials_done: int | None = None
    trials_planned: int | None = None
    eta_s: Number | None = None
    img_per_s: Number | None = None
    losses: dict[str, Number | None] | None = None


class EpochStartEvent(ProgressEvent):
    """An epoch starts (read like :class:`ProgressEvent`; the engine writes none today)."""

    NAME = "epoch_start"


class EpochEndEvent(EngineEvent):
    """An epoch ended: 1-based ``epoch`` of ``epochs``, mean ``losses``, validation
    ``metrics`` (empty when not validated; no per-class AP), ``lr`` per group, seconds
    ``epoch_time_s`` / ``val_time_s``, ``fitness``, ``is_best``, whether ``mosaic`` was on,
    ``eta_s``."""

    NAME = "epoch_end"
    epoch: int | None = None
    epochs: int | None = None
    losses: dict[str, Number | None] | None = None
    metrics: dict[str, Any] | None = None
    lr: Any = None
    epoch_time_s: Number | None = None
    val_time_s: Number | None = None
    fitness: Number | None = None
    is_best: bool | None = None
    mosaic: bool | None = None
    eta_s: Number | None = None


class ArtifactEvent(EngineEvent):
    """A file the run wrote: ``path`` relative to the run directory, ``kind``
    (``checkpoint``, ``results``, ``profile``, ``timeline``, ``trace``, ``preflight``,
    ``tune``)."""

    NAME = "artifact"
    path: str
    kind: str | None = "other"


class CapturedRegionChangedEvent(EngineEvent):
    """What a captured CUDA graph covers changed at 1-based ``epoch`` (``reason``)."""

    NAME = "captured_region_changed"
    epoch: int | None = None
    reason: str | None = None


class ProfileEvent(EngineEvent, ProfileHeadline):
    """The profile window's verdict (:meth:`TrainingProfiler.finish
    <libreyolo_core.profiler.window.TrainingProfiler.finish>`): the headline fields of
    ``profile.json`` (:class:`~libreyolo_core.profiler.record.ProfileHeadline`: ``verdict``,
    ``bound_why``, ``lever``, the figures, ``confidence``; same names and units), then
    ``window`` and ``load`` as in ``profile.json``."""

    NAME = "profile"
    window: dict[str, Any] | None = None
    load: dict[str, Any] | None = None

    #: The line's keys in the order the event has always had them.
    KEY_ORDER: ClassVar[tuple[str, ...]] = (
        "event", "time", *(f for f in HEADLINE_FIELDS if f != "confidence"), "window",
        "confidence", "load")

    def to_dict(self) -> dict[str, Any]:
        """The line's JSON object: ``event``, ``time``, then the fields that were set."""
        return ordered(super().to_dict(), self.KEY_ORDER)

    def payload(self) -> dict[str, Any]:
        """The fields that were set, without ``event`` and ``time``."""
        return ordered(super().payload(), self.KEY_ORDER)


class PreflightFields(BaseModel):
    """The preflight estimate: the fields of
    :class:`~libreyolo_core.profiler.preflight.PreflightEstimate` (``preflight.json``), same
    names and units (seconds, img/s, MB). The ``preflight`` event carries them
    (:class:`PreflightEvent`), and so does a job's result
    (:class:`~libreyolo_core.records.result.PreflightResult`)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    img_per_s: Number | None = None
    step_ms: Number | None = None
    batch: int | None = None
    train_images: int | None = None
    steps_per_epoch: int | None = None
    epoch_s: Number | None = None
    first_fetch_s: Number | None = None
    val_s: Number | None = None
    val_batches: int | None = None
    validations: int | None = None
    epochs: int | None = None
    setup_s: Number | None = None
    total_s: Number | None = None
    peak_memory_mb: Number | None = None
    memory_kind: str | None = None
    device: str | None = None
    gpus: int | None = None
    gpu_hours: Number | None = None
    price_per_gpu_hour: Number | None = None
    currency: str | None = None
    cost: Number | None = None
    verdict: str | None = None
    reliable: bool | None = None
    window: dict[str, Any] | None = None
    phases: list[dict[str, Any]] | None = None
    measured_s: Number | None = None
    notes: list[str] | None = None
    trial_dir: str | None = None


class PreflightEvent(EngineEvent, PreflightFields):
    """The preflight estimate (:class:`PreflightFields`) as an event."""

    NAME = "preflight"


class TuneCandidateEvent(EngineEvent):
    """One configuration of a tune job measured: its row of ``tune.json`` (``name``,
    ``label``, the ``params`` it changes, mean ``img_per_s`` ± ``img_per_s_std`` over
    ``n`` trials, ``step_ms``, ``verdict``, the comparison with the baseline
    (``significant``, ``gain``, ``recommendable``), ``note``, the trial files)."""

    NAME = "tune_candidate"
    name: str | None = None
    label: str | None = None
    params: dict[str, Any] | None = None
    side_effect: str | None = None
    why: str | None = None
    img_per_s: Number | None = None
    img_per_s_std: Number | None = None
    n: int | None = None
    img_per_s_trials: list[Number] | None = None
    step_ms: Number | None = None
    dataload_frac: Number | None = None
    verdict: str | None = None
    reliable: bool | None = None
    other_cpu_frac: Number | None = None
    batch: int | None = None
    epoch_s: Number | None = None
    significant: bool | None = None
    gain: Number | None = None
    gain_low: Number | None = None
    separated: bool | None = None
    load_bound: Any = None
    environment: Any = None
    recommendable: bool | None = None
    note: str | None = None
    skipped: bool | None = None
    profile: str | None = None
    trials: list[str] | None = None


class TuneEvent(EngineEvent):
    """A tune job's answer, without the per-trial detail: ``status``, ``answer``,
    ``verdict``, ``recommended_params``, ``recommended`` (its label), ``gain``,
    ``expected_epoch_s`` / ``baseline_epoch_s``, ``candidates`` (count), ``trials_run``."""

    NAME = "tune"
    status: str | None = None
    answer: str | None = None
    verdict: str | None = None
    recommended_params: dict[str, Any] | None = None
    recommended: str | None = None
    gain: Number | None = None
    expected_epoch_s: Number | None = None
    baseline_epoch_s: Number | None = None
    candidates: int | None = None
    trials_run: int | None = None


class RunEndEvent(EngineEvent):
    """A run ended: ``status`` (``completed``, ``failed``, ``interrupted``, ...),
    ``best_epoch`` (1-based), the best (or last) ``metrics``, ``error``, ``names`` (class id
    -> name), ``nonfinite_skipped`` steps, ``timing`` (seconds; ``wall_s`` at least),
    ``data`` (each split's scan: images, boxes, defect counts)."""

    NAME = "run_end"
    status: str | None = None
    best_epoch: int | None = None
    metrics: dict[str, Any] | None = None
    error: Any = None
    names: dict[str, Any] | None = None
    nonfinite_skipped: int | None = None
    timing: dict[str, Any] | None = None
    data: dict[str, Any] | None = None


#: Event name -> its record type.
EVENT_TYPES: dict[str, type[EngineEvent]] = {
    cls.NAME: cls for cls in (RunStartEvent, ProgressEvent, EpochStartEvent, EpochEndEvent,
                              ArtifactEvent, CapturedRegionChangedEvent, ProfileEvent,
                              PreflightEvent, TuneCandidateEvent, TuneEvent, RunEndEvent)
}


def parse_event(data: Mapping[str, Any]) -> EngineEvent:
    """A line's JSON object as its record (by ``event``); a line of an unknown event, or one
    whose fields do not fit its type, as a plain :class:`EngineEvent` (fields kept as
    extras, ``time`` now when it is no number)."""
    cls = EVENT_TYPES.get(str(data.get("event")), EngineEvent)
    try:
        return cls.model_validate(data)
    except ValidationError:
        rest = {k: v for k, v in data.items() if k not in ("event", "time")}
        t = data.get("time")
        return EngineEvent.model_construct(
            event=str(data.get("event", "unknown")),
            time=float(t) if isinstance(t, int | float) and not isinstance(t, bool) else _now(),
            **rest)
