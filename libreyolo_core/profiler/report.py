"""Plain-text views of a profile (what ``finish`` prints and the CLI readers show)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from libreyolo_core.profiler.record import LoadRecord, PhaseRow, ProfileRecord

__all__ = [
    "format_summary",
    "format_phases",
    "format_rows",
    "compare_profiles",
    "format_compare",
    "significance",
    "Comparison",
    "Environment",
    "environment",
    "side_load",
    "load_text",
    "confidence_lines",
]


def _f(v: Any, nd: int = 2, unit: str = "") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int | float):
        return f"{v:.{nd}f}{unit}"
    return f"{v}{unit}"


def format_summary(profile: ProfileRecord | Mapping[str, Any]) -> str:
    """Several lines: figures, verdict with its reason and lever, kernel/op mix, top kernels."""
    p = ProfileRecord.of(profile)
    cfg, w = p.config, p.window
    lines = []
    if p.memory_pressure:
        lines.append("!! MEMORY PRESSURE: utilisation and img/s below are unreliable !!")
    lines.append(
        f"profile: {cfg.get('model', p.model)} on {cfg.get('device', p.device_type)}"
        f", batch {cfg.get('batch')}, imgsz {cfg.get('imgsz')}, amp {cfg.get('amp')}, "
        f"workers {cfg.get('workers')}; warmup {w.warmup}, measured "
        f"{w.real_steps} unsynced + {w.synced_steps} synced steps"
    )
    n = p.img_per_s_n
    ips = _f(p.img_per_s, 1)
    if n and n > 1:
        ips += f" ± {_f(p.img_per_s_std, 1)} (n={n})"
    frac = p.dataload_frac or 0.0
    lines.append(
        f"step {_f(p.step_ms, 1, ' ms')}, {ips} img/s, data wait "
        f"{_f(p.dataload_ms, 1, ' ms')} ({100 * frac:.0f}%)"
    )
    lines += _utilisation_lines(p)
    lines.append(f"verdict: {p.verdict} — {p.bound_why}")
    lines += confidence_lines(p)
    lines += _lever_lines(p)
    if p.categories:
        lines.append("mix: " + ", ".join(f"{c['name']} {c['pct']:.0f}%" for c in p.categories))
    gpu = bool(p.top_kernels)
    top = p.top_kernels if gpu else p.ops[:8]
    if top:
        lines.append("top kernels:" if gpu else "top CPU ops (self time):")
        key = "kernel" if gpu else "op"
        for r in top[:8]:
            lines.append(
                f"  {r['ms_per_step']:9.3f} ms/step  {r['count_per_step']:7.1f}x  "
                f"{r.get('category', ''):17s} {r[key]}"
            )
    for note in p.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def _utilisation_lines(p: ProfileRecord) -> list[str]:
    """The utilisation lines of :func:`format_summary`: CPU ops on a CPU run; GPU busy,
    kernels, VRAM, Tensor Cores, memcpy and host overhead on a GPU run."""
    if p.device_type == "cpu":
        return [
            "utilisation: not applicable (CPU run); CPU ops "
            f"{_f(p.cpu_ops_ms_per_step, 1, ' ms/step')}, "
            f"{_f(p.ops_per_step, 0)} ops/step"
        ]
    util = p.gpu_util
    return [
        f"GPU util {_f(100 * util if util is not None else None, 0, '%')} "
        f"({_f(p.gpu_busy_ms_per_step, 1)} ms busy / "
        f"{_f(p.step_ms, 1)} ms step), "
        f"{_f(p.kernels_per_step, 0)} kernels/step @ "
        f"~{_f(p.mean_kernel_us, 0)} µs, "
        f"peak VRAM {_f(p.peak_vram_mb, 0, ' MB')}, Tensor Cores "
        f"{_f(p.tensorcore_pct, 0, '%')}",
        f"memcpy {_f(p.memcpy_ms_per_step, 2, ' ms/step')}, host overhead "
        f"{_f(p.host_overhead_ms_per_step, 1, ' ms/step')}, launches/step "
        f"{_f(p.launches_per_step, 0)}, cudaMalloc/Free per step "
        f"{_f(p.cuda_mallocs_per_step, 1)}",
    ]


def _lever_lines(p: ProfileRecord) -> list[str]:
    """The ``lever:`` line of :func:`format_summary` (none when the profile names no lever)."""
    lv = p.lever
    if lv is not None and lv.params:
        return ["lever: try " + " ".join(f"{k}={v}" for k, v in lv.params.items())
                + f" ({lv.why})"]
    if lv is not None and lv.why:
        return [f"lever: {lv.why}" + (f"; {'; '.join(lv.also)}" if lv.also else "")]
    return [f"lever: {p.levers}"] if p.levers else []


def _pct(v: Any) -> str:
    return "n/a" if v is None else f"{100 * v:.0f}%"


def load_text(load: LoadRecord | Mapping[str, Any] | None) -> str:
    """``other processes 0.8 of 2 cores (40% of the CPU), load average 1.9``: one side's load
    during its window (a repeat aggregate: the mean over trials), or ``not recorded``."""
    if not load:
        return "not recorded"
    load = LoadRecord.model_validate(load) if isinstance(load, Mapping) else load
    parts = []
    if load.other_cpu_frac is not None:
        cores = load.other_cpu_cores
        part = f"other processes {_pct(load.other_cpu_frac)} of the CPU"
        if cores is not None:
            part += f" ({cores:.1f} of {load.cpu_count} cores)"
        if load.other_cpu_frac_max is not None:
            part += f", at most {_pct(load.other_cpu_frac_max)} in one trial"
        parts.append(part)
    if load.loadavg_1m is not None:
        parts.append(f"load average {load.loadavg_1m:.2f} (1 min, this run included)")
    return ", ".join(parts) or "not recorded"


def confidence_lines(profile: ProfileRecord | Mapping[str, Any]) -> list[str]:
    """The spread of the window, the machine's load, and the unreliable warning if any."""
    p = ProfileRecord.of(profile)
    c = p.confidence
    if c is None:
        return ["confidence: not recorded (a profile rebuilt from a bare trace, or an older one)"]
    out = [
        f"spread: step time CV {_pct(c.step_ms_cv)}, data wait CV "
        f"{_pct(c.dataload_ms_cv)} over {c.steps} unsynced steps; machine: "
        f"{load_text(p.load)}"
    ]
    if c.reliable:
        out.append("confidence: reliable (steady steps, no competing load)")
    else:
        out.append("!! verdict UNRELIABLE: " + "; ".join(c.reasons))
        if c.advice:
            out.append(f"   {c.advice}")
    return out


def format_phases(rows: Sequence[PhaseRow]) -> str:
    """Table: phase, gpu ms, wall ms, cpu-op ms, kernels, ops (per step)."""
    out = [
        f"{'phase':12s} {'gpu_ms':>9s} {'wall_ms':>9s} {'cpu_ops_ms':>10s} "
        f"{'kernels':>8s} {'ops':>8s}"
    ]
    for r in rows:
        out.append(
            f"{r.phase:12s} {_f(r.gpu_ms_per_step, 3):>9s} "
            f"{_f(r.wall_ms_per_step, 3):>9s} {_f(r.cpu_ms_per_step, 3):>10s} "
            f"{_f(r.kernels_per_step, 1):>8s} {_f(r.ops_per_step, 1):>8s}"
        )
    return "\n".join(out)


def format_rows(rows: Sequence[Mapping[str, Any]], key: str) -> str:
    """Table of kernel (``key="kernel"``) or op (``key="op"``) rows."""
    pct = "pct_of_gpu" if key == "kernel" else "pct_of_cpu_ops"
    out = [f"{'ms/step':>9s} {'%':>6s} {'count':>7s} {'category':17s} {key}"]
    for r in rows:
        tc = " [TC]" if r.get("tensorcore") else ""
        out.append(
            f"{r['ms_per_step']:9.3f} {r.get(pct, 0):6.1f} {r['count_per_step']:7.1f} "
            f"{r.get('category', ''):17s} {r[key]}{tc}"
        )
    return "\n".join(out)


def significance(before: ProfileRecord | Mapping[str, Any],
                 after: ProfileRecord | Mapping[str, Any]) -> dict[str, Any]:
    """Is the img/s difference between two profiles real?

    Significant when ``|mean_b - mean_a| > 2 * SE`` with ``SE = sqrt(sa²/na + sb²/nb)``
    (population std of each side's repeat trials). Needs ``img_per_s_n >= 2`` and a std on
    both sides; otherwise ``significant`` is ``None`` with the reason.
    """
    a, b = ProfileRecord.of(before), ProfileRecord.of(after)
    ia, ib = a.img_per_s, b.img_per_s
    if ia is None or ib is None:
        return {"significant": None, "reason": "img/s unavailable"}
    na, nb = int(a.img_per_s_n or 1), int(b.img_per_s_n or 1)
    sa, sb = a.img_per_s_std, b.img_per_s_std
    if na < 2 or nb < 2 or sa is None or sb is None:
        return {
            "significant": None,
            "n": [na, nb],
            "reason": "single run: a single trial cannot be significant; use "
            "'libreyolo profile run --repeat N' (N >= 2) on both sides",
        }
    se = math.sqrt(sa**2 / na + sb**2 / nb)
    delta = ib - ia
    sig = abs(delta) > 2 * se
    return {
        "significant": sig,
        "n": [na, nb],
        "delta": round(delta, 3),
        "se": round(se, 4),
        "reason": f"|Δ img/s| = {abs(delta):.2f} {'>' if sig else '<='} 2 × SE = {2 * se:.2f} "
        f"(SE = √(sa²/na + sb²/nb), na={na}, nb={nb})",
    }


@dataclass(frozen=True)
class Environment:
    """Whether the two sides of a comparison ran in comparable environments.

    Attributes:
        may_explain: True when the machine's load (or a noisy window) may explain the delta
            rather than the configuration; False when both sides ran quiet and steady;
            None when a side has no load recorded.
        note: one sentence saying so, with both sides' figures.
        reasons: the findings behind ``may_explain``.
    """

    may_explain: bool | None
    note: str
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class Comparison:
    """``libreyolo profile compare``'s result (after - before).

    Attributes:
        metrics: ``{metric: {"before", "after", "delta", "pct"}}`` for the headline figures.
        bound: ``{"before", "after"}`` verdicts.
        significance: :func:`significance` of the img/s difference.
        load: ``{"before", "after"}``: each side's machine load during its window(s)
            (:func:`side_load`), ``None`` where not recorded.
        reliable: ``{"before", "after"}``: each side's ``confidence.reliable``.
        environment: :class:`Environment`: may the environment explain the delta?
    """

    metrics: dict[str, dict[str, Any]]
    bound: dict[str, Any]
    significance: dict[str, Any]
    load: dict[str, dict[str, Any] | None]
    reliable: dict[str, bool | None]
    environment: Environment

    def to_dict(self) -> dict[str, Any]:
        """JSON shape: the metric rows at the top level, then ``bound``, ``significance``,
        ``load``, ``reliable`` and ``environment``."""
        return {**self.metrics, "bound": self.bound, "significance": self.significance,
                "load": self.load, "reliable": self.reliable,
                "environment": asdict(self.environment) | {"reasons": list(self.environment.reasons)}}


def side_load(p: ProfileRecord | Mapping[str, Any]) -> dict[str, Any] | None:
    """One side's load: the profile's ``load`` (a repeat aggregate's holds the means over
    its trials, ``other_cpu_frac_max`` and ``trials``); ``None`` when not recorded."""
    load = ProfileRecord.of(p).load
    return load.to_dict() if load is not None else None


def environment(before: ProfileRecord | Mapping[str, Any],
                after: ProfileRecord | Mapping[str, Any]) -> Environment:
    """May the environment, not the configuration, explain the difference between two
    profiles? Yes when a side's window was loaded (other processes took
    :data:`~.verdict.LOADED_OTHER_FRAC` of the CPU or more, in any trial), when the two
    sides' loads differ by :data:`~.verdict.LOAD_DIFF_FRAC` or more, or when a side's
    window was unreliable for any other reason (noisy steps)."""
    from libreyolo_core.profiler import verdict as V

    a, b = ProfileRecord.of(before), ProfileRecord.of(after)
    la, lb = a.load, b.load
    fa = la.other_cpu_frac if la else None
    fb = lb.other_cpu_frac if lb else None
    if fa is None or fb is None:
        missing = [n for n, f in (("before", fa), ("after", fb)) if f is None]
        return Environment(None, f"machine load not recorded for {' and '.join(missing)}: "
                           "the environment cannot be ruled out as the cause of the delta")
    assert la is not None and lb is not None  # their fractions are set
    reasons: list[str] = []
    for name, load, frac in (("before", la, fa), ("after", lb, fb)):
        worst = load.other_cpu_frac_max if "other_cpu_frac_max" in load.model_fields_set else frac
        if worst is not None and worst >= V.LOADED_OTHER_FRAC:
            reasons.append(f"{name} ran on a loaded machine (other processes "
                           f"{_pct(worst)} of the CPU)")
    if abs(fa - fb) >= V.LOAD_DIFF_FRAC:
        busier = "after" if fb > fa else "before"
        reasons.append(f"the machine was busier during {busier} (other processes "
                       f"{_pct(fa)} before, {_pct(fb)} after)")
    for name, p in (("before", a), ("after", b)):
        conf = p.confidence
        if conf is not None and "noisy_steps" in conf.flags:
            cv = conf.step_ms_cv
            reasons.append(f"{name}'s steps did not repeat (step time CV {_pct(cv)})")
    if reasons:
        return Environment(True, "the environment, not the configuration, may explain the "
                           "delta: " + "; ".join(reasons) + ". Profile both sides again on a "
                           "quiet machine with --repeat 3", tuple(reasons))
    return Environment(False, f"both sides ran on a quiet machine (other processes {_pct(fa)} "
                       f"and {_pct(fb)} of the CPU) with steady steps: the environment does "
                       "not explain the delta")


def compare_profiles(before: ProfileRecord | Mapping[str, Any],
                     after: ProfileRecord | Mapping[str, Any]) -> Comparison:
    """Headline deltas ``after - before``, the significance call, both sides' load and
    whether the environment may explain the delta (:func:`environment`). A delta beyond
    the noise that the environment may explain is not called significant:
    ``significant`` is None, ``beyond_noise`` True and the reason says why."""
    a, b = ProfileRecord.of(before), ProfileRecord.of(after)

    def pair(key: str, fa: Any = None, fb: Any = None) -> dict[str, Any]:
        va = fa if fa is not None else getattr(a, key, None)
        vb = fb if fb is not None else getattr(b, key, None)
        row: dict[str, Any] = {"before": va, "after": vb}
        if isinstance(va, int | float) and isinstance(vb, int | float) and not isinstance(va, bool):
            row["delta"] = round(vb - va, 4)
            row["pct"] = round(100.0 * (vb - va) / va, 2) if va else None
        return row

    def per_image(p: ProfileRecord) -> float | None:
        batch = p.config.get("batch")
        return round(p.step_ms / batch, 4) if p.step_ms and batch else None

    def reliable(p: ProfileRecord) -> bool | None:
        return p.confidence.reliable if p.confidence is not None else None

    sig, env = significance(a, b), environment(a, b)
    if sig.get("significant") is True and env.may_explain is True:
        # beyond the noise of the trials, but the machine's load may explain it: no call
        sig = {**sig, "significant": None, "beyond_noise": True,
               "reason": f"{sig['reason']}, but the environment may explain the delta (see "
                         "environment): no significance call"}
    return Comparison(
        metrics={
            "img_per_s": pair("img_per_s"),
            "ms_per_image": pair("ms_per_image", per_image(a), per_image(b)),
            "step_ms": pair("step_ms"),
            "dataload_frac": pair("dataload_frac"),
            "gpu_util": pair("gpu_util"),
            "host_overhead_ms_per_step": pair("host_overhead_ms_per_step"),
            "launches_per_step": pair("launches_per_step"),
        },
        bound={"before": a.verdict, "after": b.verdict},
        significance=sig,
        load={"before": side_load(a), "after": side_load(b)},
        reliable={"before": reliable(a), "after": reliable(b)},
        environment=env,
    )


def format_compare(c: Comparison) -> str:
    """Text table of :func:`compare_profiles`: the deltas, each side's load next to them,
    the significance call and the environment note."""
    out = [f"{'metric':26s} {'before':>12s} {'after':>12s} {'delta':>12s}"]
    for key, row in c.metrics.items():
        d = row.get("delta")
        pct = row.get("pct")
        delta = "" if d is None else f"{d:+.3f}" + (f" ({pct:+.1f}%)" if pct is not None else "")
        out.append(
            f"{key:26s} {_f(row.get('before'), 3):>12s} {_f(row.get('after'), 3):>12s} {delta:>12s}"
        )
    out.append(f"{'bound':26s} {str(c.bound['before']):>12s} {str(c.bound['after']):>12s}")
    out.append(f"load before: {load_text(c.load['before'])}")
    out.append(f"load after:  {load_text(c.load['after'])}")
    s = c.significance
    call = {True: "significant", False: "not significant", None: "no significance call"}[
        s["significant"]
    ]
    out.append(f"img/s: {call} — {s['reason']}")
    flag = "!! " if c.environment.may_explain else ""
    out.append(f"{flag}environment: {c.environment.note}")
    return "\n".join(out)
