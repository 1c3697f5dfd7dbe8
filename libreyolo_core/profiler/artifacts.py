"""From measured steps (+ an optional trace) to ``profile.json`` and the other artifacts.

Files written into the run directory:

- ``profile_trace.json.gz`` — the raw ``torch.profiler`` Chrome trace, gzip-compressed (written
  there by the window; Perfetto opens it as is).
- ``profile_summary.json`` — ``meta``, ``window``, ``real`` (unsynced figures),
  ``composition_ms`` (synced per-phase means), ``bound``, ``bound_why``, ``confidence``
  (how sure the verdict is), ``load`` (the machine's load during the window), ``trace``,
  ``analysis`` (the headline trace figures).
- ``profile.json`` — :class:`~libreyolo_core.profiler.record.ProfileRecord` (schema
  :data:`~libreyolo_core.profiler.record.SCHEMA`): self-contained, everything the
  ``libreyolo profile`` readers need (no path in it is ever opened again).
- ``timeline.html`` — the self-contained viewer (:mod:`libreyolo_core.profiler.timeline`).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from libreyolo_core.profiler import verdict as V
from libreyolo_core.profiler.analysis import (
    TOP_KERNELS,
    TRACE_NAME,
    analyze_trace,
    load_trace,
    order_phases,
)
from libreyolo_core.profiler.confidence import assess
from libreyolo_core.profiler.load import WindowLoad
from libreyolo_core.profiler.record import SCHEMA, ProfileRecord

__all__ = [
    "real_figures",
    "composition",
    "build_profile",
    "flat_metrics",
    "with_metrics",
    "summary_of",
    "write_artifacts",
    "write_json",
    "profile_from_trace",
]

log = logging.getLogger(__name__)


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def real_figures(unsynced: Sequence[Any], batch: int) -> dict[str, float]:
    """Verdict figures from the unsynced steps (``StepRecord``-like: ``wall_ms``, ``dataload_ms``).

    Returns ``step_ms``, ``dataload_ms``, ``compute_ms = max(step - dataload, 0)``,
    ``dataload_frac = dataload / step`` and ``img_per_s = batch / step`` (all means).
    """
    step = _mean([r.wall_ms for r in unsynced])
    data = _mean([r.dataload_ms for r in unsynced])
    return {
        "step_ms": round(step, 3),
        "dataload_ms": round(data, 3),
        "compute_ms": round(max(step - data, 0.0), 3),
        "dataload_frac": round(data / step, 4) if step > 0 else 0.0,
        "img_per_s": round(batch / (step / 1e3), 2) if step > 0 else 0.0,
    }


def composition(synced: Sequence[Any]) -> dict[str, float]:
    """Mean wall ms per phase over the synced steps (a phase absent from a step counts 0)."""
    names = order_phases({p for r in synced for p in r.phases} | {"dataload"})
    n = max(len(synced), 1)
    out = {p: sum(r.phases.get(p, 0.0) for r in synced) / n for p in names if p != "dataload"}
    return {
        "dataload": round(_mean([r.dataload_ms for r in synced]), 3),
        **{p: round(v, 3) for p, v in out.items()},
    }


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def build_profile(
    *,
    meta: Mapping[str, Any],
    window: Mapping[str, Any],
    real: Mapping[str, float],
    composition_ms: Mapping[str, float],
    analysis: Mapping[str, Any] | None,
    device_type: str,
    peak_vram_mb: float | None = None,
    trace: str | None = None,
    trace_error: str | None = None,
    steps: Sequence[Mapping[str, Any]] = (),
    spread: tuple[Sequence[float], Sequence[float]] | None = None,
    load: WindowLoad | None = None,
) -> ProfileRecord:
    """Assemble the ``profile.json`` record (schema :data:`~.record.SCHEMA`).

    Args:
        meta: environment (model, device, batch, imgsz, amp, workers, cuda_graph, ...).
        window: ``warmup``, ``real_steps``, ``synced_steps``, ``accumulate``.
        real: :func:`real_figures`. composition_ms: :func:`composition`.
        analysis: :func:`~libreyolo_core.profiler.analysis.analyze_trace` or ``None``.
        device_type: ``cpu``/``cuda``/``mps``. steps: per-step records for the timeline.
        spread: ``(step_ms, dataload_ms)`` of each unsynced step: the verdict's confidence
            (:func:`~libreyolo_core.profiler.confidence.assess`); ``None`` (a profile rebuilt
            from a bare trace) leaves ``confidence`` null.
        load: the machine's load during the window (``load`` in the profile), or ``None``.

    Returns:
        The record; GPU-only figures are ``None`` (counts 0, tables empty) unless the trace
        holds GPU kernels of a non-CPU run.
    """
    a = dict(analysis or {})
    cpu = device_type == "cpu"
    gpu = bool(a.get("has_gpu")) and not cpu
    g = a if gpu else {}  # the trace figures that exist only with GPU kernels
    busy = g.get("gpu_busy_ms_per_step")
    step_ms = real["step_ms"]
    util_raw = (busy / step_ms) if (busy is not None and step_ms > 0) else None
    util = min(util_raw, 1.0) if util_raw is not None else None
    fig = {
        **real,
        "device_type": device_type,
        "gpu_util": util,
        "gpu_util_raw": util_raw,
        "gpu_busy_ms_per_step": busy,
        "cuda_mallocs_per_step": a.get("cuda_mallocs_per_step"),
    }
    bound, why = V.decide(fig)
    host = max(step_ms - busy - real["dataload_ms"], 0.0) if busy is not None else None
    kernels = g.get("kernels", [])
    phases = _phase_rows(a.get("phases", []), composition_ms, real["dataload_ms"], gpu)
    notes = _notes(device_type, meta, analysis, trace_error)
    confidence = (assess(*spread, load, bound, fitted=meta.get("window_fitted"))
                  if spread is not None else None)
    fields: dict[str, Any] = {
        "schema": SCHEMA,
        "trace": trace,
        "trace_error": trace_error,
        "model": meta.get("model"),
        "config": dict(meta),
        "device_type": device_type,
        "bound": bound,
        "bound_why": why,
        "confidence": confidence.to_dict() if confidence is not None else None,
        "load": load.to_dict() if load is not None else None,
        "levers": V.LEVERS[bound],
        "lever": V.lever(bound, {**meta, "device": device_type}),
        "step_ms": step_ms,
        "img_per_s": real["img_per_s"],
        "dataload_ms": real["dataload_ms"],
        "dataload_frac": real["dataload_frac"],
        "compute_ms": real["compute_ms"],
        "gpu_util": _r(util),
        "gpu_util_raw": _r(util_raw),
        "utilisation": "not applicable (CPU run)"
        if cpu
        else ("unknown (no trace)" if util is None else f"{100 * util:.0f}%"),
        "memory_pressure": bound == V.MEMORY,
        "cuda_mallocs_per_step": g.get("cuda_mallocs_per_step"),
        "host_overhead_ms_per_step": _r(host),
        "launches_per_step": g.get("kernels_per_step"),
        "gpu_busy_ms_per_step": busy,
        "mean_kernel_us": g.get("mean_kernel_us"),
        "kernels_per_step": g.get("kernels_per_step"),
        "unique_kernels": g.get("unique_kernels"),
        "memcpy_ms_per_step": g.get("memcpy_ms_per_step"),
        "tensorcore_pct": g.get("tensorcore_pct"),
        "peak_vram_mb": _r(peak_vram_mb, 1),
        "cpu_ops_ms_per_step": a.get("cpu_ops_ms_per_step"),
        "ops_per_step": a.get("ops_per_step"),
        "window": {
            **dict(window),
            "analysed_steps": (a.get("window") or {}).get("steps"),
            "wall_ms": (a.get("window") or {}).get("wall_ms"),
        },
        "composition_ms": dict(composition_ms),
        "composition_total_ms": round(sum(composition_ms.values()), 3),
        "categories": a.get("categories", []),
        "phases": phases,
        "phases_gpu": {r["phase"]: r["gpu_ms_per_step"] for r in phases if gpu},
        "kernels_by_phase": g.get("kernels_by_phase", {}),
        "ops_by_phase": a.get("ops_by_phase", {}),
        "top_kernels": kernels[:TOP_KERNELS],
        "kernels": kernels,
        "ops": a.get("ops", []),
        "notes": notes,
        "steps": list(steps),
    }
    return with_metrics(ProfileRecord.of(_clean(fields)))


def _phase_rows(trace_rows: Sequence[Mapping[str, Any]], composition_ms: Mapping[str, float],
                dataload_ms: float, gpu: bool) -> list[dict[str, Any]]:
    """One :class:`~.record.PhaseRow` dict per phase of the trace or the synced steps, in
    step order; GPU columns are empty without GPU kernels."""
    by_phase = {r["phase"]: r for r in trace_rows}
    rows = []
    for p in order_phases(set(by_phase) | set(composition_ms) | {"dataload"}):
        t = by_phase.get(p, {})
        tg = t if gpu else {}
        rows.append({
            "phase": p,
            "gpu_ms_per_step": tg.get("gpu_ms_per_step"),
            "cpu_ms_per_step": t.get("cpu_ms_per_step"),
            "wall_ms_per_step": dataload_ms if p == "dataload" else composition_ms.get(p),
            "kernels_per_step": tg.get("kernels_per_step", 0.0),
            "ops_per_step": t.get("ops_per_step", 0.0),
            "unique_kernels": tg.get("unique_kernels", 0),
        })
    return rows


def _notes(device_type: str, meta: Mapping[str, Any], analysis: Mapping[str, Any] | None,
           trace_error: str | None) -> list[str]:
    """The caveats a reader should see next to the figures."""
    notes = []
    if device_type == "cpu":
        notes.append(
            "CPU run: device utilisation is not applicable; CPU ops are mined instead "
            "of GPU kernels"
        )
    elif not meta.get("amp", True):
        notes.append("fp32 run: AMP/bf16 would push gemm/conv onto Tensor Cores")
    if analysis is None:
        notes.append(f"no trace analysed ({trace_error or 'profile_trace=False'})")
    if meta.get("cache_recent_fits"):
        notes.append("the window is in the first epoch, while each loader process fills its "
                     "store of recently decoded images (cache_recent_mb); every image of this "
                     "set fits it, so later epochs decode none and wait less for data than "
                     "measured here")
    return notes


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(float(x), nd)


def with_metrics(p: ProfileRecord) -> ProfileRecord:
    """``p`` with its ``metrics`` recomputed (:func:`flat_metrics`)."""
    return p.model_copy(update={"metrics": flat_metrics(p)})


def flat_metrics(p: ProfileRecord) -> dict[str, Any]:
    """The flat ``metrics`` map that ``libreyolo profile get`` lists: the headline figures
    (short names), the confidence and load figures, and four per phase."""
    m: dict[str, Any] = {
        "img_per_s": p.img_per_s,
        "step_ms": p.step_ms,
        "dataload_ms": p.dataload_ms,
        "dataload_frac": p.dataload_frac,
        "compute_ms": p.compute_ms,
        "gpu_util": p.gpu_util,
        "gpu_busy_ms": p.gpu_busy_ms_per_step,
        "mean_kernel_us": p.mean_kernel_us,
        "kernels_per_step": p.kernels_per_step,
        "unique_kernels": p.unique_kernels,
        "ops_per_step": p.ops_per_step,
        "cpu_ops_ms": p.cpu_ops_ms_per_step,
        "memcpy_ms": p.memcpy_ms_per_step,
        "tensorcore_pct": p.tensorcore_pct,
        "peak_vram_mb": p.peak_vram_mb,
        "host_overhead_ms": p.host_overhead_ms_per_step,
        "launches_per_step": p.launches_per_step,
        "cuda_mallocs_per_step": p.cuda_mallocs_per_step,
        "memory_pressure": p.memory_pressure,
        "bound": p.bound,
    }
    conf, load = p.confidence, p.load
    m["reliable"] = conf.reliable if conf else None
    m["step_ms_cv"] = conf.step_ms_cv if conf else None
    m["dataload_ms_cv"] = conf.dataload_ms_cv if conf else None
    m["other_cpu_frac"] = load.other_cpu_frac if load else None
    m["loadavg_1m"] = load.loadavg_1m if load else None
    for row in p.phases:
        m[f"{row.phase}_gpu_ms"] = row.gpu_ms_per_step
        m[f"{row.phase}_wall_ms"] = row.wall_ms_per_step
        m[f"{row.phase}_kernels"] = row.kernels_per_step
        m[f"{row.phase}_ops"] = row.ops_per_step
    for key in ("img_per_s_std", "img_per_s_n"):  # a repeat aggregate's
        if key in p.model_fields_set:
            m[key] = getattr(p, key)
    return m


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temp file + rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(_clean(data), indent=1), encoding="utf-8")
    os.replace(tmp, path)


def summary_of(p: ProfileRecord) -> dict[str, Any]:
    """The ``profile_summary.json`` dict: headline figures and the verdict."""
    d = p.to_dict()
    return {
        "meta": p.config,
        "window": d.get("window", {}),
        "real": {k: d.get(k) for k in ("step_ms", "dataload_ms", "compute_ms", "img_per_s", "dataload_frac")},
        "composition_ms": p.composition_ms,
        "composition_total_ms": p.composition_total_ms,
        "bound": p.bound,
        "bound_why": p.bound_why,
        "confidence": d.get("confidence"),
        "load": d.get("load"),
        "trace": p.trace,
        "device_type": p.device_type,
        "analysis": {
            k: d.get(k)
            for k in (
                "gpu_util",
                "gpu_util_raw",
                "gpu_busy_ms_per_step",
                "kernels_per_step",
                "mean_kernel_us",
                "memcpy_ms_per_step",
                "cuda_mallocs_per_step",
                "tensorcore_pct",
                "peak_vram_mb",
                "host_overhead_ms_per_step",
                "cpu_ops_ms_per_step",
                "ops_per_step",
            )
        },
    }


def write_artifacts(
    prof: Any, run_dir: Path, trace_path: Path | None
) -> tuple[ProfileRecord, dict[str, str]]:
    """Analyse a finished :class:`TrainingProfiler` and write the artifacts into ``run_dir``.

    Returns:
        ``(profile, artifacts)``: the record written as ``profile.json``
        (:meth:`ProfileRecord.to_dict`) and ``{relative path: kind}``.
    """
    from libreyolo_core.profiler.timeline import write_timeline

    trace, analysis, trace_error = None, None, prof.trace_error
    if trace_path is not None:
        try:
            trace = load_trace(trace_path)
            analysis = analyze_trace(trace)
        except Exception as exc:  # noqa: BLE001 - an unreadable trace costs the kernel detail only
            trace_error = f"trace analysis failed: {type(exc).__name__}: {exc}"
            log.warning("%s", trace_error)
    w = prof.window
    window = {
        "warmup": w.warmup,
        "real_steps": w.half,
        "synced_steps": w.steps - w.half,
        "steps": w.steps,
        "accumulate": w.accumulate,
    }
    steps = [
        {
            "index": r.index,
            "kind": r.kind,
            "wall_ms": round(r.wall_ms, 3),
            "dataload_ms": round(r.dataload_ms, 3),
            "phases": {k: round(v, 3) for k, v in r.phases.items()},
        }
        for r in prof.records
    ]
    unsynced = prof.measured("unsynced")
    profile = build_profile(
        meta=prof.meta,
        window=window,
        real=real_figures(unsynced, prof.batch),
        composition_ms=composition(prof.measured("synced")),
        analysis=analysis,
        device_type=prof.device.type,
        peak_vram_mb=prof.peak_vram_mb,
        trace=TRACE_NAME if trace_path is not None else None,
        trace_error=trace_error,
        steps=steps,
        spread=([r.wall_ms for r in unsynced], [r.dataload_ms for r in unsynced]),
        load=getattr(prof, "load", None),
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / "profile.json", profile.to_dict())
    write_json(run_dir / "profile_summary.json", summary_of(profile))
    write_timeline(run_dir / "timeline.html", profile, trace)
    artifacts = {
        "timeline.html": "timeline",
        "profile.json": "profile",
        "profile_summary.json": "profile",
    }
    if trace_path is not None:
        artifacts[TRACE_NAME] = "trace"
    return profile, artifacts


def profile_from_trace(path: str | Path) -> ProfileRecord:
    """Build a profile from a raw trace, ``profile_trace.json.gz`` or a plain ``.json``
    (readers accept one).

    A sibling ``profile_summary.json`` supplies the unsynced figures and meta; without it the
    step time and data wait are estimated from the trace (window wall / steps and the
    ``step/dataload`` spans), and the verdict says so.

    Raises:
        ValueError: not a Chrome trace.
    """
    path = Path(path)
    trace = load_trace(path)
    a = analyze_trace(trace)
    summary_path = path.with_name("profile_summary.json")
    if summary_path.is_file():
        s = json.loads(summary_path.read_text(encoding="utf-8"))
        meta, real = s.get("meta", {}), s.get("real", {})
        window, comp = s.get("window", {}), s.get("composition_ms", {})
        device_type = s.get("device_type") or ("cuda" if a["has_gpu"] else "cpu")
        peak = (s.get("analysis") or {}).get("peak_vram_mb")
    else:
        steps = a["window"]["steps"]
        step_ms = a["window"]["wall_ms"] / max(steps, 1)
        data = _dataload_wall(trace, a)
        real = {
            "step_ms": round(step_ms, 3),
            "dataload_ms": round(data, 3),
            "compute_ms": round(max(step_ms - data, 0.0), 3),
            "dataload_frac": round(data / step_ms, 4) if step_ms else 0.0,
            "img_per_s": None,
        }
        meta, window, comp, peak = {"source": path.name}, {"real_steps": steps}, {}, None
        device_type = "cuda" if a["has_gpu"] else "cpu"
    real = {"img_per_s": None, "compute_ms": 0.0, **real}
    profile = build_profile(
        meta=meta,
        window=window,
        real=real,
        composition_ms=comp,
        analysis=a,
        device_type=device_type,
        peak_vram_mb=peak,
        trace=path.name,
    )
    if summary_path.is_file():  # the window's own confidence and load, recorded at the time
        profile = with_metrics(ProfileRecord.of(
            {**profile.to_dict(), "confidence": s.get("confidence"), "load": s.get("load")}))
    return profile


def _dataload_wall(trace: Mapping[str, Any], a: Mapping[str, Any]) -> float:
    w0, w1 = a["window"]["start_us"], a["window"]["end_us"]
    total = sum(
        float(e.get("dur", 0.0))
        for e in trace.get("traceEvents", [])
        if e.get("cat") == "user_annotation"
        and e.get("name") == "step/dataload"
        and w0 <= float(e.get("ts", -1)) < w1
    )
    return total / 1e3 / max(a["window"]["steps"], 1)
