"""Mining a ``torch.profiler`` Chrome trace: kernels, CPU ops, categories, phases.

Input is the trace as written by ``export_chrome_trace`` (``{"traceEvents": [...]}``; times
in microseconds). Method (LibreYOLO's newer ``analyze_trace``; docs/architecture.md, Profiler):

- Analysis window: ``ProfilerStep#N`` markers sorted by start; with 4 or more, from the 3rd
  marker's start to the start of the marker at index ``min(n - 1, 8)`` (skips two cold
  steps); otherwise the whole span of the markers (or of all events).
- GPU kernels (``cat == "kernel"``) are placed in time and attributed to a phase by the CPU
  launch that issued them (the ``cuda_runtime`` event with the same ``correlation``), else
  by their own start. The phase is the ``step/<phase>`` user annotation containing that
  time, else ``unphased``.
- CPU ops (``cat == "cpu_op"``) are charged their **self** time (duration minus the
  durations of ops nested inside them on the same thread), so nested ``aten::`` calls are
  not counted twice.
- Categories: one regular expression per category, first match wins (:data:`CATEGORY_RULES`;
  the kernel patterns of the reference, plus the ``aten::`` names that play the same role on
  a CPU run).
"""

from __future__ import annotations

import bisect
import functools
import gzip
import json
import re
import shutil
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "TRACE_NAME",
    "read_json",
    "write_trace_gz",
    "CATEGORY_RULES",
    "CATEGORIES",
    "PHASE_ORDER",
    "TOP_PER_PHASE",
    "TOP_KERNELS",
    "load_trace",
    "categorize",
    "is_tensorcore",
    "friendly_kernel_name",
    "analysis_window",
    "PhaseIndex",
    "self_times",
    "analyze_trace",
    "order_phases",
]

#: (category, pattern) checked in order; first match wins; case-insensitive.
CATEGORY_RULES: tuple[tuple[str, str], ...] = (
    (
        "reduction / norm",
        r"bn_bw|bn_fw|batch_?norm|layer_?norm|group_?norm|instance_?norm|softmax"
        r"|welford|reduce|variance|rms_?norm"
        r"|aten::(sum|mean|amax|amin|max|min|norm|var|std|argmax|topk)\b",
    ),
    ("layout / copy", r"nchwtonhwc|nhwctonchw"),
    (
        "gemm / conv",
        r"gemm|conv|implicit|cutlass|cudnn|wgrad|dgrad|winograd|mkldnn"
        r"|aten::(mm|bmm|addmm|matmul|linear|baddbmm)\b",
    ),
    (
        "layout / copy",
        r"memcpy|memset|copy|catarray|concat|contiguous|gather|scatter|permute"
        r"|transpose|aten::(cat|stack|to|_to_copy|clone|index|index_put|split"
        r"|chunk|slice|select|narrow|expand|pad|constant_pad_nd|flip|repeat)_?\b",
    ),
    (
        "elementwise",
        r"elementwise|vectorized|pointwise|activation|silu|relu|sigmoid|unary|binary"
        r"|clamp|fill|arange"
        r"|aten::(add|sub|rsub|mul|div|pow|sqrt|rsqrt|exp|log|neg|abs|where|lerp"
        r"|addcmul|addcdiv|_foreach_\w+|maximum|minimum|eq|ne|gt|lt|ge|le|tanh"
        r"|softplus|sign|floor|ceil|round|reciprocal|bitwise_\w+|logical_\w+)_?\b",
    ),
)
CATEGORIES = ("gemm / conv", "elementwise", "reduction / norm", "layout / copy", "other")
_COMPILED = tuple((name, re.compile(pat, re.IGNORECASE)) for name, pat in CATEGORY_RULES)
_TENSORCORE = re.compile(
    r"h884|h1688|i16832|i8816|s16816|s1688|hmma|imma|tensorop|wmma|16816"
    r"|16832|884gemm|1688gemm",
    re.IGNORECASE,
)
#: Phases in report order; any other phase follows, ``unphased`` last.
PHASE_ORDER = (
    "dataload",
    "to_device",
    "preprocess",
    "forward",
    "backward",
    "postprocess",
    "optimizer",
    "ema",
)
TOP_PER_PHASE = 40
TOP_KERNELS = 8
RAW_NAME_CHARS = 90
_MARKER = re.compile(r"^ProfilerStep#(\d+)$")


#: File name of the raw trace in a run directory: gzip-compressed Chrome trace JSON, which
#: Perfetto (ui.perfetto.dev) and chrome://tracing open as is (a CPU trace is ~10x smaller).
TRACE_NAME = "profile_trace.json.gz"


def read_json(path: str | Path) -> Any:
    """JSON from ``path``, gunzipped first when the file is gzip (by its magic bytes).

    Raises:
        OSError: unreadable or a damaged gzip stream. ValueError: not JSON.
    """
    with open(path, "rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    opener = gzip.open if gz else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def write_trace_gz(src: str | Path, dst: str | Path) -> Path:
    """Compress the Chrome trace ``src`` into ``dst`` (gzip, level 6), streamed; returns ``dst``."""
    dst = Path(dst)
    with open(src, "rb") as fin, gzip.open(dst, "wb", compresslevel=6) as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
    return dst


def load_trace(path: str | Path) -> dict[str, Any]:
    """Read a Chrome trace JSON, plain or gzip-compressed (a dict with ``traceEvents``, or a
    bare event list).

    Raises:
        ValueError: the file is not a Chrome trace.
    """
    data = read_json(path)
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ValueError(f"{path}: not a Chrome trace (no traceEvents list)")
    return data


def categorize(name: str) -> str:
    """Category of a kernel or op name (see :data:`CATEGORY_RULES`); ``other`` if none match."""
    for cat, pat in _COMPILED:
        if pat.search(name):
            return cat
    return "other"


def is_tensorcore(name: str) -> bool:
    """Whether a kernel name says it runs on Tensor Cores (HMMA/IMMA tile names)."""
    return bool(_TENSORCORE.search(name))


def friendly_kernel_name(raw: str) -> str:
    """Short kernel name: no ``void``, no arguments, no template arguments, no namespaces."""
    s = raw.strip()
    if s.startswith("void "):
        s = s[5:]
    s = s.split("(", 1)[0].split("<", 1)[0].strip()
    s = s.rsplit("::", 1)[-1]
    return s or raw[:60]


def order_phases(names: Iterable[str]) -> list[str]:
    """Sort phase names: :data:`PHASE_ORDER` first, then others by name, ``unphased`` last."""
    names = set(names)
    known = [p for p in PHASE_ORDER if p in names]
    rest = sorted(n for n in names if n not in PHASE_ORDER and n != "unphased")
    return known + rest + (["unphased"] if "unphased" in names else [])


def _x_events(trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]


def analysis_window(events: list[dict[str, Any]]) -> tuple[float, float, int]:
    """``(start_us, end_us, steps)`` of the analysis window (see module docstring)."""
    markers = sorted(
        (e for e in events if _MARKER.match(str(e.get("name", "")))), key=lambda e: float(e["ts"])
    )
    n = len(markers)
    if n >= 4:
        end_idx = min(n - 1, 8)
        return float(markers[2]["ts"]), float(markers[end_idx]["ts"]), end_idx - 2
    src = markers or events
    if not src:
        return 0.0, 0.0, 1
    start = min(float(e["ts"]) for e in src)
    end = max(float(e["ts"]) + float(e.get("dur", 0.0)) for e in src)
    return start, end, max(n, 1)


class PhaseIndex:
    """Look up which ``step/<phase>`` CPU annotation contains a time (µs)."""

    def __init__(self, events: Iterable[Mapping[str, Any]]):
        spans = sorted(
            (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), str(e["name"])[5:])
            for e in events
            if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("step/")
        )
        self.spans = spans
        self._starts = [s[0] for s in spans]

    def phase_at(self, ts: float) -> str:
        """The phase whose span contains ``ts``, or ``unphased``."""
        i = bisect.bisect_right(self._starts, ts) - 1
        for j in range(i, max(i - 3, -1), -1):  # phases do not nest: look a few spans back
            start, end, name = self.spans[j]
            if start <= ts < end:
                return name
        return "unphased"


def self_times(ops: list[dict[str, Any]]) -> list[tuple[dict[str, Any], float, int]]:
    """``(event, self_us, depth)`` for CPU ops: duration minus nested ops on the same thread."""
    by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for e in ops:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    out: list[tuple[dict[str, Any], float, int]] = []
    for evs in by_thread.values():
        evs.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0.0))))
        stack: list[list[Any]] = []  # [event, end, child_us]
        for e in evs:
            ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
            while stack and ts >= stack[-1][1]:
                done = stack.pop()
                out.append(
                    (done[0], max(float(done[0].get("dur", 0.0)) - done[2], 0.0), len(stack))
                )
            if stack:
                stack[-1][2] += dur
            stack.append([e, ts + dur, 0.0])
        while stack:
            done = stack.pop()
            out.append((done[0], max(float(done[0].get("dur", 0.0)) - done[2], 0.0), len(stack)))
    return out


def _rows(
    groups: Mapping[str, list[float]],
    steps: int,
    total_us: float,
    key: str,
    pct_key: str,
    kernels: bool,
) -> list[dict[str, Any]]:
    rows = []
    for name, durs in groups.items():
        us = sum(durs)
        row: dict[str, Any] = {key: friendly_kernel_name(name) if kernels else name}
        if kernels:
            row["raw_name"] = name[:RAW_NAME_CHARS]
            row["tensorcore"] = is_tensorcore(name)
        row.update(
            category=categorize(name),
            ms_per_step=round(us / 1e3 / steps, 4),
            **{pct_key: round(100.0 * us / total_us, 2) if total_us else 0.0},
            count_per_step=round(len(durs) / steps, 2),
        )
        rows.append(row)
    rows.sort(key=lambda r: (-r["ms_per_step"], r[key]))
    return rows


def _categories(groups: Mapping[str, list[float]], steps: int) -> list[dict[str, Any]]:
    per: dict[str, float] = defaultdict(float)
    for name, durs in groups.items():
        per[categorize(name)] += sum(durs)
    total = sum(per.values())
    return [
        {
            "name": c,
            "pct": round(100.0 * per[c] / total, 2) if total else 0.0,
            "ms_per_step": round(per[c] / 1e3 / steps, 4),
        }
        for c in sorted(per, key=lambda c: -per[c])
    ]


_ByPhase = dict[str, dict[str, list[float]]]  # phase -> name -> durations (us)


def _in_window(w0: float, w1: float, t: float) -> bool:
    """Whether ``t`` (us) lies in the analysis window ``[w0, w1)`` (everything when empty)."""
    return w0 <= t < w1 if w1 > w0 else True


def _launch_times(events: list[dict[str, Any]]) -> dict[Any, float]:
    """CUDA runtime/driver calls' start times (us) by correlation id."""
    launch_ts: dict[Any, float] = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launch_ts[corr] = float(e["ts"])
    return launch_ts


def _device_side(
    events: list[dict[str, Any]], phases: PhaseIndex, inside: Callable[[float], bool]
) -> tuple[dict[str, list[float]], _ByPhase, float, int]:
    """Kernel durations (by name, and by phase of their launch), memcpy/memset time (us)
    and cudaMalloc/Free calls inside the window; a kernel counts at its launch's CPU time."""
    launch_ts = _launch_times(events)

    def cpu_time(e: Mapping[str, Any]) -> float:
        corr = (e.get("args") or {}).get("correlation")
        return launch_ts.get(corr, float(e["ts"])) if corr is not None else float(e["ts"])

    kernels: dict[str, list[float]] = defaultdict(list)
    k_phase: _ByPhase = defaultdict(lambda: defaultdict(list))
    memcpy_us, mallocs = 0.0, 0
    for e in events:
        cat = e.get("cat")
        if cat == "kernel":
            t = cpu_time(e)
            if inside(t):
                dur = float(e.get("dur", 0.0))
                kernels[str(e.get("name", "?"))].append(dur)
                k_phase[phases.phase_at(t)][str(e.get("name", "?"))].append(dur)
        elif cat in ("gpu_memcpy", "gpu_memset"):
            if inside(cpu_time(e)):
                memcpy_us += float(e.get("dur", 0.0))
        elif cat == "cuda_runtime":
            name = str(e.get("name", ""))
            if ("Malloc" in name or "Free" in name) and inside(float(e["ts"])):
                mallocs += 1
    return kernels, k_phase, memcpy_us, mallocs


def _host_ops(
    events: list[dict[str, Any]], phases: PhaseIndex, inside: Callable[[float], bool]
) -> tuple[dict[str, list[float]], _ByPhase, int]:
    """CPU ops' self times (us; by name and by phase) and their count inside the window."""
    ops: dict[str, list[float]] = defaultdict(list)
    o_phase: _ByPhase = defaultdict(lambda: defaultdict(list))
    op_count = 0
    for e, self_us, _depth in self_times([e for e in events if e.get("cat") == "cpu_op"]):
        ts = float(e["ts"])
        if not inside(ts):
            continue
        op_count += 1
        ops[str(e["name"])].append(self_us)
        o_phase[phases.phase_at(ts)][str(e["name"])].append(self_us)
    return ops, o_phase, op_count


def _phase_rows(k_phase: _ByPhase, o_phase: _ByPhase, steps: int, has_gpu: bool) -> list[dict[str, Any]]:
    """One row per phase (in the loop's order): GPU and CPU ms per step, counts."""
    rows = []
    for p in order_phases(set(k_phase) | set(o_phase)):
        kp, op = k_phase.get(p, {}), o_phase.get(p, {})
        gpu_ms = round(sum(sum(d) for d in kp.values()) / 1e3 / steps, 4)
        rows.append(
            {
                "phase": p,
                "gpu_ms_per_step": gpu_ms if has_gpu else None,
                "cpu_ms_per_step": round(sum(sum(d) for d in op.values()) / 1e3 / steps, 4),
                "kernels_per_step": round(sum(len(d) for d in kp.values()) / steps, 2),
                "ops_per_step": round(sum(len(d) for d in op.values()) / steps, 2),
                "unique_kernels": len(kp),
            }
        )
    return rows


def analyze_trace(trace: Mapping[str, Any], top_per_phase: int = TOP_PER_PHASE) -> dict[str, Any]:
    """Mine one trace. Times in the result are milliseconds per step unless named otherwise.

    Returns:
        ``window{start_us, end_us, wall_ms, steps}``, ``has_gpu``, GPU figures
        (``gpu_busy_ms_per_step``, ``kernels_per_step``, ``unique_kernels``,
        ``mean_kernel_us``, ``memcpy_ms_per_step``, ``cuda_mallocs_per_step``,
        ``tensorcore_pct``; ``None`` without kernels), CPU figures (``cpu_ops_ms_per_step``
        = self time, ``ops_per_step``), ``kernels`` / ``ops`` rows, ``categories`` (of kernels,
        or of CPU ops on a CPU run), ``phases`` (per phase gpu/cpu ms, counts),
        ``kernels_by_phase`` / ``ops_by_phase`` (top ``top_per_phase`` rows each).
    """
    events = _x_events(trace)
    w0, w1, steps = analysis_window(events)
    steps = max(int(steps), 1)
    phases = PhaseIndex(events)
    inside = functools.partial(_in_window, w0, w1)
    kernels, k_phase, memcpy_us, mallocs = _device_side(events, phases, inside)
    ops, o_phase, op_count = _host_ops(events, phases, inside)
    busy_us = sum(sum(d) for d in kernels.values())
    n_kernels = sum(len(d) for d in kernels.values())
    op_us = sum(sum(d) for d in ops.values())
    has_gpu = n_kernels > 0
    tc_us = sum(sum(d) for n, d in kernels.items() if is_tensorcore(n))

    phase_rows = _phase_rows(k_phase, o_phase, steps, has_gpu)
    return {
        "window": {
            "start_us": w0,
            "end_us": w1,
            "wall_ms": round((w1 - w0) / 1e3, 3),
            "steps": steps,
        },
        "has_gpu": has_gpu,
        "gpu_busy_ms_per_step": round(busy_us / 1e3 / steps, 4) if has_gpu else None,
        "kernels_per_step": round(n_kernels / steps, 2) if has_gpu else None,
        "unique_kernels": len(kernels) if has_gpu else None,
        "mean_kernel_us": round(busy_us / n_kernels, 3) if has_gpu else None,
        "memcpy_ms_per_step": round(memcpy_us / 1e3 / steps, 4) if has_gpu else None,
        "cuda_mallocs_per_step": round(mallocs / steps, 2) if has_gpu else None,
        "tensorcore_pct": round(100.0 * tc_us / busy_us, 2) if busy_us else None,
        "cpu_ops_ms_per_step": round(op_us / 1e3 / steps, 4),
        "ops_per_step": round(op_count / steps, 2),
        "kernels": _rows(kernels, steps, busy_us, "kernel", "pct_of_gpu", True),
        "ops": _rows(ops, steps, op_us, "op", "pct_of_cpu_ops", False),
        "categories": _categories(kernels if has_gpu else ops, steps),
        "phases": phase_rows,
        "kernels_by_phase": {
            p: _rows(d, steps, busy_us, "kernel", "pct_of_gpu", True)[:top_per_phase]
            for p, d in k_phase.items()
        },
        "ops_by_phase": {
            p: _rows(d, steps, op_us, "op", "pct_of_cpu_ops", False)[:top_per_phase]
            for p, d in o_phase.items()
        },
    }
