"""A job's ``result`` as typed data (:class:`JobResult`), the SDK's view of the engine's
record (``libreyolo_core.records.result.JobResult``; the SDK does not import the engine,
``tests/client/test_client_contract.py`` keeps the fields in step).

Pydantic; unknown fields are kept, not refused.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from libreyolo_client._models import Preflight, TuneReport

__all__ = ["JobResult", "LeverAdvice"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class LeverAdvice(_Model):
    """The lever a profile's verdict suggests: ``params`` (training keys and the values to
    try; empty when no key helps), ``why`` (one sentence), ``also`` (advice that is no
    training key), the ``verdict`` it answers."""

    verdict: str | None = None
    params: dict[str, Any] = {}
    why: str = ""
    also: list[str] = []


class JobResult(_Model):
    """A finished job's ``result`` (``JobInfo.result``).

    ``status``: the engine's end (``completed``, ``interrupted``, ...); ``best_epoch``
    (1-based), ``metrics`` (the best or last validation), ``epochs_completed``, ``names``
    (class id -> name), ``data`` (each split's scan: images, boxes, defects); a profile
    job's ``verdict``, ``bound_why``, ``lever`` and ``profile`` (its ``profile`` event);
    ``preflight`` (the estimate with its ``actual`` timing; see :class:`Preflight`);
    ``predict`` (a predict job's summary); a tune job's ``tune`` (:class:`TuneReport`),
    ``answer`` and ``recommended_params``.
    """

    status: str | None = None
    best_epoch: int | None = None
    metrics: dict[str, Any] | None = None
    epochs_completed: int | None = None
    names: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    verdict: str | None = None
    bound_why: str | None = None
    lever: LeverAdvice | None = None
    profile: dict[str, Any] | None = None
    preflight: dict[str, Any] | None = None
    predict: dict[str, Any] | None = None
    tune: TuneReport | None = None
    answer: str | None = None
    recommended_params: dict[str, Any] | None = None

    @classmethod
    def of(cls, data: dict[str, Any] | None) -> JobResult:
        """``JobInfo.result`` as typed data (``None``: an empty result). A field whose value
        does not fit its type (a service of another version) is left out, not refused."""
        raw = dict(data or {})
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            bad = {err["loc"][0] for err in exc.errors() if err["loc"]}
            return cls.model_validate({k: v for k, v in raw.items() if k not in bad})

    @property
    def estimate(self) -> Preflight | None:
        """The preflight estimate as :class:`Preflight` (``None`` without one, or without
        its ``total_s``)."""
        pf = self.preflight
        if not isinstance(pf, dict) or pf.get("total_s") is None:
            return None
        return Preflight.model_validate(pf)
