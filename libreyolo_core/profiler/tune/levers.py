"""The tune's levers and its rule: what to try for a verdict (:func:`candidate_levers`) and
when a candidate is recommended (:func:`judge`, :func:`load_bound`); the options
(:class:`TuneOptions`). Pure functions over repeat aggregates: no training, no files.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from libreyolo_core.profiler import verdict as V
from libreyolo_core.profiler.record import ProfileRecord
from libreyolo_core.records.tune import TuneJudgement

__all__ = ["TuneLever", "TuneOptions", "candidate_levers", "judge", "judgement",
           "lighter_augmentation", "load_bound"]


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
class TuneLever:
    """One change a tune tries (not :class:`~libreyolo_core.profiler.record.Lever`, the
    advice a single profile's verdict gives).

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


_BATCH_EFFECT = ("changes the batch the optimizer steps on (lr0 is per batch; nbs "
                 "accumulation keeps the effective batch): results may differ")


def _batch_up(batch: int, why: str) -> list[TuneLever]:
    if batch < 1:
        return []
    return [TuneLever("batch_up", f"batch {batch} -> {2 * batch}", {"batch": 2 * batch},
                      "batch", _BATCH_EFFECT, why)]


def _dataloader_levers(config: Mapping[str, Any], batch: int, workers: int,
                       cores: int) -> list[TuneLever]:
    out = []
    more = min(max(2 * workers, workers + 2), max(cores, 1))
    if more > workers:
        out.append(TuneLever("workers", f"workers {workers} -> {more}", {"workers": more},
                             "workers", None,
                             f"more loader processes work in parallel ({cores} cores)"))
    if config.get("cache") != "ram":
        out.append(TuneLever("cache", "cache=ram", {"cache": "ram"}, "cache", None,
                             "images are decoded and resized once and kept in RAM"))
    light = lighter_augmentation(config)
    if light:
        key = next(iter(light))
        out.append(TuneLever("light_aug", f"{key}=0 (lighter augmentation)", light,
                             "augmentation",
                             f"changes the augmentation ({key} off): accuracy may change",
                             "fewer images loaded and mixed per sample"))
    return out + _batch_up(batch, "a larger batch spreads the per-step overhead over more images")


def _compute_levers(config: Mapping[str, Any], bf16_supported: bool) -> list[TuneLever]:
    """AMP, bf16 and compile: they pay on a GPU only (the caller asks on ``cuda`` only)."""
    out = []
    if not config.get("amp", True):
        out.append(TuneLever("amp", "amp=True", {"amp": True}, "precision", None,
                             "mixed precision puts gemm/conv on Tensor Cores"))
    if bf16_supported and not (config.get("amp", True) and config.get("amp_dtype") == "bfloat16"):
        out.append(TuneLever("bf16", "amp=True amp_dtype=bfloat16",
                             {"amp": True, "amp_dtype": "bfloat16"}, "precision", None,
                             "bf16 autocast: no loss scaling, Tensor Cores"))
    if not config.get("compile"):
        out.append(_compile_lever("fused elementwise kernels: less memory traffic"))
    return out


def _host_levers(config: Mapping[str, Any], batch: int, cuda: bool,
                 cuda_graph_supported: bool) -> list[TuneLever]:
    out = []
    if cuda and cuda_graph_supported and not config.get("cuda_graph"):
        out.append(TuneLever("cuda_graph", "cuda_graph=True", {"cuda_graph": True}, "cuda_graph",
                             None, "the step replays as one graph launch"))
    if cuda and not config.get("compile"):
        out.append(_compile_lever("fused kernels: fewer launches"))
    return out + _batch_up(batch, "a larger micro-batch gives each kernel launch more work")


def candidate_levers(verdicts: Sequence[str], config: Mapping[str, Any], *, device_type: str,
                     cpu_count: int | None = None, bf16_supported: bool = False,
                     cuda_graph_supported: bool = True) -> list[TuneLever]:
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
    out: dict[str, TuneLever] = {}
    for v in dict.fromkeys(verdicts):
        found: list[TuneLever] = []
        if v == V.DATALOADER:
            found = _dataloader_levers(config, batch, workers, cores)
        elif v == V.COMPUTE and cuda:  # a CPU has no compute lever
            found = _compute_levers(config, bf16_supported)
        elif v == V.HOST:
            found = _host_levers(config, batch, cuda, cuda_graph_supported)
        elif v == V.MEMORY and batch > 1:
            found = [TuneLever("batch_down", f"batch {batch} -> {batch // 2}",
                               {"batch": batch // 2}, "batch", _BATCH_EFFECT,
                               "memory headroom stops the allocator thrashing")]
        for lever in found:
            out.setdefault(lever.name, lever)
    levers = list(out.values())
    return [lv for lv in levers if lv.side_effect is None] + \
        [lv for lv in levers if lv.side_effect is not None]


def _compile_lever(why: str) -> TuneLever:
    """``compile=True``, on CUDA only (on a CPU it does not pay: docs/performance.md). Its
    group is ``cuda_graph``'s: the two are alternatives (compile wins when both are set),
    never combined. Each trial compiles again in its warm-up steps (a minute or more)."""
    return TuneLever("compile", "compile=True", {"compile": True}, "cuda_graph", None,
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
    if not fracs or any(f is None for f in fracs):
        return None
    return [float(f) for f in fracs if f is not None]


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


def pct(x: float | None) -> str:
    """A relative change as a signed percentage (``+12%``; ``n/a`` for ``None``)."""
    return "n/a" if x is None else ("+inf%" if math.isinf(x) else f"{100 * x:+.0f}%")


def judge(baseline: ProfileRecord | Mapping[str, Any], candidate: ProfileRecord | Mapping[str, Any],
          *, min_gain: float) -> tuple[Any, dict[str, Any]]:
    """Compare a candidate's aggregate with the baseline's and apply the rule (the
    package docstring, step 4).

    Args:
        baseline, candidate: ``profile_repeat.json`` aggregates
            (:func:`~libreyolo_core.profiler.cli.aggregate`), with ``img_per_s_trials`` and
            ``load.trials``.
        min_gain: the smallest relative gain recommended.

    Returns:
        ``(comparison, judgement)``: the :class:`~libreyolo_core.profiler.report.Comparison`,
        and :func:`judgement`'s record as a dict (``significant``, ``gain``, ``gain_low``,
        ``separated``, ``load_bound``, ``environment_explains``, ``recommendable``,
        ``note``).
    """
    comparison, j = judgement(baseline, candidate, min_gain=min_gain)
    return comparison, j.to_dict()


def judgement(baseline: ProfileRecord | Mapping[str, Any],
              candidate: ProfileRecord | Mapping[str, Any],
              *, min_gain: float) -> tuple[Any, TuneJudgement]:
    """:func:`judge` with the judgement typed: ``gain`` is the relative img/s gain of the
    means, ``gain_low`` the slowest candidate trial / the fastest baseline trial - 1,
    ``load_bound`` the baseline's img/s at most under the candidate's load
    (:func:`load_bound`), ``note`` why, in words."""
    from libreyolo_core.profiler.report import compare_profiles

    base, cand = ProfileRecord.of(baseline), ProfileRecord.of(candidate)
    c = compare_profiles(base, cand)
    # the statistical call; whether the load explains it is judged here (load_bound)
    sig = True if c.significance.get("beyond_noise") else c.significance.get("significant")
    ib, ic = base.img_per_s, cand.img_per_s
    tb = list(base.img_per_s_trials or ([ib] if ib is not None else []))
    tc = list(cand.img_per_s_trials or ([ic] if ic is not None else []))
    gain = ic / ib - 1.0 if ib and ic is not None else None
    gain_low = min(tc) / max(tb) - 1.0 if tb and tc and max(tb) > 0 else None
    separated = gain_low is not None and gain_low > 0
    bound = load_bound(base, cand)
    env = c.environment
    env_explains = env.may_explain is True and not (
        bound is not None and tc and min(tc) > bound)
    recommendable = bool(sig is True and gain is not None and gain > 0 and gain >= min_gain
                         and separated and not env_explains)
    note = _note(c, sig, gain, gain_low, min_gain, separated, env_explains, bound, tb, tc)
    # a delta the environment explains is not called significant anywhere
    shown = None if sig is True and env_explains else sig
    return c, TuneJudgement(
        significant=shown, gain=None if gain is None else round(gain, 4),
        gain_low=None if gain_low is None else round(gain_low, 4), separated=separated,
        load_bound=None if bound is None or math.isinf(bound) else round(bound, 3),
        environment_explains=env_explains, recommendable=recommendable, note=note)


def _note(c: Any, sig: bool | None, gain: float | None, gain_low: float | None,
          min_gain: float, separated: bool, env_explains: bool, bound: float | None,
          tb: list[float], tc: list[float]) -> str:
    """Why the rule called a candidate so, in words (the first condition that failed)."""
    env = c.environment
    if sig is None:
        return f"no significance call: {c.significance.get('reason')}"
    if gain is None:
        return "no img/s"
    if gain <= 0:
        return f"slower than the baseline ({pct(gain)})"
    if not sig:
        return f"not significant: {c.significance.get('reason')}"
    if gain < min_gain:
        return f"the gain {pct(gain)} is below the {100 * min_gain:.0f}% minimum"
    if not separated:
        return (f"the trials overlap: the slowest candidate trial ({min(tc):.1f} img/s) did not "
                f"beat the fastest baseline trial ({max(tb):.1f} img/s)")
    if env_explains:
        return f"not recommended, the load may explain it: {env.note}"
    note = (f"faster beyond noise: {pct(gain)} img/s ({c.significance.get('reason')}; "
            f"every trial faster, the slowest by {pct(gain_low)})")
    if env.may_explain and bound is not None:
        note += (f". The machine was loaded ({env.note.split(': ', 1)[-1].split('. ')[0]}), "
                 f"but under the candidate's load the baseline would have reached at most "
                 f"{bound:.1f} img/s, and the slowest candidate trial ran {min(tc):.1f}: the "
                 "load does not explain the gain")
    return note
