"""Plain-text progress for terminals and logs (no dependency beyond the standard library)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from libreyolo_client._models import Event

__all__ = ["EventPrinter", "format_bytes", "format_metrics", "status_text", "nodes_text",
           "verdict_text", "unreliable_reasons", "learned_note", "data_text"]


def format_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


_SIGNIFICANCE: dict[Any, str] = {True: "significant", False: "not significant"}


def significance_word(value: Any) -> str:
    """A ``tune_candidate`` event's ``significant`` field in words: ``significant``,
    ``not significant``, or ``no call`` (absent or null: too few trials to tell)."""
    return _SIGNIFICANCE.get(value, "no call")


def _confidence(d: dict[str, Any]) -> dict[str, Any]:
    conf = d.get("confidence")
    if not isinstance(conf, dict):  # a job's result holds the profile event under "profile"
        conf = (d.get("profile") or {}).get("confidence") if isinstance(d.get("profile"), dict) else None
    return conf if isinstance(conf, dict) else {}


def verdict_text(d: dict[str, Any]) -> str:
    """A profile verdict in one line, flagged as ``profile.json``, the page and the engine
    CLI flag it: ``dataloader UNRELIABLE (few_steps, loaded): <why>`` (``d``: a
    ``profile`` event, or a job's result, whose ``profile`` holds the event)."""
    conf = _confidence(d)
    text = str(d.get("verdict"))
    if conf.get("reliable") is False:
        flags = ", ".join(conf.get("flags") or []) or "see its reasons"
        text += f" UNRELIABLE ({flags})"
    return f"{text}: {d.get('bound_why') or '(no reason given)'}"


def unreliable_reasons(d: dict[str, Any]) -> str | None:
    """Why a verdict is unreliable and what to do, one sentence (None when reliable or
    not recorded)."""
    conf = _confidence(d)
    if conf.get("reliable") is not False:
        return None
    return "; ".join(conf.get("reasons") or []) + (f". {conf['advice']}" if conf.get("advice") else "")


def data_text(result: dict[str, Any] | None) -> str | None:
    """The scan's counts of a finished run, one line: ``train 64 images, 120 boxes, 6 label
    defects (bad_class 3, zero_area 3); val 16 images, 30 boxes`` (None when not recorded)."""
    data = (result or {}).get("data")
    if not isinstance(data, dict) or not data:
        return None
    parts = []
    for split, d in data.items():
        if not isinstance(d, dict):
            continue
        text = f"{split} {d.get('usable')} images, {d.get('boxes')} boxes"
        n = d.get("n_defects") or 0
        if n:
            kinds = ", ".join(f"{k} {v}" for k, v in (d.get("defects") or {}).items())
            text += f", {n} data defect{'s' if n != 1 else ''} ({kinds}; see jobs logs)"
        parts.append(text)
    return "; ".join(parts) or None


def learned_note(result: dict[str, Any] | None, model: str) -> str | None:
    """What a train job's result says when it learned nothing (mAP50 below 0.05), e.g.
    ``"mAP50 0.004 after 5 epochs from scratch: too short to learn. ..."``; None otherwise.
    ``model`` is the job's stored model: a name is a from-scratch run. (The engine's
    ``libreyolo_core.records.notes.learned_nothing`` says the same; the SDK has no engine.)"""
    res = result or {}
    m = (res.get("metrics") or {}).get("mAP50")
    if not isinstance(m, int | float) or m >= 0.05 or res.get("verdict") or res.get("tune"):
        return None
    n = res.get("epochs_completed")
    after = f" after {n} epoch{'s' if n != 1 else ''}" if n else ""
    if not model.startswith("/"):
        return (f"mAP50 {m:.3f}{after} from scratch: too short to learn. From-scratch "
                "training needs about 30 epochs or more (epochs=30), or start from a trained "
                "model (--model <model id> or job:<id>/weights/best.pt)")
    return (f"mAP50 {m:.3f}{after}: the model learned next to nothing on this data; check the "
            "labels and train longer")


def progress_text(d: dict) -> str:
    """One line for a ``progress`` event: ``epoch 2/10  step 5/8  eta 40s`` while
    training, ``epoch 2/10  validating 3/4`` while validating, ``profile window step 7/25
    (5 warm-up + 20 measured)  eta 9s`` in a profile job, ``tuning cache=ram (candidate 2
    of 4)  trial 1/3  7/15 trials done  eta 60s`` in a tune job."""
    eta = d.get("eta_s")
    eta_s = f"  eta {eta:.0f}s" if isinstance(eta, int | float) else ""
    if d.get("phase") == "tuning":
        i = d.get("candidate_index") or 0
        where = "baseline" if i == 0 else f"{d.get('candidate')} (candidate {i} of {d.get('candidates')})"
        return (f"tuning {where}  trial {d.get('trial')}/{d.get('trials')}  "
                f"{d.get('trials_done') or 0}/{d.get('trials_planned')} trials done{eta_s}")
    if d.get("phase") == "profiling":
        window = (f" ({d.get('warmup')} warm-up + {d.get('measured')} measured)"
                  if d.get("warmup") is not None else "")
        return f"profile window step {d.get('step')}/{d.get('steps')}{window}{eta_s}"
    head = f"epoch {d.get('epoch')}/{d.get('epochs')}"
    if d.get("phase") == "validating":
        return f"{head}  validating {d.get('val_batch')}/{d.get('val_batches')}"
    return f"{head}  step {d.get('step')}/{d.get('steps')}{eta_s}"


def nodes_text(nodes: int, gpus: int, procs: int) -> str:
    """A multi-node job's devices: ``'2 nodes x 1 GPU'``, ``'3 nodes x 2 CPU ranks'``
    (``gpus``/``procs`` per node)."""
    per_node = f"{gpus} GPU{'s' if gpus > 1 else ''}" if gpus else \
        f"{procs} CPU rank{'s' if procs > 1 else ''}"
    return f"{nodes} nodes x {per_node}"


def status_text(d: dict[str, Any]) -> str:
    """A ``status`` event in one line: ``running  attempt=1  worker=w1``; a multi-node
    job's start also names its world and nodes: ``world_size=2
    nodes=0:w-a@10.0.0.1,1:w-b@10.0.0.2  rendezvous=10.0.0.1:29500``."""
    parts = [str(d.get("status"))]
    for k, v in d.items():
        if k in ("event", "status", "time"):
            continue
        if k == "nodes" and isinstance(v, list):
            v = ",".join(f"{n.get('node_rank')}:{n.get('worker')}@{n.get('addr')}"
                         for n in v if isinstance(n, dict))
        parts.append(f"{k}={v}")
    return "  ".join(parts)


def format_metrics(metrics: dict | None, keys: tuple[str, ...] = ("mAP50", "mAP50-95")) -> str:
    """``{'mAP50': 0.5, ...}`` -> ``'mAP50 0.5000  mAP50-95 0.3000'`` (missing keys skipped)."""
    if not metrics:
        return ""
    parts = []
    for k in keys:
        v = metrics.get(k, metrics.get(f"metrics/{k}"))
        if isinstance(v, int | float):
            parts.append(f"{k} {v:.4f}")
    return "  ".join(parts)


class EventPrinter:
    """Turns job events into short lines: one per status change, epoch end and node slot
    of a multi-node job taken or released, and (on a terminal) a live ``epoch 2/5  step 7/16  eta 12s`` line rewritten in place.

    Args:
        label: prefix of every line, e.g. the job id.
        stream: where to write (stderr by default).
        logs: also print the engine's log lines.
    """

    def __init__(self, label: str, stream: TextIO | None = None, logs: bool = False):
        self.label, self.stream, self.logs = label, stream or sys.stderr, logs
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._live = False
        self._last_live = 0.0

    def _line(self, text: str) -> None:
        if self._live:
            self.stream.write("\r\033[K")
            self._live = False
        self.stream.write(f"[{self.label}] {text}\n")
        self.stream.flush()

    def __call__(self, ev: Event) -> None:
        """Print the line(s) of ``ev``, if it has any (see the class docstring)."""
        if ev.kind != "status" and ev.name == "progress":
            self._progress(ev.data)
            return
        for text in self._lines(ev):
            self._line(text)

    def _lines(self, ev: Event) -> list[str]:
        """The whole lines ``ev`` prints (``progress``: see :meth:`_progress`)."""
        d, name = ev.data, ev.name
        if ev.kind == "status":
            if name == "status":
                return [f"status: {status_text(d)}"]
            return [f"engine finished: {d.get('status')}"] if name == "run_end" else []
        if name in _ONE_LINE:
            return [_ONE_LINE[name](d)]
        if name == "gang":  # the service: a node slot of a multi-node job taken or released
            return [f"nodes: {ln}" for ln in d.get("lines") or []]
        if ev.kind == "log" and self.logs:
            return list(d.get("lines") or [])
        return []

    def _progress(self, d: dict[str, Any]) -> None:
        """The live step line: rewritten in place on a terminal (at most 5 times a
        second), else a whole line every 15 s."""
        now = time.monotonic()
        if now - self._last_live < (0.2 if self.tty else 15.0):
            return
        self._last_live = now
        text = progress_text(d)
        if not self.tty:
            self._line(text)
            return
        self.stream.write(f"\r\033[K[{self.label}] {text}")
        self.stream.flush()
        self._live = True

    def close(self) -> None:
        """End a live line, if one is showing."""
        if self._live:
            self.stream.write("\n")
            self.stream.flush()
            self._live = False


def _epoch_line(d: dict[str, Any]) -> str:
    losses = d.get("losses") or {}
    loss = "  ".join(f"{k} {v:.3f}" for k, v in losses.items() if isinstance(v, int | float))
    return f"epoch {d.get('epoch')}/{d.get('epochs')}  {loss}  " \
        f"{format_metrics(d.get('metrics'))}".rstrip()


def _tune_candidate_line(d: dict[str, Any]) -> str:
    sig = significance_word(d.get("significant"))
    return (f"tune: {d.get('label')}: {d.get('img_per_s') or 0:.1f} img/s, {sig}"
            + (", recommendable" if d.get("recommendable") else ""))


#: event name -> the one line :class:`EventPrinter` prints for it
_ONE_LINE: dict[str, Callable[[dict[str, Any]], str]] = {
    "epoch_end": _epoch_line,
    "profile": lambda d: f"profile verdict: {verdict_text(d)}",
    "preflight": lambda d: (f"preflight: {d.get('img_per_s', 0):.1f} img/s, epoch "
                            f"{d.get('epoch_s', 0):.1f} s, ETA {d.get('total_s', 0):.0f} s"),
    "tune_candidate": _tune_candidate_line,
    "tune": lambda d: f"tune: {d.get('answer')}",
}
