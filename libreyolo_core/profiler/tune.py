"""Tune: profile a configuration, try the levers its verdict names, recommend only real gains.

:func:`run_tune` (``libreyolo profile tune``, a service job of kind ``tune``):

1. **Baseline.** The configuration is profiled ``repeat`` times
   (:func:`~libreyolo_core.profiler.trial.run_trial`; the window is fitted into one epoch).
2. **Candidates.** The trials' verdicts name the levers (:func:`candidate_levers`), only
   those that exist on the device: ``dataloader`` -> more ``workers``, ``cache=ram``, a
   lighter augmentation, a larger batch; ``compute`` -> ``amp``, bf16 on a GPU that has it;
   ``host/launch`` -> ``cuda_graph=True``, ``compile=True``, a larger batch; ``memory-pressure``
   -> a smaller batch (``compute`` also tries ``compile=True`` on a GPU). A CPU never tries
   AMP, bf16, CUDA graphs or compile: its verdict is ``dataloader`` (the
   loader levers and a larger batch) or ``compute`` (no lever exists on the device, as
   ``verdict.lever`` says: the answer is "no significant lever on this device").
   Levers that only change speed come first; those that change what is trained (the
   augmentation, the batch) after them. At most ``max_candidates`` are profiled.
3. **Each candidate** is profiled ``repeat`` times the same way and compared with the
   baseline by ``profile compare``
   (:func:`~libreyolo_core.profiler.report.compare_profiles`).
4. **The rule** (:func:`judge`). A candidate is *recommendable* only when all hold:

   - ``compare`` calls it significant: ``|delta img/s| > 2 x SE``, ``SE = sqrt(sa^2/na +
     sb^2/nb)``, and the delta is a gain;
   - the gain is at least ``min_gain`` (default 5 %);
   - every candidate trial beat every baseline trial (with 3 trials a side, chance alone
     does that 1 time in 20);
   - the environment does not explain it: ``compare``'s environment note does not say the
     load may explain the delta, or, when it does, the load **cannot** have made the gain:
     a process gets at most the CPU that others leave, so a baseline trial that ran while
     other processes took a share ``f_b`` of the CPU would have run at most
     ``(1 - f_c) / (1 - f_b)`` times faster under the least loaded candidate trial's share
     ``f_c`` (:func:`load_bound`); the slowest candidate trial must beat the fastest
     baseline trial so adjusted. The table says so in words whenever it applies.
5. **Combination.** When two or more speed-only levers are recommendable, their union is
   profiled too and recommended if it is recommendable and at least as fast as the best
   single one. The recommendation prefers speed-only levers; a faster lever that changes
   the training is named under ``also`` with what it changes (it is recommended only when
   no speed-only lever is).
6. **Result** (``tune.json``, the ``tune`` event): one row per configuration (img/s mean
   ± std over the trials, step ms, verdict, significant yes/no, gain, the reason), the
   recommended parameter set and the expected epoch time with it; or ``"no significant
   lever on this device"`` with why.

Bounded: ``budget_s`` (the next trial is not started when the mean trial so far would end
past it: the result then says ``status: budget``) and ``max_candidates``. SIGTERM (a
cancelled job) stops after the current step of the current trial (the trainer's own stop)
or before the next trial; ``tune.json`` keeps what was measured, and
:class:`TuneInterrupted` ends the command like an interrupted training run (exit 143). A
re-attempt in the same run directory reuses the trials already finished.

Files in the run directory: ``tune.json``, ``events.jsonl`` (``run_start``, ``progress``
with ``phase: "tuning"``, ``tune_candidate``, ``tune``, ``artifact``, ``run_end``), one
folder per trial under ``trials/`` (``profile.json``, ``timeline.html``; the trial's
printed lines in ``trials/<name>.log``) and ``trials/<configuration>/profile_repeat.json``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from libreyolo_core.profiler import verdict as V
from libreyolo_core.profiler.record import ProfileRecord
from libreyolo_core.records.events import (
    ArtifactEvent,
    EngineEvent,
    ProgressEvent,
    RunEndEvent,
    RunStartEvent,
    TuneCandidateEvent,
    TuneEvent,
)
from libreyolo_core.records.job import JobSpec

__all__ = ["TuneOptions", "Lever", "TuneInterrupted", "candidate_levers", "judge", "load_bound",
           "run_tune", "run_tune_job", "format_tune", "SCHEMA", "TUNE_NAME", "NO_LEVER"]

SCHEMA = "libreyolo.tune/v1"
TUNE_NAME = "tune.json"
#: The answer when nothing beats the baseline beyond noise.
NO_LEVER = "no significant lever on this device"
#: Training keys the tune never passes to a trial (the trial sets its own).
_RESERVED = ("model", "data", "project", "name", "exist_ok", "resume", "preflight", "profile",
             "profile_then_stop", "profile_steps", "profile_warmup", "profile_open", "val")


class TuneInterrupted(RuntimeError):
    """SIGTERM stopped the tune; ``tune.json`` holds what was measured (``path``)."""

    def __init__(self, message: str, path: str | os.PathLike[str] | None = None):
        super().__init__(message)
        self.path = None if path is None else str(path)


@dataclass(frozen=True)
class TuneOptions:
    """How hard a tune looks.

    Attributes:
        repeat: trials per configuration (2-10; significance needs 2, 3 is the default).
        warmup, steps: the profile window of every trial (fitted into one epoch).
        max_candidates: configurations profiled besides the baseline (1-12).
        budget_s: wall-clock budget in seconds (``None``: none).
        min_gain: the smallest relative img/s gain recommended (0.05 = 5 %).
    """

    repeat: int = 3
    warmup: int = 3
    steps: int = 10
    max_candidates: int = 6
    budget_s: float | None = 1800.0
    min_gain: float = 0.05

    def __post_init__(self) -> None:
        checks = (("repeat", 2 <= self.repeat <= 10, "2 to 10 (significance needs 2 trials)"),
                  ("warmup", 0 <= self.warmup <= 1000, "0 to 1000"),
                  ("steps", 2 <= self.steps <= 1000, "2 to 1000"),
                  ("max_candidates", 1 <= self.max_candidates <= 12, "1 to 12"),
                  ("budget_s", self.budget_s is None
                   or (math.isfinite(self.budget_s) and self.budget_s > 0),
                   "a finite number > 0 of seconds"),
                  ("min_gain", 0 <= self.min_gain < 10, "0 to 10 (a fraction: 0.05 = 5%)"))
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(f"tune option {name}={getattr(self, name)!r}: must be {allowed}")

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any] | None) -> TuneOptions:
        """From a dict (a job spec's ``tune``); ``None`` values take the defaults.

        Raises:
            ValueError: an unknown option or a value out of range (naming it).
        """
        d = {k: v for k, v in (d or {}).items() if v is not None}
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown tune option(s) {', '.join(unknown)}; valid: "
                             f"{', '.join(cls.__dataclass_fields__)}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict."""
        return asdict(self)


@dataclass(frozen=True)
class Lever:
    """One change to try.

    Attributes:
        name: ``workers``, ``cache``, ``light_aug``, ``batch_up``, ``batch_down``, ``amp``,
            ``bf16``, ``cuda_graph``, ``compile`` (or ``combined``).
        label: what changes, in words (``workers 0 -> 2``).
        params: the training keys to change and their values.
        group: levers of one group are alternatives (never combined).
        side_effect: what it changes besides speed (``None``: speed only).
        why: why the verdict points at it.
    """

    name: str
    label: str
    params: dict[str, Any]
    group: str
    side_effect: str | None
    why: str


def lighter_augmentation(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The lighter augmentation to try: mixup off when mosaic and mixup are on (a mixed
    mosaic loads 8 images per sample instead of 4), else mosaic off; ``None`` when both
    are off."""
    if float(config.get("mosaic") or 0) > 0 and float(config.get("mixup") or 0) > 0:
        return {"mixup": 0.0}
    if float(config.get("mosaic") or 0) > 0:
        return {"mosaic": 0.0}
    return None


def candidate_levers(verdicts: Sequence[str], config: Mapping[str, Any], *, device_type: str,
                     cpu_count: int | None = None, bf16_supported: bool = False,
                     cuda_graph_supported: bool = True) -> list[Lever]:
    """The levers the baseline's verdicts name, that exist on ``device_type``.

    Args:
        verdicts: the baseline trials' verdicts (several when they disagree: the levers of
            each, once).
        config: the baseline's resolved training keys (``workers``, ``batch``, ``cache``,
            ``mosaic``, ``mixup``, ``amp``, ``amp_dtype``, ``cuda_graph``, ``compile``).
        device_type: ``cpu``, ``cuda`` or ``mps``: AMP, bf16, CUDA graphs and compile only
            on ``cuda``.
        cpu_count: cores for the loader workers (default: the cores this process may use).
        bf16_supported: the GPU runs bf16 autocast (``torch.cuda.is_bf16_supported()``).
        cuda_graph_supported: the model's family allows CUDA-graph capture.

    Returns:
        Speed-only levers first, then those with a side effect; each lever once.
    """
    cores = cpu_count or _cores()
    cuda = device_type == "cuda"
    batch = int(config.get("batch") or 16)
    workers = int(config.get("workers") or 0)
    if workers < 0:  # automatic: what this machine gives a run
        from libreyolo_core.data.workers import resolved_workers

        workers = resolved_workers(workers)
    out: dict[str, Lever] = {}

    def add(lever: Lever) -> None:
        out.setdefault(lever.name, lever)

    batch_effect = ("changes the batch the optimizer steps on (lr0 is per batch; nbs "
                    "accumulation keeps the effective batch): results may differ")

    def batch_up(why: str) -> None:
        if batch >= 1:
            add(Lever("batch_up", f"batch {batch} -> {2 * batch}", {"batch": 2 * batch},
                      "batch", batch_effect, why))

    for v in dict.fromkeys(verdicts):
        if v == V.DATALOADER:
            more = min(max(2 * workers, workers + 2), max(cores, 1))
            if more > workers:
                add(Lever("workers", f"workers {workers} -> {more}", {"workers": more}, "workers",
                          None, f"more loader processes work in parallel ({cores} cores)"))
            if config.get("cache") != "ram":
                add(Lever("cache", "cache=ram", {"cache": "ram"}, "cache", None,
                          "images are decoded and resized once and kept in RAM"))
            light = lighter_augmentation(config)
            if light:
                key = next(iter(light))
                add(Lever("light_aug", f"{key}=0 (lighter augmentation)", light, "augmentation",
                          f"changes the augmentation ({key} off): accuracy may change",
                          "fewer images loaded and mixed per sample"))
            batch_up("a larger batch spreads the per-step overhead over more images")
        elif v == V.COMPUTE:
            if not cuda:  # AMP, bf16 and compile pay on a GPU only: a CPU has no compute lever
                continue
            if not config.get("amp", True):
                add(Lever("amp", "amp=True", {"amp": True}, "precision", None,
                          "mixed precision puts gemm/conv on Tensor Cores"))
            if bf16_supported and not (config.get("amp", True)
                                       and config.get("amp_dtype") == "bfloat16"):
                add(Lever("bf16", "amp=True amp_dtype=bfloat16",
                          {"amp": True, "amp_dtype": "bfloat16"}, "precision", None,
                          "bf16 autocast: no loss scaling, Tensor Cores"))
            if not config.get("compile"):
                add(_compile_lever("fused elementwise kernels: less memory traffic"))
        elif v == V.HOST:
            if cuda and cuda_graph_supported and not config.get("cuda_graph"):
                add(Lever("cuda_graph", "cuda_graph=True", {"cuda_graph": True}, "cuda_graph",
                          None, "the step replays as one graph launch"))
            if cuda and not config.get("compile"):
                add(_compile_lever("fused kernels: fewer launches"))
            batch_up("a larger micro-batch gives each kernel launch more work")
        elif v == V.MEMORY and batch > 1:
            add(Lever("batch_down", f"batch {batch} -> {batch // 2}", {"batch": batch // 2},
                      "batch", batch_effect, "memory headroom stops the allocator thrashing"))
    levers = list(out.values())
    return [lv for lv in levers if lv.side_effect is None] + \
        [lv for lv in levers if lv.side_effect is not None]


def _compile_lever(why: str) -> Lever:
    """``compile=True``, on CUDA only (on a CPU it does not pay: docs/performance.md). Its
    group is ``cuda_graph``'s: the two are alternatives (compile wins when both are set),
    never combined. Each trial compiles again in its warm-up steps (a minute or more)."""
    return Lever("compile", "compile=True", {"compile": True}, "cuda_graph", None,
                 f"torch.compile: {why} (each trial compiles for a minute or more first)")


def _cores() -> int:
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


# -- the rule -------------------------------------------------------------------------------
def _trial_fracs(p: ProfileRecord) -> list[float] | None:
    """Other processes' CPU share during each trial of an aggregate (``None`` if unknown)."""
    load = p.load.to_dict() if p.load is not None else {}
    trials = load.get("trials") or [load]
    fracs = [t.get("other_cpu_frac") for t in trials if isinstance(t, Mapping)]
    return None if not fracs or any(f is None for f in fracs) else [float(f) for f in fracs]


def load_bound(baseline: ProfileRecord | Mapping[str, Any],
               candidate: ProfileRecord | Mapping[str, Any]) -> float | None:
    """The most img/s the baseline could have reached under the candidate's load: each
    baseline trial's img/s x ``(1 - f_c) / (1 - f_b)``, its own other-process CPU share
    ``f_b`` replaced by the least loaded candidate trial's ``f_c`` (a process gets at most
    the CPU that others leave, so its throughput grows at most in that ratio), the largest
    over the baseline trials. ``None`` when a load is unknown, ``inf`` when a baseline
    trial had no CPU left."""
    base, cand = ProfileRecord.of(baseline), ProfileRecord.of(candidate)
    fb, fc = _trial_fracs(base), _trial_fracs(cand)
    ips = list(base.img_per_s_trials or [])
    if fb is None or fc is None or len(ips) != len(fb):
        return None
    best = min(fc)
    if max(fb) >= 1.0:
        return math.inf
    return max(b * (1.0 - best) / (1.0 - f) for b, f in zip(ips, fb, strict=True))


def _pct(x: float | None) -> str:
    return "n/a" if x is None else ("+inf%" if math.isinf(x) else f"{100 * x:+.0f}%")


def judge(baseline: ProfileRecord | Mapping[str, Any], candidate: ProfileRecord | Mapping[str, Any],
          *, min_gain: float) -> tuple[Any, dict[str, Any]]:
    """Compare a candidate's aggregate with the baseline's and apply the rule (module
    docstring, step 4).

    Args:
        base, cand: ``profile_repeat.json`` aggregates (:func:`~.cli.aggregate`), with
            ``img_per_s_trials`` and ``load.trials``.
        min_gain: the smallest relative gain recommended.

    Returns:
        ``(comparison, verdict)``: the :class:`~.report.Comparison`, and ``{"significant",
        "gain", "gain_low", "separated", "load_bound", "environment_explains",
        "recommendable", "note"}`` (``gain``: relative img/s gain of the means; ``gain_low``:
        slowest candidate trial / fastest baseline trial - 1; ``load_bound``: the baseline's
        img/s at most under the candidate's load, :func:`load_bound`; ``note``: why, in
        words).
    """
    from libreyolo_core.profiler.report import compare_profiles

    base, cand = ProfileRecord.of(baseline), ProfileRecord.of(candidate)
    c = compare_profiles(base, cand)
    # the statistical call; whether the load explains it is judged here (load_bound)
    sig = True if c.significance.get("beyond_noise") else c.significance.get("significant")
    ib, ic = base.img_per_s, cand.img_per_s
    tb = list(base.img_per_s_trials or [ib])
    tc = list(cand.img_per_s_trials or [ic])
    gain = ic / ib - 1.0 if ib and ic is not None else None
    gain_low = min(tc) / max(tb) - 1.0 if tb and tc and max(tb) > 0 else None
    separated = gain_low is not None and gain_low > 0
    bound = load_bound(base, cand)
    env = c.environment
    env_explains = env.may_explain is True and not (
        bound is not None and tc and min(tc) > bound)
    faster = gain is not None and gain > 0
    recommendable = bool(sig is True and faster and gain >= min_gain and separated
                         and not env_explains)
    if sig is None:
        note = f"no significance call: {c.significance.get('reason')}"
    elif not faster:
        note = f"slower than the baseline ({_pct(gain)})" if gain is not None else "no img/s"
    elif not sig:
        note = f"not significant: {c.significance.get('reason')}"
    elif gain < min_gain:
        note = f"the gain {_pct(gain)} is below the {100 * min_gain:.0f}% minimum"
    elif not separated:
        note = (f"the trials overlap: the slowest candidate trial ({min(tc):.1f} img/s) did not "
                f"beat the fastest baseline trial ({max(tb):.1f} img/s)")
    elif env_explains:
        note = f"not recommended, the load may explain it: {env.note}"
    else:
        note = (f"faster beyond noise: {_pct(gain)} img/s ({c.significance.get('reason')}; "
                f"every trial faster, the slowest by {_pct(gain_low)})")
        if env.may_explain:
            note += (f". The machine was loaded ({env.note.split(': ', 1)[-1].split('. ')[0]}), "
                     f"but under the candidate's load the baseline would have reached at most "
                     f"{bound:.1f} img/s, and the slowest candidate trial ran {min(tc):.1f}: the "
                     "load does not explain the gain")
    # a delta the environment explains is not called significant anywhere
    shown = None if sig is True and env_explains else sig
    return c, {"significant": shown, "gain": None if gain is None else round(gain, 4),
               "gain_low": None if gain_low is None else round(gain_low, 4),
               "separated": separated,
               "load_bound": None if bound is None or math.isinf(bound) else round(bound, 3),
               "environment_explains": env_explains, "recommendable": recommendable,
               "note": note}


# -- the loop ---------------------------------------------------------------------------------
@dataclass
class _Config:
    """One configuration under test and what its trials measured."""

    name: str
    label: str
    changes: dict[str, Any]
    side_effect: str | None = None
    group: str = ""
    why: str = ""
    results: list[Any] = field(default_factory=list)  # TrialResult
    aggregate: ProfileRecord | None = None
    verdict: dict[str, Any] | None = None
    comparison: dict[str, Any] | None = None
    skipped: str | None = None
    epoch_s: float | None = None
    batch: int = 0

    def row(self) -> dict[str, Any]:
        a = self.aggregate if self.aggregate is not None else ProfileRecord()
        v = self.verdict or {}
        return {
            "name": self.name, "label": self.label, "params": self.changes,
            "side_effect": self.side_effect, "why": self.why,
            "img_per_s": a.img_per_s, "img_per_s_std": a.img_per_s_std,
            "n": a.img_per_s_n if "img_per_s_n" in a.model_fields_set else len(self.results),
            "img_per_s_trials": a.img_per_s_trials,
            "step_ms": a.step_ms, "dataload_frac": a.dataload_frac,
            "verdict": a.bound, "reliable": a.confidence.reliable if a.confidence else None,
            "other_cpu_frac": a.load.other_cpu_frac if a.load else None,
            "batch": self.batch, "epoch_s": self.epoch_s,
            "significant": v.get("significant"), "gain": v.get("gain"),
            "gain_low": v.get("gain_low"), "separated": v.get("separated"),
            "load_bound": v.get("load_bound"),
            "environment": (self.comparison or {}).get("environment"),
            "recommendable": bool(v.get("recommendable")),
            "note": self.skipped or v.get("note"),
            "skipped": self.skipped is not None,
            "profile": f"trials/{self.name}/profile_repeat.json" if self.aggregate is not None else None,
            "trials": [f"trials/{r.run_dir.name}/profile.json" for r in self.results],
        }


class _Stop(Exception):
    """Internal: the budget is spent."""


class _Tuner:
    def __init__(self, data: str, model: str, run_dir: Path, base: dict[str, Any],
                 options: TuneOptions, out: TextIO, emit: Callable[[EngineEvent], Any]):
        self.data, self.model, self.run_dir, self.base = str(data), str(model), run_dir, base
        self.opt, self.out, self.emit = options, out, emit
        self.t0 = time.monotonic()
        self.durations: list[float] = []
        self.stop_requested = False
        self.status = "complete"
        self.notes: list[str] = []
        self.configs: list[_Config] = []
        self.planned = options.repeat
        self.window = (options.warmup, options.steps)
        self.trace = False
        self.images = 0

    # -- helpers ----------------------------------------------------------------------
    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def _check_budget(self) -> None:
        if self.stop_requested:
            raise TuneInterrupted("SIGTERM")
        if self.opt.budget_s is None:
            return
        elapsed = time.monotonic() - self.t0
        mean = statistics.fmean(self.durations) if self.durations else 0.0
        if elapsed + mean > self.opt.budget_s:
            raise _Stop(f"the time budget of {self.opt.budget_s:g} s would run out during the "
                        f"next trial ({elapsed:.0f} s spent, a trial takes ~{mean:.0f} s)")

    def _done_trials(self) -> int:
        return sum(len(c.results) for c in self.configs)

    def _progress(self, cfg: _Config, index: int, k: int) -> None:
        mean = statistics.fmean(self.durations) if self.durations else None
        left = self.planned - self._done_trials()
        self.emit(ProgressEvent(
            phase="tuning", candidate=cfg.label, candidate_index=index,
            candidates=max(len(self.configs) - 1, 0), trial=k, trials=self.opt.repeat,
            trials_done=self._done_trials(), trials_planned=self.planned,
            **({"eta_s": round(mean * left, 1)} if mean is not None else {})))

    def _trial(self, cfg: _Config, index: int, k: int) -> Any:
        """Run (or reuse) trial ``k`` of ``cfg``."""
        from libreyolo_core.engine.trainer import TrainingInterrupted
        from libreyolo_core.profiler.trial import NoProfileError, TrialResult, run_trial

        self._check_budget()
        name = f"{cfg.name}_{k}"
        trials = self.run_dir / "trials"
        trials.mkdir(parents=True, exist_ok=True)
        keys = {**self.base, **cfg.changes, "profile_trace": self.trace}
        stamp = trials / name / "trial.json"
        want = {"model": self.model, "data": self.data, "keys": keys, "window": list(self.window)}
        with contextlib.suppress(OSError, ValueError, NoProfileError):
            if json.loads(stamp.read_text(encoding="utf-8")) == json.loads(json.dumps(want)):
                result = TrialResult.from_run_dir(trials / name)
                self.say(f"  {cfg.label}: trial {k}/{self.opt.repeat} reused from an earlier "
                         f"attempt: {result.img_per_s:.1f} img/s")
                return result
        self._progress(cfg, index, k)
        t = time.monotonic()
        engine_log = logging.getLogger("libreyolo_core")
        level = engine_log.level
        engine_log.setLevel(logging.WARNING)  # a trial's info lines go to its own log
        try:
            with open(trials / f"{name}.log", "w", encoding="utf-8") as log:
                result = run_trial(self.data, self.model, project=trials, name=name,
                                   warmup=self.window[0], steps=self.window[1], stdout=log, **keys)
        except TrainingInterrupted:
            import shutil

            shutil.rmtree(trials / name / "weights", ignore_errors=True)  # the stop's last.pt
            raise TuneInterrupted(f"SIGTERM during {cfg.label}, trial {k}") from None
        finally:
            engine_log.setLevel(level)
        self.durations.append(time.monotonic() - t)
        stamp.write_text(json.dumps(want), encoding="utf-8")
        self.say(f"  {cfg.label}: trial {k}/{self.opt.repeat}: {result.img_per_s:.1f} img/s, "
                 f"step {result.step_ms:.0f} ms, {result.verdict}"
                 + ("" if result.reliable is not False else " (unreliable window)"))
        return result

    def measure(self, cfg: _Config, index: int) -> None:
        """Profile ``cfg`` ``repeat`` times and aggregate (skips on a window that does not
        fit its epoch or a configuration the engine refuses)."""
        from libreyolo_core.profiler.window import ProfileWindowError

        self.say(f"{'baseline' if index == 0 else f'candidate {index}'}: {cfg.label}")
        for k in range(1, self.opt.repeat + 1):
            try:
                cfg.results.append(self._trial(cfg, index, k))
            except ProfileWindowError as exc:
                if index == 0:
                    raise
                cfg.skipped = (f"skipped: the {self.window[0]} + {self.window[1]}-step window "
                               f"does not fit one epoch at batch {exc.batch} ({exc.available} "
                               "steps)")
                self.planned -= self.opt.repeat - len(cfg.results)
                cfg.results.clear()
                return
            except (TuneInterrupted, _Stop):
                raise
            except Exception as exc:  # noqa: BLE001 - a candidate the engine refuses
                if index == 0:
                    raise
                cfg.skipped = f"skipped: the trial failed ({type(exc).__name__}: {exc})"[:500]
                self.planned -= self.opt.repeat - len(cfg.results)
                cfg.results.clear()
                return
        self.summarise(cfg)

    def summarise(self, cfg: _Config) -> None:
        """Aggregate ``cfg``'s trials so far into ``profile_repeat.json`` and its epoch time
        (also for a configuration a stop cut short: what was measured is kept)."""
        from libreyolo_core.profiler.artifacts import write_json
        from libreyolo_core.profiler.cli import aggregate

        profiles = [r.profile for r in cfg.results]
        paths = [str(r.profile_path) for r in cfg.results]
        cfg.aggregate = aggregate(profiles, paths)
        (self.run_dir / "trials" / cfg.name).mkdir(parents=True, exist_ok=True)
        write_json(self.run_dir / "trials" / cfg.name / "profile_repeat.json", cfg.aggregate.to_dict())
        cfg.batch = int(cfg.aggregate.config.get("batch") or 0)
        if cfg.batch and cfg.aggregate.step_ms:
            steps = self.images // cfg.batch if self.images >= cfg.batch else 1
            cfg.epoch_s = round(steps * cfg.aggregate.step_ms / 1e3, 3)

    def summarise_partial(self) -> None:
        """After a stop: every configuration with measured trials but no aggregate gets one
        from the trials it has (its row's ``n`` says how many), so ``tune.json`` keeps the
        numbers; fewer trials than ``repeat`` are never judged significant."""
        for cfg in self.configs:
            if cfg.results and cfg.aggregate is None and cfg.skipped is None:
                self.summarise(cfg)
                self.notes.append(f"{cfg.label}: {len(cfg.results)} of {self.opt.repeat} "
                                  "trials measured before the stop")

    def judge(self, cfg: _Config, base: _Config) -> None:
        comp, verdict = judge(base.aggregate, cfg.aggregate, min_gain=self.opt.min_gain)
        cfg.comparison, cfg.verdict = comp.to_dict(), verdict
        sig = {True: "significant", False: "not significant", None: "no call"}[verdict["significant"]]
        self.say(f"  -> {cfg.aggregate.img_per_s:.1f} ± {cfg.aggregate.img_per_s_std or 0:.1f}"
                 f" img/s vs {base.aggregate.img_per_s:.1f}: {sig}, "
                 f"{'RECOMMENDABLE' if verdict['recommendable'] else 'not recommended'}: "
                 f"{verdict['note']}")
        self.emit(TuneCandidateEvent(**cfg.row()))


def _resolved(model: str, base: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """The baseline's resolved training keys and whether its family allows CUDA graphs."""
    from libreyolo_core.config import resolve_config
    from libreyolo_core.facade import is_weights_path
    from libreyolo_core.models.registry import parse_model_name

    name = model
    if is_weights_path(model):
        from libreyolo_core.weights.load import load_weights

        w = load_weights(model)
        name = f"{w.family}-{w.size}"
    cfg = resolve_config({**base, "model": name})
    return cfg.model_dump(mode="json"), bool(parse_model_name(name)[0].cuda_graph)


def _fit_window(cfgs: Mapping[str, Any], images: int, warmup: int, steps: int) -> tuple[int, int] | None:
    from libreyolo_core.engine.optim import accumulate_steps
    from libreyolo_core.profiler.window import _fit

    batch = int(cfgs.get("batch") or 16)
    available = images // batch if images >= batch else 1
    return _fit(available, warmup, steps, accumulate_steps(batch, cfgs.get("nbs")))


def run_tune(data: str | Path, model: str = "yolo9-t", *, run_dir: str | Path,
             base: Mapping[str, Any] | None = None, options: TuneOptions | None = None,
             stdout: TextIO | None = None, events: Any = None) -> dict[str, Any]:
    """Tune ``model`` on ``data`` (module docstring): the baseline, the candidates, the rule.

    Args:
        data: dataset yaml. model: a model name or weights file.
        run_dir: the tune's folder (``tune.json``, ``trials/``); created, reused.
        base: the baseline's training keys (``batch``, ``imgsz``, ``workers``, ``device``...).
        options: :class:`TuneOptions`.
        stdout: where the progress lines go (default: this process's stdout).
        events: an :class:`~libreyolo_core.engine.events.EventLog` for the service (``None``:
            no events).

    Returns:
        The ``tune.json`` dict: ``schema``, ``status`` (``complete``, ``budget``),
        ``device``, ``verdict``, ``baseline`` and ``candidates`` (rows: ``label``,
        ``params``, ``img_per_s``, ``img_per_s_std``, ``n``, ``step_ms``, ``verdict``,
        ``significant``, ``gain``, ``recommendable``, ``note``, ``epoch_s``...),
        ``recommended`` (a row, or ``None``), ``recommended_params`` (the whole parameter
        set to train with), ``answer``, ``also``, ``expected_epoch_s``,
        ``baseline_epoch_s``, ``options``, ``notes``, ``trials_run``, ``elapsed_s``.

    Raises:
        TuneInterrupted: SIGTERM; ``tune.json`` was written first (``status: cancelled``).
        ProfileWindowError: one epoch of the baseline cannot hold even the smallest window.
        ValueError: an unknown key in ``base``; whatever the baseline's training raises.
    """
    from libreyolo_core.data.config import load_data_config
    from libreyolo_core.profiler.artifacts import write_json

    opt = options or TuneOptions()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    out = stdout or sys.stdout
    base_keys = {k: v for k, v in dict(base or {}).items() if k not in _RESERVED and v is not None}
    emit = events.write if events is not None else (lambda event: event)
    tuner = _Tuner(str(data), str(model), run_dir, base_keys, opt, out, emit)
    resolved, graphs_ok = _resolved(str(model), base_keys)
    tuner.images = len(load_data_config(data).train)
    fit = _fit_window(resolved, tuner.images, opt.warmup, opt.steps)
    if fit is None:
        from libreyolo_core.profiler.window import ProfileWindowError, plan_window

        batch = int(resolved.get("batch") or 16)
        raise ProfileWindowError(opt.warmup + opt.steps, tuner.images // max(batch, 1), batch,
                                 images=tuner.images, window=plan_window(opt.warmup, opt.steps))
    if fit != (opt.warmup, opt.steps):
        tuner.notes.append(f"the window was fitted into one epoch: warmup {fit[0]}, steps "
                           f"{fit[1]} (asked {opt.warmup} + {opt.steps})")
    tuner.window = fit
    cuda = str(resolved.get("device", "auto")) not in ("cpu", "mps") and _cuda_available()
    tuner.trace = cuda  # a GPU verdict needs the trace's utilisation; a CPU one does not
    previous = _install_sigterm(tuner)
    emit(RunStartEvent(config=base_keys, run_dir=str(run_dir.resolve()), tune=opt.to_dict()))
    path = run_dir / TUNE_NAME
    baseline = _Config("baseline", "baseline", {}, why="the configuration as given")
    tuner.configs.append(baseline)
    status, error = "succeeded", None

    def write() -> dict[str, Any]:
        res = _result(tuner, resolved)
        write_json(path, res)
        return res

    try:
        tuner.say(f"tune: {opt.repeat} trials per configuration, window {fit[0]} + {fit[1]} "
                  f"steps, at most {opt.max_candidates} candidates"
                  + (f", budget {opt.budget_s:g} s" if opt.budget_s else ""))
        tuner.measure(baseline, 0)
        device = baseline.aggregate.device_type or "cpu"
        verdicts = [b for b in baseline.aggregate.trial_bounds or [] if b]
        levers = candidate_levers(verdicts, resolved, device_type=device,
                                  bf16_supported=device == "cuda" and _bf16(),
                                  cuda_graph_supported=graphs_ok)
        if len(levers) > opt.max_candidates:
            tuner.notes.append(f"{len(levers)} levers apply; the cap of {opt.max_candidates} "
                               "left out: " + ", ".join(lv.label for lv in levers[opt.max_candidates:]))
            levers = levers[:opt.max_candidates]
        for lv in levers:
            tuner.configs.append(_Config(lv.name, lv.label, dict(lv.params), lv.side_effect,
                                         lv.group, lv.why))
        tuner.planned = opt.repeat * len(tuner.configs)
        tuner.say(f"baseline verdict: {baseline.aggregate.bound}; candidates: "
                  + (", ".join(lv.label for lv in levers) or "none on this device"))
        write()
        for i, cfg in enumerate(list(tuner.configs[1:]), 1):
            tuner.measure(cfg, i)
            if cfg.aggregate is not None:
                tuner.judge(cfg, baseline)
            write()
        combo = _combination(tuner.configs[1:])
        if combo is not None and len(tuner.configs) - 1 < opt.max_candidates:
            tuner.configs.append(combo)
            tuner.planned += opt.repeat
            tuner.measure(combo, len(tuner.configs) - 1)
            if combo.aggregate is not None:
                tuner.judge(combo, baseline)
        elif combo is not None:
            tuner.notes.append(f"the combination {combo.label} was not profiled: the cap of "
                               f"{opt.max_candidates} candidates is reached")
    except _Stop as stop:
        tuner.summarise_partial()
        tuner.status = "budget"
        tuner.notes.append(f"stopped: {stop}")
        tuner.say(f"stopped: {stop}")
    except TuneInterrupted as exc:
        tuner.summarise_partial()
        tuner.status, status = "cancelled", "interrupted"
        tuner.notes.append(f"cancelled: {exc}")
        res = write()
        emit(ArtifactEvent(path=TUNE_NAME, kind="tune"))
        emit(TuneEvent(**_event(res)))
        emit(RunEndEvent(status=status, error=None))
        raise TuneInterrupted(str(exc), path) from None
    except BaseException as exc:
        status, error = "failed", f"{type(exc).__name__}: {exc}"
        emit(RunEndEvent(status=status, error=error))
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    res = write()
    emit(ArtifactEvent(path=TUNE_NAME, kind="tune"))
    emit(TuneEvent(**_event(res)))
    emit(RunEndEvent(status=status, error=error))
    tuner.say(format_tune(res))
    return res


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


def _bf16() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    except Exception:  # noqa: BLE001
        return False


def _install_sigterm(tuner: _Tuner) -> Any:
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: Any) -> None:  # noqa: ARG001
        tuner.stop_requested = True
        print("SIGTERM received: the tune stops before the next trial", file=sys.stderr, flush=True)

    return signal.signal(signal.SIGTERM, handler)


def _combination(configs: Sequence[_Config]) -> _Config | None:
    """The union of the recommendable speed-only candidates (the best of each group), when
    two or more groups have one."""
    best: dict[str, _Config] = {}
    for c in configs:
        if c.side_effect is None and c.verdict and c.verdict.get("recommendable"):
            if c.group not in best or c.aggregate.img_per_s > best[c.group].aggregate.img_per_s:
                best[c.group] = c
    if len(best) < 2:
        return None
    parts = list(best.values())
    changes: dict[str, Any] = {}
    for c in parts:
        changes.update(c.changes)
    return _Config("combined", " + ".join(c.label for c in parts), changes,
                   why="the recommendable speed-only levers together")


def _fmt_params(params: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def _result(tuner: _Tuner, resolved: Mapping[str, Any]) -> dict[str, Any]:
    """The ``tune.json`` dict of what is measured so far (see :func:`run_tune`)."""
    base = tuner.configs[0]
    measured = [c for c in tuner.configs[1:] if c.aggregate is not None]
    good = [c for c in measured if c.verdict and c.verdict["recommendable"]]
    speed = [c for c in good if c.side_effect is None]
    pool = speed or good
    rec = None
    if pool:
        rec = max(pool, key=lambda c: c.aggregate.img_per_s)
        combo = next((c for c in speed if c.name == "combined"), None)
        if combo is not None and combo.aggregate.img_per_s >= max(
                c.aggregate.img_per_s for c in speed if c.name != "combined"):
            rec = combo
    also = [f"{c.label}: {_pct(c.verdict['gain'])} img/s, but it {c.side_effect}"
            for c in good if c.side_effect is not None and c is not rec]
    device = base.aggregate.device_type if base.aggregate is not None else None
    tried = len(measured)
    if base.aggregate is None:
        answer = ("no answer: the baseline was not measured "
                  + ("(cancelled)" if tuner.status == "cancelled" else "(time budget)"))
    elif rec is not None:
        named = _fmt_params(rec.changes)
        answer = (f"recommended: {named}{'' if rec.label == named else f' ({rec.label})'}: "
                  f"{base.aggregate.img_per_s:.1f} -> {rec.aggregate.img_per_s:.1f} img/s "
                  f"({_pct(rec.verdict['gain'])})")
        if rec.epoch_s is not None and base.epoch_s is not None:
            answer += f", epoch {base.epoch_s:.1f} s -> {rec.epoch_s:.1f} s"
        if rec.side_effect:
            answer += f"; note: it {rec.side_effect}"
    elif tried == 0:
        skipped = [c for c in tuner.configs[1:] if c.skipped]
        if tuner.status != "complete":
            answer = f"no answer yet: stopped ({tuner.status}) before any candidate was measured"
        elif skipped:
            answer = (f"no answer: none of the {len(skipped)} candidates could be measured ("
                      + "; ".join(f"{c.label}: {c.skipped}" for c in skipped) + ")")
        else:
            helps = base.aggregate.lever.also if base.aggregate.lever is not None else []
            answer = (f"{NO_LEVER}: the verdict ({base.aggregate.bound}) names no lever "
                      f"that exists on this device ({device})"
                      + (f"; what helps instead: {', '.join(helps)}" if helps else ""))
    else:
        answer = (f"{NO_LEVER}: {tried} candidate{'s' if tried != 1 else ''} tried, none beat "
                  "the baseline beyond noise (significant beyond 2 x SE, at least "
                  f"{100 * tuner.opt.min_gain:.0f}% faster, every trial faster, not explained "
                  "by the machine's load)")
    if tuner.status == "budget":
        answer += " [stopped at the time budget: not every candidate was measured]"
    elif tuner.status == "cancelled":
        answer += " [cancelled: not every candidate was measured]"
    # where this machine runs and keeps its caches: not parameters to train with
    params = {k: v for k, v in tuner.base.items() if k not in ("device", "cache_dir")}
    if rec is not None:
        params.update(rec.changes)
    return {
        "schema": SCHEMA, "status": tuner.status, "device": device,
        "verdict": base.aggregate.bound if base.aggregate is not None else None,
        "verdicts": base.aggregate.trial_bounds if base.aggregate is not None else None,
        "model": tuner.model, "data": tuner.data, "config": tuner.base,
        "train_images": tuner.images, "window": {"warmup": tuner.window[0], "steps": tuner.window[1]},
        "options": tuner.opt.to_dict(),
        "baseline": base.row(), "candidates": [c.row() for c in tuner.configs[1:]],
        "recommended": rec.row() if rec is not None else None,
        "recommended_params": params, "answer": answer, "also": also,
        "expected_epoch_s": (rec or base).epoch_s, "baseline_epoch_s": base.epoch_s,
        "notes": list(tuner.notes), "trials_run": tuner._done_trials(),
        "elapsed_s": round(time.monotonic() - tuner.t0, 1),
    }


def _event(res: Mapping[str, Any]) -> dict[str, Any]:
    """The ``tune`` event: the answer without the per-trial detail."""
    rec = res.get("recommended") or {}
    return {"status": res["status"], "answer": res["answer"], "verdict": res.get("verdict"),
            "recommended_params": res.get("recommended_params"),
            "recommended": rec.get("label"), "gain": rec.get("gain"),
            "expected_epoch_s": res.get("expected_epoch_s"),
            "baseline_epoch_s": res.get("baseline_epoch_s"),
            "candidates": len(res.get("candidates") or []), "trials_run": res.get("trials_run")}


def format_tune(res: Mapping[str, Any]) -> str:
    """The result as a text table: one row per configuration, then the answer."""
    head = (f"{'configuration':34s} {'img/s (mean ± std, n)':>22s} {'step ms':>8s} "
            f"{'verdict':>12s} {'signif.':>8s} {'gain':>6s}  note")
    lines = [head]
    for r in [res.get("baseline") or {}, *(res.get("candidates") or [])]:
        if r.get("img_per_s") is None:
            ips = "—"
        else:
            ips = f"{r['img_per_s']:.1f} ± {r.get('img_per_s_std') or 0:.1f} ({r.get('n')})"
        sig = {True: "yes", False: "no", None: "—"}[r.get("significant")]
        if r.get("name") == "baseline":
            sig = "—"
        step = f"{r['step_ms']:.0f}" if r.get("step_ms") is not None else "—"
        gain = _pct(r.get("gain")) if r.get("gain") is not None else "—"
        note = "" if r.get("name") == "baseline" else (r.get("note") or "")
        lines.append(f"{str(r.get('label'))[:34]:34s} {ips:>22s} {step:>8s} "
                     f"{str(r.get('verdict') or '—'):>12s} {sig:>8s} {gain:>6s}  {note}")
    lines.append(f"answer: {res.get('answer')}")
    for a in res.get("also") or []:
        lines.append(f"also faster: {a}")
    if res.get("expected_epoch_s") is not None:
        lines.append(f"expected epoch time: {res['expected_epoch_s']:.1f} s "
                     f"(baseline {res.get('baseline_epoch_s') or 0:.1f} s, "
                     f"{res.get('train_images')} images)")
    for n in res.get("notes") or []:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def run_tune_job(spec: JobSpec) -> int:
    """Run the tune a service job's spec (``job.json``, ``kind: "tune"``) describes: run
    dir ``<project>/<name>``, events in its ``events.jsonl``, options from ``spec.tune``.

    Returns:
        0 (an answer was written: a recommendation, "no significant lever", or what the
        budget allowed).

    Raises:
        TuneInterrupted: SIGTERM (the job was cancelled). ValueError: a bad tune option.
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
