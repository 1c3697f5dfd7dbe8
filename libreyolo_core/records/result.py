"""A finished job's ``result`` as a typed record: :class:`JobResult`.

The worker builds it when an attempt ends (:func:`worker.result.job_result`) and stores its
JSON form in the job's row; the API sends that JSON as ``result``; the service's pages read
it back with :meth:`JobResult.of`. The SDK mirrors it (``libreyolo_client._results``;
``tests/client`` compares the fields). Torch-free (pydantic only), frozen. A result writes
back exactly the keys it was given (:meth:`JobResult.to_dict`) and keeps unknown keys
(``extra="allow"``), so a row written by another version round-trips unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_serializer

from libreyolo_core.profiler.record import Lever
from libreyolo_core.records.events import PreflightFields, ProfileEvent
from libreyolo_core.records.tune import TuneRecord

Number = int | float

__all__ = ["JobResult", "PreflightActual", "PreflightResult"]


class PreflightActual(BaseModel):
    """What the run took, beside its preflight estimate (seconds; from ``results.csv`` and
    the engine's ``run_end``: :func:`worker.result.actual_timing`): completed ``epochs``,
    mean ``epoch_time_s``, ``first_epoch_s``, ``train_s`` and ``val_s`` sums, mean
    ``val_time_s`` of the validated epochs, the engine's ``wall_s``."""

    model_config = ConfigDict(frozen=True, extra="allow")

    epochs: int = 0
    epoch_time_s: Number | None = None
    first_epoch_s: Number | None = None
    train_s: Number | None = None
    val_s: Number | None = None
    val_time_s: Number | None = None
    wall_s: Number | None = None


class PreflightResult(PreflightFields):
    """A job's preflight: the estimate (``preflight.json``, without its ``trial_dir``; or,
    while the job runs, the figures its ``progress`` keeps) and once the run ended the
    ``actual`` timing beside it."""

    actual: PreflightActual | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the keys that were set, nothing added."""
        return self.model_dump(mode="json", exclude_unset=True)


class JobResult(BaseModel):
    """What a job left: the engine's end, a profile job's verdict, the preflight estimate, a
    tune job's answer, a predict job's summary.

    Attributes:
        status: the engine's ``run_end`` status (``completed``, ``interrupted``, ...).
        best_epoch: 1-based. metrics: the best (or last) validation metrics.
        epochs_completed: epochs that ended. names: class id -> name (the keys of
            ``metrics.per_class_AP``). data: each split's scan (images, boxes, defects).
        verdict, bound_why, lever: a profile window's verdict, why, and the lever to pull.
        profile: the ``profile`` event (its JSON leaves out ``event`` and ``time``).
        preflight: ``preflight.json`` with its ``actual`` timing (seconds, MiB).
        predict: a predict job's ``predict.json`` (images, detections, names, files).
        tune: a tune job's ``tune.json``; answer, recommended_params: its answer and the
            parameter set it recommends, at the top level for a short read.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    status: str | None = None
    best_epoch: int | None = None
    metrics: dict[str, Any] | None = None
    epochs_completed: int | None = None
    names: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    verdict: str | None = None
    bound_why: str | None = None
    lever: Lever | None = None
    profile: ProfileEvent | None = None
    preflight: PreflightResult | None = None
    predict: dict[str, Any] | None = None
    tune: TuneRecord | None = None
    answer: str | None = None
    recommended_params: dict[str, Any] | None = None

    @classmethod
    def of(cls, data: JobResult | Mapping[str, Any] | None) -> JobResult:
        """``data`` as a result: a result as is, a job row's JSON parsed (``None``: an empty
        result). A key whose value does not fit its type (a row written by hand, or by a
        version with other types) is left out rather than refused: the page of an old job
        still shows what it can.
        """
        if isinstance(data, JobResult):
            return data
        raw = dict(data or {})
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            bad = {err["loc"][0] for err in exc.errors() if err["loc"]}
            return cls.model_validate({k: v for k, v in raw.items() if k not in bad})

    def to_dict(self) -> dict[str, Any]:
        """The row's JSON: the keys that were set, nothing added."""
        return self.model_dump(mode="json", exclude_unset=True)

    @field_serializer("profile")
    def _profile_json(self, p: ProfileEvent | None) -> dict[str, Any] | None:
        return p.payload() if p is not None else None

    @field_serializer("lever")
    def _lever_json(self, lv: Lever | None) -> dict[str, Any] | None:
        return lv.to_dict() if lv is not None else None

    @field_serializer("preflight")
    def _preflight_json(self, p: PreflightResult | None) -> dict[str, Any] | None:
        return p.to_dict() if p is not None else None

    @field_serializer("tune")
    def _tune_json(self, t: TuneRecord | None) -> dict[str, Any] | None:
        return t.to_dict() if t is not None else None
