"""Plain-text views of a profile (what ``finish`` prints and the CLI readers show)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "format_summary",
    "format_phases",
    "format_rows",
    "compare_profiles",
    "format_compare",
    "significance",
]


def _f(v: Any, nd: int = 2, unit: str = "") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int | float):
        return f"{v:.{nd}f}{unit}"
    return f"{v}{unit}"


def format_summary(p: Mapping[str, Any]) -> str:
    """Several lines: figures, verdict with its reason and lever, kernel/op mix, top kernels."""
    cfg = p.get("config") or {}
    w = p.get("window") or {}
    lines = []
    if p.get("memory_pressure"):
        lines.append("!! MEMORY PRESSURE: utilisation and img/s below are unreliable !!")
    lines.append(
        f"profile: {cfg.get('model', p.get('model'))} on {cfg.get('device', p.get('device_type'))}"
        f", batch {cfg.get('batch')}, imgsz {cfg.get('imgsz')}, amp {cfg.get('amp')}, "
        f"workers {cfg.get('workers')}; warmup {w.get('warmup')}, measured "
        f"{w.get('real_steps')} unsynced + {w.get('synced_steps')} synced steps"
    )
    n = p.get("img_per_s_n")
    ips = _f(p.get("img_per_s"), 1)
    if n and n > 1:
        ips += f" ± {_f(p.get('img_per_s_std'), 1)} (n={n})"
    frac = p.get("dataload_frac") or 0.0
    lines.append(
        f"step {_f(p.get('step_ms'), 1, ' ms')}, {ips} img/s, data wait "
        f"{_f(p.get('dataload_ms'), 1, ' ms')} ({100 * frac:.0f}%)"
    )
    if p.get("device_type") == "cpu":
        lines.append(
            "utilisation: not applicable (CPU run); CPU ops "
            f"{_f(p.get('cpu_ops_ms_per_step'), 1, ' ms/step')}, "
            f"{_f(p.get('ops_per_step'), 0)} ops/step"
        )
    else:
        util = p.get("gpu_util")
        lines.append(
            f"GPU util {_f(100 * util if util is not None else None, 0, '%')} "
            f"({_f(p.get('gpu_busy_ms_per_step'), 1)} ms busy / "
            f"{_f(p.get('step_ms'), 1)} ms step), "
            f"{_f(p.get('kernels_per_step'), 0)} kernels/step @ "
            f"~{_f(p.get('mean_kernel_us'), 0)} µs, "
            f"peak VRAM {_f(p.get('peak_vram_mb'), 0, ' MB')}, Tensor Cores "
            f"{_f(p.get('tensorcore_pct'), 0, '%')}"
        )
        lines.append(
            f"memcpy {_f(p.get('memcpy_ms_per_step'), 2, ' ms/step')}, host overhead "
            f"{_f(p.get('host_overhead_ms_per_step'), 1, ' ms/step')}, launches/step "
            f"{_f(p.get('launches_per_step'), 0)}, cudaMalloc/Free per step "
            f"{_f(p.get('cuda_mallocs_per_step'), 1)}"
        )
    lines.append(f"verdict: {p.get('bound')} — {p.get('bound_why')}")
    lv = p.get("lever") or {}
    if lv.get("params"):
        lines.append("lever: try " + " ".join(f"{k}={v}" for k, v in lv["params"].items())
                     + f" ({lv.get('why')})")
    elif lv.get("why"):
        lines.append(f"lever: {lv['why']}" + (f"; {'; '.join(lv['also'])}" if lv.get("also") else ""))
    elif p.get("levers"):
        lines.append(f"lever: {p['levers']}")
    cats = p.get("categories") or []
    if cats:
        lines.append("mix: " + ", ".join(f"{c['name']} {c['pct']:.0f}%" for c in cats))
    gpu = bool(p.get("top_kernels"))
    top = p.get("top_kernels") if gpu else (p.get("ops") or [])[:8]
    if top:
        lines.append("top kernels:" if gpu else "top CPU ops (self time):")
        key = "kernel" if gpu else "op"
        for r in top[:8]:
            lines.append(
                f"  {r['ms_per_step']:9.3f} ms/step  {r['count_per_step']:7.1f}x  "
                f"{r.get('category', ''):17s} {r[key]}"
            )
    for note in p.get("notes") or []:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def format_phases(rows: Sequence[Mapping[str, Any]]) -> str:
    """Table: phase, gpu ms, wall ms, cpu-op ms, kernels, ops (per step)."""
    out = [
        f"{'phase':12s} {'gpu_ms':>9s} {'wall_ms':>9s} {'cpu_ops_ms':>10s} "
        f"{'kernels':>8s} {'ops':>8s}"
    ]
    for r in rows:
        out.append(
            f"{r['phase']:12s} {_f(r.get('gpu_ms_per_step'), 3):>9s} "
            f"{_f(r.get('wall_ms_per_step'), 3):>9s} {_f(r.get('cpu_ms_per_step'), 3):>10s} "
            f"{_f(r.get('kernels_per_step'), 1):>8s} {_f(r.get('ops_per_step'), 1):>8s}"
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


def significance(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Is the img/s difference between two profiles real?

    Significant when ``|mean_b - mean_a| > 2 * SE`` with ``SE = sqrt(sa²/na + sb²/nb)``
    (population std of each side's repeat trials). Needs ``img_per_s_n >= 2`` and a std on
    both sides; otherwise ``significant`` is ``None`` with the reason.
    """
    ia, ib = a.get("img_per_s"), b.get("img_per_s")
    if ia is None or ib is None:
        return {"significant": None, "reason": "img/s unavailable"}
    na, nb = int(a.get("img_per_s_n") or 1), int(b.get("img_per_s_n") or 1)
    sa, sb = a.get("img_per_s_std"), b.get("img_per_s_std")
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


def compare_profiles(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Headline deltas ``after - before`` and the significance call."""

    def pair(key: str, fa: Any = None, fb: Any = None) -> dict[str, Any]:
        va = fa if fa is not None else a.get(key)
        vb = fb if fb is not None else b.get(key)
        row: dict[str, Any] = {"before": va, "after": vb}
        if isinstance(va, int | float) and isinstance(vb, int | float) and not isinstance(va, bool):
            row["delta"] = round(vb - va, 4)
            row["pct"] = round(100.0 * (vb - va) / va, 2) if va else None
        return row

    def per_image(p: Mapping[str, Any]) -> float | None:
        batch = (p.get("config") or {}).get("batch")
        return round(p["step_ms"] / batch, 4) if p.get("step_ms") and batch else None

    return {
        "img_per_s": pair("img_per_s"),
        "ms_per_image": pair("ms_per_image", per_image(a), per_image(b)),
        "step_ms": pair("step_ms"),
        "dataload_frac": pair("dataload_frac"),
        "gpu_util": pair("gpu_util"),
        "host_overhead_ms_per_step": pair("host_overhead_ms_per_step"),
        "launches_per_step": pair("launches_per_step"),
        "bound": {"before": a.get("bound"), "after": b.get("bound")},
        "significance": significance(a, b),
    }


def format_compare(c: Mapping[str, Any]) -> str:
    """Text table of :func:`compare_profiles`."""
    out = [f"{'metric':26s} {'before':>12s} {'after':>12s} {'delta':>12s}"]
    for key, row in c.items():
        if key in ("significance",):
            continue
        d = row.get("delta")
        pct = row.get("pct")
        delta = "" if d is None else f"{d:+.3f}" + (f" ({pct:+.1f}%)" if pct is not None else "")
        out.append(
            f"{key:26s} {_f(row.get('before'), 3):>12s} {_f(row.get('after'), 3):>12s} {delta:>12s}"
        )
    s = c["significance"]
    call = {True: "significant", False: "not significant", None: "no significance call"}[
        s["significant"]
    ]
    out.append(f"img/s: {call} — {s['reason']}")
    return "\n".join(out)
