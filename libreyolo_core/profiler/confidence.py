"""How sure a verdict is: the spread of the window's steps and the machine's load.

One trial already measures a window of steps. Their spread says whether the steps repeat:
the coefficient of variation (CV = sample standard deviation / mean) of the unsynced step
times and of their data waits. The machine's load during the window
(:class:`~libreyolo_core.profiler.load.WindowLoad`) says whether something else competed
for the CPU. A verdict is **unreliable** when any of these holds (thresholds in
:mod:`libreyolo_core.profiler.verdict`):

- fewer than :data:`~.verdict.MIN_SPREAD_STEPS` unsynced steps: their spread is unknown;
- the step-time CV exceeds :data:`~.verdict.NOISY_STEP_CV`;
- the data-wait share is within :data:`~.verdict.MARGIN_SE` standard errors of the
  dataloader threshold (a close call between ``dataloader`` and the next rule);
- other processes took :data:`~.verdict.LOADED_OTHER_FRAC` or more of the machine's CPU.

An unreliable verdict says why and suggests ``--repeat``. Why this matters, as measured on
a 2-core machine: one loader-bound configuration profiled three times said ``dataloader``
twice (data wait 42 % of a 745 ms step) and ``compute`` once, when another process was
competing for the CPU (3,141 ms steps, data wait 12 %).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from libreyolo_core.profiler import verdict as V
from libreyolo_core.profiler.load import WindowLoad

__all__ = ["Confidence", "assess", "cv", "combine_confidence", "REPEAT_ADVICE"]

#: What an unreliable verdict suggests.
REPEAT_ADVICE = ("profile again with --repeat 3 (libreyolo profile run DATA ... --repeat 3), "
                 "on a machine with nothing else running")


def cv(values: Sequence[float]) -> float | None:
    """Coefficient of variation: sample std (n - 1) / mean; ``None`` for fewer than 2 values
    or a mean of 0."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    if mean <= 0:
        return None
    return statistics.stdev(values) / mean


@dataclass(frozen=True)
class Confidence:
    """How sure a verdict is (the ``confidence`` object of ``profile.json``).

    Attributes:
        reliable: False when the window is too noisy or the machine was loaded (``reasons``).
        reasons: one sentence per problem found, with its figures; empty when reliable.
        flags: the problems as names, one per reason: ``few_steps``, ``noisy_steps``,
            ``close_call``, ``short_window``, ``loaded`` (a repeat aggregate: those of any
            trial, and
            ``trials_disagree``).
        advice: what to do when unreliable (``--repeat``, more ``--steps``), else ``None``.
        steps: unsynced steps the spread comes from.
        step_ms_cv, dataload_ms_cv: CV of the unsynced step times and data waits (``None``
            with fewer than 2 steps, or a zero mean).
        dataload_frac_se: standard error of the per-step data-wait share.
        other_cpu_frac: other processes' share of the machine's CPU during the window
            (``None`` when the OS gave no reading).
    """

    reliable: bool
    reasons: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    advice: str | None = None
    steps: int = 0
    step_ms_cv: float | None = None
    dataload_ms_cv: float | None = None
    dataload_frac_se: float | None = None
    other_cpu_frac: float | None = None
    trials: tuple[dict[str, Any], ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (``trials`` only for a repeat aggregate)."""
        d = asdict(self)
        d["reasons"], d["flags"] = list(self.reasons), list(self.flags)
        if self.trials:
            d["trials"] = list(self.trials)
        else:
            d.pop("trials")
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Confidence | None:
        """Back from :meth:`to_dict`; ``None`` for a profile written before confidence."""
        if not isinstance(d, Mapping) or "reliable" not in d:
            return None
        return cls(
            reliable=bool(d["reliable"]), reasons=tuple(d.get("reasons") or ()),
            flags=tuple(d.get("flags") or ()),
            advice=d.get("advice"), steps=int(d.get("steps") or 0),
            step_ms_cv=d.get("step_ms_cv"), dataload_ms_cv=d.get("dataload_ms_cv"),
            dataload_frac_se=d.get("dataload_frac_se"), other_cpu_frac=d.get("other_cpu_frac"),
            trials=tuple(d.get("trials") or ()),
        )


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(float(x), nd)


def assess(step_ms: Sequence[float], dataload_ms: Sequence[float], load: WindowLoad | None,
           bound: str, fitted: str | None = None) -> Confidence:
    """Judge one window (see the module docstring for the rules).

    Args:
        step_ms, dataload_ms: per unsynced step, milliseconds (same length).
        load: the machine's load during the window, or ``None`` when not read.
        bound: the verdict; the close-call rule applies only where the data-wait rule was
            reached (not to ``memory-pressure``).
        fitted: the sentence of a window that was fitted into one epoch (shorter than
            asked): flag ``short_window``.
    """
    n = len(step_ms)
    step_cv, data_cv = cv(step_ms), cv(dataload_ms)
    fracs = [d / s for s, d in zip(step_ms, dataload_ms, strict=True) if s > 0]
    se = statistics.stdev(fracs) / math.sqrt(len(fracs)) if len(fracs) >= 2 else None
    reasons: list[str] = []
    flags: list[str] = []
    if n < V.MIN_SPREAD_STEPS:
        flags.append("few_steps")
        reasons.append(f"only {n} unsynced step{'s' if n != 1 else ''}: too few to measure "
                       f"their spread (use --steps {2 * V.MIN_SPREAD_STEPS} or more)")
    if step_cv is not None and step_cv > V.NOISY_STEP_CV:
        flags.append("noisy_steps")
        reasons.append(f"step time varies {100 * step_cv:.0f}% (CV) across the window, above "
                       f"{100 * V.NOISY_STEP_CV:.0f}%: the steps do not repeat")
    if se is not None and bound != V.MEMORY and fracs:
        frac = statistics.fmean(fracs)
        if abs(frac - V.DATALOADER_FRAC) < V.MARGIN_SE * se:
            flags.append("close_call")
            reasons.append(
                f"data wait {100 * frac:.0f}% ± {100 * se:.0f}% (standard error) is within "
                f"{V.MARGIN_SE:g} standard errors of the {100 * V.DATALOADER_FRAC:.0f}% "
                "dataloader threshold: a close call")
    if fitted:
        flags.append("short_window")
        reasons.append(f"{fitted}: a short window (a bigger dataset measures more steps)")
    other = load.other_cpu_frac if load is not None else None
    if load is not None and other is not None and other >= V.LOADED_OTHER_FRAC:
        flags.append("loaded")
        reasons.append(
            f"other processes took {100 * other:.0f}% of the machine's CPU during the window "
            f"({load.other_cpu_cores:.1f} of {load.cpu_count} cores; threshold "
            f"{100 * V.LOADED_OTHER_FRAC:.0f}%): they competed with this run")
    advice = None
    if reasons:
        advice = REPEAT_ADVICE + ("; and more --steps" if "few_steps" in flags else "")
    return Confidence(
        reliable=not reasons, reasons=tuple(reasons), flags=tuple(flags), advice=advice, steps=n,
        step_ms_cv=_r(step_cv), dataload_ms_cv=_r(data_cv), dataload_frac_se=_r(se),
        other_cpu_frac=_r(other),
    )


def combine_confidence(
    trials: Sequence[Confidence | None], bounds: Sequence[str | None]
) -> Confidence:
    """The confidence of ``--repeat`` trials: reliable when every trial is and their verdicts
    agree; each unreliable trial's reasons are kept, prefixed with its number."""
    reasons: list[str] = []
    flags: list[str] = []
    for i, c in enumerate(trials, 1):
        if c is None:
            reasons.append(f"trial {i}: no confidence recorded")
        else:
            reasons += [f"trial {i}: {r}" for r in c.reasons]
            flags += [f for f in c.flags if f not in flags]
    if len(set(bounds)) > 1:
        flags.append("trials_disagree")
        reasons.append("the trials' verdicts disagree: " + ", ".join(map(str, bounds)))
    known = [c for c in trials if c is not None]

    def mean(key: str) -> float | None:
        vals = [getattr(c, key) for c in known if getattr(c, key) is not None]
        return _r(statistics.fmean(vals)) if vals else None

    return Confidence(
        reliable=not reasons, reasons=tuple(reasons), flags=tuple(flags),
        advice=None if not reasons else "profile again on a machine with nothing else "
        "running, with more --steps and --repeat",
        steps=sum(c.steps for c in known), step_ms_cv=mean("step_ms_cv"),
        dataload_ms_cv=mean("dataload_ms_cv"), dataload_frac_se=mean("dataload_frac_se"),
        other_cpu_frac=mean("other_cpu_frac"),
        trials=tuple(c.to_dict() if c is not None else {} for c in trials),
    )
