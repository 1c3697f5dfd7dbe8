"""The tune's record: one configuration under test (:class:`Configuration`), its row, the
``tune.json`` record of what is measured so far (:func:`tune_record`), the ``tune`` event
and the text table (:func:`format_tune`). The record's type is
:class:`~libreyolo_core.records.tune.TuneRecord`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from libreyolo_core.profiler.record import ProfileRecord
from libreyolo_core.profiler.tune.levers import TuneOptions, pct
from libreyolo_core.records.events import TuneEvent
from libreyolo_core.records.tune import TUNE_FILE, TUNE_SCHEMA, TuneJudgement, TuneRecord, TuneRow

__all__ = ["NO_LEVER", "SCHEMA", "TUNE_NAME", "Configuration", "TuneState", "format_tune",
           "tune_event", "tune_record"]

SCHEMA = TUNE_SCHEMA
TUNE_NAME = TUNE_FILE
#: The answer when nothing beats the baseline beyond noise.
NO_LEVER = "no significant lever on this device"


@dataclass
class Configuration:
    """One configuration under test and what its trials measured.

    Attributes:
        name, label, changes, side_effect, group, why: the lever it applies (the baseline:
            none). results: its trials (:class:`~libreyolo_core.profiler.trial.TrialResult`).
        aggregate: their ``profile_repeat.json``. judgement: the rule's call against the
            baseline. comparison: ``profile compare``'s, as a dict. skipped: why it was not
            measured. epoch_s: the expected epoch time (seconds) at its ``batch``.
    """

    name: str
    label: str
    changes: dict[str, Any]
    side_effect: str | None = None
    group: str = ""
    why: str = ""
    results: list[Any] = field(default_factory=list)  # TrialResult
    aggregate: ProfileRecord | None = None
    judgement: TuneJudgement | None = None
    comparison: dict[str, Any] | None = None
    skipped: str | None = None
    epoch_s: float | None = None
    batch: int = 0

    @property
    def recommendable(self) -> bool:
        """Measured, judged, and every condition of the rule holds."""
        return self.judgement is not None and self.judgement.recommendable

    @property
    def img_per_s(self) -> float:
        """The aggregate's mean img/s (0 when not measured)."""
        return float(self.aggregate.img_per_s or 0.0) if self.aggregate is not None else 0.0

    def row(self) -> TuneRow:
        """Its row of ``tune.json`` (and the ``tune_candidate`` event)."""
        a = self.aggregate if self.aggregate is not None else ProfileRecord()
        j = self.judgement
        return TuneRow(
            name=self.name, label=self.label, params=self.changes,
            side_effect=self.side_effect, why=self.why,
            img_per_s=a.img_per_s, img_per_s_std=a.img_per_s_std,
            n=a.img_per_s_n if "img_per_s_n" in a.model_fields_set else len(self.results),
            img_per_s_trials=a.img_per_s_trials,
            step_ms=a.step_ms, dataload_frac=a.dataload_frac,
            verdict=a.verdict, reliable=a.confidence.reliable if a.confidence else None,
            other_cpu_frac=a.load.other_cpu_frac if a.load else None,
            batch=self.batch, epoch_s=self.epoch_s,
            significant=j.significant if j else None, gain=j.gain if j else None,
            gain_low=j.gain_low if j else None, separated=j.separated if j else None,
            load_bound=j.load_bound if j else None,
            environment=(self.comparison or {}).get("environment"),
            recommendable=self.recommendable,
            note=self.skipped or (j.note if j else None),
            skipped=self.skipped is not None,
            profile=f"trials/{self.name}/profile_repeat.json" if self.aggregate is not None else None,
            trials=[f"trials/{r.run_dir.name}/profile.json" for r in self.results],
        )


@dataclass
class TuneState:
    """What a tune knows so far, for its record: the configurations (the baseline first),
    ``status`` (``complete``, ``budget``, ``cancelled``), the notes, what was tuned, the
    fitted ``window`` and the options."""

    model: str
    data: str
    base: dict[str, Any]
    opt: TuneOptions
    configs: list[Configuration] = field(default_factory=list)
    status: str = "complete"
    notes: list[str] = field(default_factory=list)
    window: tuple[int, int] = (0, 0)
    images: int = 0

    def done_trials(self) -> int:
        """Trials measured so far, every configuration together."""
        return sum(len(c.results) for c in self.configs)


def _fmt_params(params: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def recommended(configs: Sequence[Configuration]) -> Configuration | None:
    """The candidate to recommend: the fastest recommendable speed-only one (the
    combination when it is at least as fast as the best single lever), else the fastest
    recommendable one with a side effect; ``None`` when none is recommendable."""
    measured = [c for c in configs if c.aggregate is not None]
    good = [c for c in measured if c.recommendable]
    speed = [c for c in good if c.side_effect is None]
    pool = speed or good
    if not pool:
        return None
    rec = max(pool, key=lambda c: c.img_per_s)
    combo = next((c for c in speed if c.name == "combined"), None)
    singles = [c.img_per_s for c in speed if c.name != "combined"]
    if combo is not None and singles and combo.img_per_s >= max(singles):
        rec = combo
    return rec


def _answer(state: TuneState, rec: Configuration | None) -> str:
    """The answer in words (see :func:`tune_record`)."""
    base = state.configs[0]
    measured = [c for c in state.configs[1:] if c.aggregate is not None]
    if base.aggregate is None:
        answer = ("no answer: the baseline was not measured "
                  + ("(cancelled)" if state.status == "cancelled" else "(time budget)"))
    elif rec is not None:
        answer = _recommendation(base, rec)
    elif not measured:
        answer = _nothing_measured(state)
    else:
        tried = len(measured)
        answer = (f"{NO_LEVER}: {tried} candidate{'s' if tried != 1 else ''} tried, none beat "
                  "the baseline beyond noise (significant beyond 2 x SE, at least "
                  f"{100 * state.opt.min_gain:.0f}% faster, every trial faster, not explained "
                  "by the machine's load)")
    if state.status == "budget":
        answer += " [stopped at the time budget: not every candidate was measured]"
    elif state.status == "cancelled":
        answer += " [cancelled: not every candidate was measured]"
    return answer


def _recommendation(base: Configuration, rec: Configuration) -> str:
    named = _fmt_params(rec.changes)
    gain = rec.judgement.gain if rec.judgement is not None else None
    answer = (f"recommended: {named}{'' if rec.label == named else f' ({rec.label})'}: "
              f"{base.img_per_s:.1f} -> {rec.img_per_s:.1f} img/s ({pct(gain)})")
    if rec.epoch_s is not None and base.epoch_s is not None:
        answer += f", epoch {base.epoch_s:.1f} s -> {rec.epoch_s:.1f} s"
    if rec.side_effect:
        answer += f"; note: it {rec.side_effect}"
    return answer


def _nothing_measured(state: TuneState) -> str:
    """The answer when no candidate was measured (the baseline was)."""
    base = state.configs[0]
    assert base.aggregate is not None
    skipped = [c for c in state.configs[1:] if c.skipped]
    if state.status != "complete":
        return f"no answer yet: stopped ({state.status}) before any candidate was measured"
    if skipped:
        return (f"no answer: none of the {len(skipped)} candidates could be measured ("
                + "; ".join(f"{c.label}: {c.skipped}" for c in skipped) + ")")
    helps = base.aggregate.lever.also if base.aggregate.lever is not None else []
    return (f"{NO_LEVER}: the verdict ({base.aggregate.verdict}) names no lever "
            f"that exists on this device ({base.aggregate.device_type})"
            + (f"; what helps instead: {', '.join(helps)}" if helps else ""))


def tune_record(state: TuneState, elapsed_s: float) -> TuneRecord:
    """The ``tune.json`` record of what is measured so far.

    Args:
        state: the tune so far (the baseline first in ``state.configs``).
        elapsed_s: seconds since the tune started.

    Returns:
        The record: ``status``, ``device``, ``verdict`` (the baseline's) and ``verdicts``
        (its trials'), one row per configuration, ``recommended`` (a row or ``None``),
        ``recommended_params`` (the baseline's keys with the recommended changes, without
        ``device`` and ``cache_dir``: where this machine runs is no parameter to train
        with), ``answer``, ``also`` (faster levers that change the training), the epoch
        times, ``notes``, ``trials_run``.
    """
    base = state.configs[0]
    rec = recommended(state.configs[1:])
    also = [f"{c.label}: {pct(c.judgement.gain if c.judgement else None)} img/s, "
            f"but it {c.side_effect}"
            for c in state.configs[1:]
            if c.aggregate is not None and c.recommendable and c.side_effect is not None
            and c is not rec]
    agg = base.aggregate
    params = {k: v for k, v in state.base.items() if k not in ("device", "cache_dir")}
    if rec is not None:
        params.update(rec.changes)
    return TuneRecord(
        schema_=SCHEMA, status=state.status, device=agg.device_type if agg is not None else None,
        verdict=agg.verdict if agg is not None else None,
        verdicts=agg.trial_verdicts if agg is not None else None,
        model=state.model, data=state.data, config=state.base,
        train_images=state.images,
        window={"warmup": state.window[0], "steps": state.window[1]},
        options=state.opt.to_dict(),
        baseline=base.row(), candidates=[c.row() for c in state.configs[1:]],
        recommended=rec.row() if rec is not None else None,
        recommended_params=params, answer=_answer(state, rec), also=also,
        expected_epoch_s=(rec or base).epoch_s, baseline_epoch_s=base.epoch_s,
        notes=list(state.notes), trials_run=state.done_trials(),
        elapsed_s=round(elapsed_s, 1),
    )


def tune_event(res: TuneRecord) -> TuneEvent:
    """The ``tune`` event: the answer without the per-trial detail."""
    rec = res.recommended
    return TuneEvent(status=res.status, answer=res.answer, verdict=res.verdict,
                     recommended_params=res.recommended_params,
                     recommended=rec.label if rec is not None else None,
                     gain=rec.gain if rec is not None else None,
                     expected_epoch_s=res.expected_epoch_s,
                     baseline_epoch_s=res.baseline_epoch_s,
                     candidates=len(res.candidates), trials_run=res.trials_run)


def _table_row(r: TuneRow) -> str:
    ips = "—" if r.img_per_s is None else f"{r.img_per_s:.1f} ± {r.img_per_s_std or 0:.1f} ({r.n})"
    base = r.name == "baseline"
    sig = "—" if base else {True: "yes", False: "no", None: "—"}[r.significant]
    step = f"{r.step_ms:.0f}" if r.step_ms is not None else "—"
    gain = pct(r.gain) if r.gain is not None else "—"
    note = "" if base else (r.note or "")
    return (f"{str(r.label)[:34]:34s} {ips:>22s} {step:>8s} "
            f"{str(r.verdict or '—'):>12s} {sig:>8s} {gain:>6s}  {note}")


def format_tune(res: TuneRecord | Mapping[str, Any]) -> str:
    """The result as a text table: one row per configuration, then the answer.

    Args:
        res: a :class:`~libreyolo_core.records.tune.TuneRecord` or ``tune.json``'s dict
            (keys it lacks take the record's defaults).

    Raises:
        pydantic.ValidationError: a value of the wrong type (a ``ValueError``).
    """
    t = TuneRecord.of(res)
    head = (f"{'configuration':34s} {'img/s (mean ± std, n)':>22s} {'step ms':>8s} "
            f"{'verdict':>12s} {'signif.':>8s} {'gain':>6s}  note")
    lines = [head, *(_table_row(r) for r in [t.baseline or TuneRow(), *t.candidates])]
    lines.append(f"answer: {t.answer if 'answer' in t.model_fields_set else None}")
    lines.extend(f"also faster: {a}" for a in t.also)
    if t.expected_epoch_s is not None:
        lines.append(f"expected epoch time: {t.expected_epoch_s:.1f} s "
                     f"(baseline {t.baseline_epoch_s or 0:.1f} s, "
                     f"{t.train_images} images)")
    lines.extend(f"note: {n}" for n in t.notes)
    return "\n".join(lines)
