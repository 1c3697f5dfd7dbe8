"""Formatting for the browser pages: durations, ages, sizes, metrics, times, the queue
line, the profiler's lever and confidence. Pure functions of their arguments (the Jinja
filters of :mod:`service.web.routes` are some of them)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from libreyolo_core.profiler.confidence import Confidence
from libreyolo_core.profiler.record import Lever
from service.scheduler import Outlook

__all__ = ["PROFILE_FIGURES", "aware", "fmt_duration", "fmt_age", "fmt_bytes", "fmt_metric",
           "fmt_seconds", "iso", "clock", "fmt_queue", "tune_progress_text", "lever_text",
           "confidence_text", "fmt_gain", "fmt_devices", "node_state_text"]

#: Profile figures shown on the verdict card: field of
#: :class:`~libreyolo_core.records.events.ProfileEvent`, label, formatter.
PROFILE_FIGURES = (
    ("step_ms", "step time", lambda v: f"{v:.1f} ms"),
    ("img_per_s", "throughput", lambda v: f"{v:.1f} img/s"),
    ("dataload_ms", "data wait", lambda v: f"{v:.1f} ms"),
    ("dataload_frac", "data wait share", lambda v: f"{100 * v:.0f}%"),
    ("gpu_util", "GPU utilisation", lambda v: f"{100 * v:.0f}%"),
    ("gpu_busy_ms_per_step", "GPU busy per step", lambda v: f"{v:.1f} ms"),
    ("host_overhead_ms_per_step", "host overhead per step", lambda v: f"{v:.1f} ms"),
    ("kernels_per_step", "kernels per step", lambda v: f"{v:,.0f}"),
    ("ops_per_step", "CPU ops per step", lambda v: f"{v:,.0f}"),
    ("cuda_mallocs_per_step", "cudaMalloc/Free per step", lambda v: f"{v:.1f}"),
    ("peak_vram_mb", "peak VRAM", lambda v: f"{v:,.0f} MB"),
)


def aware(dt: datetime | None) -> datetime | None:
    if dt is None:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def fmt_duration(seconds: float | None) -> str:
    """``75.2 -> '1 min 15 s'``; an em dash for None."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def fmt_age(dt: datetime | None, now: datetime | None = None) -> str:
    """How long ago, coarse: ``'12 s ago'``, ``'3 min ago'``, ``'2 h ago'``, ``'4 d ago'``."""
    dt = aware(dt)
    if dt is None:
        return "—"
    s = max(0, int(((now or datetime.now(UTC)) - dt).total_seconds()))
    if s < 60:
        return f"{s} s ago"
    if s < 3600:
        return f"{s // 60} min ago"
    if s < 86400:
        return f"{s // 3600} h ago"
    return f"{s // 86400} d ago"


def fmt_bytes(n: int | None) -> str:
    """``1536 -> '1.5 KiB'``."""
    if n is None:
        return "—"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def fmt_metric(v: Any) -> str:
    """A 0-1 metric with four decimals; anything else as text."""
    if isinstance(v, int | float) and not isinstance(v, bool):
        return f"{v:.4f}"
    return "—" if v is None else str(v)


def fmt_seconds(seconds: float | None) -> str:
    """``fmt_duration``, with a decimal under 10 s (``1.2 s``): estimates of short epochs."""
    if isinstance(seconds, int | float) and math.isfinite(seconds) and 0 <= seconds < 10:
        return f"{seconds:.1f} s"
    return fmt_duration(seconds)


def iso(dt: datetime | None) -> str:
    dt = aware(dt)
    return dt.isoformat(timespec="seconds") if dt else ""


def clock(dt: datetime | None, now: datetime | None = None) -> str:
    """``"14:05 UTC"`` (with the date when not today); empty for None."""
    dt = aware(dt)
    if dt is None:
        return ""
    today = (now or datetime.now(UTC)).date()
    return dt.strftime("%H:%M UTC" if dt.date() == today else "%Y-%m-%d %H:%M UTC")


def fmt_queue(where: Outlook | None, now: datetime) -> str | None:
    """``"2nd in queue · starts in ~5 min"`` (or without the estimate when it is unknown;
    ``"next in queue"`` for the first) from a queued job's :class:`Outlook`."""
    if where is None:
        return None
    pos = where.position
    text = "next in queue" if pos == 1 else f"{_ordinal(pos)} in queue"
    if where.estimated_start is not None:
        wait = (where.estimated_start - now).total_seconds()
        text += " · starts " + ("now" if wait < 30 else f"in ~{_rough(wait)}")
    return text


def _rough(seconds: float) -> str:
    """A wait as an estimate says it: ``'4 min'``, ``'2 h 10 min'``, ``'3 d 4 h'``."""
    minutes = max(1, round(seconds / 60))
    if minutes < 60:
        return f"{minutes} min"
    return fmt_duration(minutes * 60).replace(" 0 min", "")


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def tune_progress_text(p: dict[str, Any]) -> str:
    """``tuning: cache=ram (candidate 2 of 4) · trial 1/3 · 7 of 15 trials done``."""
    i, n = p.get("candidate_index") or 0, p.get("candidates") or 0
    where = "baseline" if i == 0 else f"{p.get('candidate')} (candidate {i} of {n})"
    return (f"tuning: {where} · trial {p.get('trial')}/{p.get('trials')} · "
            f"{p.get('trials_done') or 0} of {p.get('trials_planned')} trials done")


def lever_text(lever: Lever | None) -> str | None:
    """``try workers=8 cache=ram: <why>; <also>`` from a profile's structured lever."""
    if lever is None:
        return None
    params = " ".join(f"{k}={v}" for k, v in lever.params.items())
    text = (f"try {params}: " if params else "") + str(lever.why or "")
    return "; ".join([text, *lever.also])


def confidence_text(conf: Confidence | None) -> tuple[bool, str] | None:
    """``(reliable, sentence)`` from a profile's ``confidence`` (None when not recorded)."""
    if conf is None:
        return None
    if conf.reliable:
        return True, "reliable: the measured steps repeated and nothing else loaded the machine"
    text = "unreliable: " + "; ".join(conf.reasons)
    return False, text + (f". {conf.advice}" if conf.advice else "")


def fmt_gain(v: Any) -> str:
    return "—" if not isinstance(v, int | float) else f"{100 * v:+.0f}%"


def fmt_devices(nodes: int, gpus: int, procs: int) -> str:
    """A job's devices: ``'1 GPU'``, ``'CPU, 2 ranks'``; a multi-node job's per node:
    ``'2 nodes × 1 GPU'``, ``'3 nodes × 2 CPU ranks'``."""
    if nodes > 1:
        per_node = f"{gpus} GPU{'s' if gpus > 1 else ''}" if gpus else \
            f"{procs} CPU rank{'s' if procs > 1 else ''}"
        return f"{nodes} nodes × {per_node}"
    if gpus:
        return f"{gpus} GPU{'s' if gpus > 1 else ''}"
    return "CPU" + (f", {procs} ranks" if procs > 1 else "")


def node_state_text(exit_code: int | None, stop: str | None, live: str) -> str:
    """A node's end as the job page says it: ``'0'``, ``'143 (worker shutdown)'``, the
    ``stop`` alone when no exit code was recorded, else ``live`` (what the node does now:
    ``'running'``, ``'claimed'``...)."""
    if exit_code is not None:
        return f"{exit_code} ({stop})" if stop else str(exit_code)
    return stop or live
