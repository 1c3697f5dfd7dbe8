"""``tune.json`` as a typed record: :class:`TuneRecord`, its rows (:class:`TuneRow`) and the
rule's call on one candidate (:class:`TuneJudgement`).

Written by the tune (:mod:`libreyolo_core.profiler.tune`), read by the worker (a tune job's
``result["tune"]``, :mod:`worker.result`), the service's job page (also while the job runs,
from the run directory: :meth:`TuneRecord.read`) and the engine's own table
(:func:`~libreyolo_core.profiler.tune.format_tune`). The SDK mirrors it
(``libreyolo_client._models.TuneReport``; ``tests/client`` compares the fields).
Torch-free (pydantic only), frozen. Like :class:`~libreyolo_core.profiler.record.ProfileRecord`
a record writes back exactly the keys it was built or read with (:meth:`TuneRecord.to_dict`)
and keeps unknown keys (``extra="allow"``), so a file round-trips unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["TUNE_FILE", "TUNE_SCHEMA", "TuneJudgement", "TuneRecord", "TuneRow"]

TUNE_SCHEMA = "libreyolo.tune/v1"
#: The record's file name in a tune's run directory.
TUNE_FILE = "tune.json"

Number = int | float


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the keys that were set (built or read), nothing added."""
        return self.model_dump(mode="json", exclude_unset=True, by_alias=True)


class TuneJudgement(_Record):
    """The rule's call on one candidate against the baseline
    (:func:`~libreyolo_core.profiler.tune.judge`).

    Attributes:
        significant: ``profile compare``'s call (beyond 2 x SE); ``None`` when it makes
            none, or when the machine's load explains the delta.
        gain: relative img/s gain of the means (0.5 = +50 %). gain_low: slowest candidate
            trial / fastest baseline trial - 1. separated: ``gain_low > 0``.
        load_bound: the most img/s the baseline could have reached under the candidate's
            load (``None``: unknown or unbounded). environment_explains: the load may
            explain the gain. recommendable: every condition of the rule holds.
        note: why, in words.
    """

    significant: bool | None = None
    gain: Number | None = None
    gain_low: Number | None = None
    separated: bool = False
    load_bound: Number | None = None
    environment_explains: bool = False
    recommendable: bool = False
    note: str = ""


class TuneRow(_Record):
    """One configuration of a tune (the baseline or a candidate): what it changes and what
    its trials measured, the ``tune_candidate`` event's fields.

    Attributes:
        name: ``baseline``, a lever's name or ``combined``. label: what changes, in words.
        params: the training keys it changes. side_effect: what it changes besides speed.
        why: why it is tried.
        img_per_s, img_per_s_std, n, img_per_s_trials: the repeat aggregate's throughput
            (mean, population std, trials, each trial). step_ms, dataload_frac: its step.
        verdict: the aggregate's verdict (``mixed`` when trials disagree). reliable: how
            sure. other_cpu_frac: other processes' CPU share during its trials.
        batch, epoch_s: its batch and the expected epoch time (seconds).
        significant ... note: the :class:`TuneJudgement` against the baseline (the
            baseline's own are ``None``); ``environment``: the comparison's environment
            call; ``note`` also says why a skipped candidate was not measured.
        skipped: not measured. profile: its ``profile_repeat.json``, relative to the run
            directory. trials: each trial's ``profile.json``.
    """

    name: str = ""
    label: str = ""
    params: dict[str, Any] = {}
    side_effect: str | None = None
    why: str = ""
    img_per_s: Number | None = None
    img_per_s_std: Number | None = None
    n: int | None = None
    img_per_s_trials: list[Number] | None = None
    step_ms: Number | None = None
    dataload_frac: Number | None = None
    verdict: str | None = None
    reliable: bool | None = None
    other_cpu_frac: Number | None = None
    batch: int = 0
    epoch_s: Number | None = None
    significant: bool | None = None
    gain: Number | None = None
    gain_low: Number | None = None
    separated: bool | None = None
    load_bound: Number | None = None
    environment: dict[str, Any] | None = None
    recommendable: bool = False
    note: str | None = None
    skipped: bool = False
    profile: str | None = None
    trials: list[str] = []


class TuneRecord(_Record):
    """``tune.json``: a tune's answer and every configuration it measured.

    Attributes:
        status: ``complete``, ``budget`` (the time budget stopped it) or ``cancelled``.
        device: the baseline's device type. verdict: the baseline's verdict; verdicts: its
            trials' verdicts.
        model, data, config: what was tuned (``config``: the baseline's training keys).
        train_images: images of the training split. window: ``{"warmup", "steps"}`` of every
            trial. options: the :class:`~libreyolo_core.profiler.tune.TuneOptions`.
        baseline, candidates: the rows. recommended: the row recommended, or ``None``.
        recommended_params: the whole parameter set to train with. answer: the answer in
            words. also: faster levers that change the training.
        expected_epoch_s, baseline_epoch_s: seconds. notes: what limited the tune.
        trials_run: trials measured. elapsed_s: wall-clock seconds.
    """

    schema_: str = Field(TUNE_SCHEMA, alias="schema")
    status: str = "complete"
    device: str | None = None
    verdict: str | None = None
    verdicts: list[str | None] | None = None
    model: str | None = None
    data: str | None = None
    config: dict[str, Any] = {}
    train_images: int | None = None
    window: dict[str, int] = {}
    options: dict[str, Any] = {}
    baseline: TuneRow | None = None
    candidates: list[TuneRow] = []
    recommended: TuneRow | None = None
    recommended_params: dict[str, Any] = {}
    answer: str = ""
    also: list[str] = []
    expected_epoch_s: Number | None = None
    baseline_epoch_s: Number | None = None
    notes: list[str] = []
    trials_run: int = 0
    elapsed_s: Number | None = None

    @property
    def rows(self) -> list[TuneRow]:
        """The baseline (when measured or planned), then every candidate."""
        return ([self.baseline] if self.baseline is not None else []) + list(self.candidates)

    @classmethod
    def of(cls, data: TuneRecord | Mapping[str, Any]) -> TuneRecord:
        """``data`` as a record: a record as is, a mapping (a file's JSON) parsed.

        Raises:
            pydantic.ValidationError: a value of the wrong type (a ``ValueError``).
        """
        if isinstance(data, TuneRecord):
            return data
        return cls.model_validate(dict(data))

    @classmethod
    def read(cls, path: Path) -> TuneRecord:
        """The record in ``path`` (a tune's ``tune.json``).

        Raises:
            OSError: unreadable. ValueError: not a JSON object, or a value of the wrong type.
        """
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"{path}: not a JSON object")
        return cls.model_validate(data)
