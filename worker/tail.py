"""Tailing the engine's files: ``events.jsonl`` and ``train.log`` read as they grow, turned
into ``job_events`` rows, and what the runner keeps from the events (the job's
``progress``, ``run_end``, the profiler's verdict, artifact kinds, the last log lines).

No I/O but reading the two files; the runner writes what :meth:`Observed.take` returns.
The ingester is one side of the attempt fence (:mod:`libreyolo_core.engine.fence`): an
event line that carries another attempt's ``attempt_token`` is refused.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from libreyolo_core.records.events import (
    ArtifactEvent,
    EngineEvent,
    EpochEndEvent,
    PreflightEvent,
    ProfileEvent,
    ProgressEvent,
    RunEndEvent,
    parse_event,
)

__all__ = ["MAX_LOG_LINES_PER_EVENT", "MAX_READ_BYTES", "METRIC_EVENTS", "PREFLIGHT_PROGRESS",
           "Observed", "Tail", "decode_event", "event_kind"]

METRIC_EVENTS = {"epoch_start", "progress", "epoch_end", "profile", "preflight", "tune_candidate",
                 "tune"}
#: The preflight figures kept in a job's ``progress`` (the page and the SDK show them while
#: the run goes on; the whole estimate is the result's ``preflight``).
PREFLIGHT_PROGRESS = ("img_per_s", "epoch_s", "val_s", "total_s", "epochs", "peak_memory_mb",
                      "memory_kind", "cost", "currency", "device")
MAX_LOG_LINES_PER_EVENT = 500
MAX_READ_BYTES = 4 << 20

#: (kind, time unix seconds, payload): one ``job_events`` row to append.
EventRow = tuple[str, float, dict[str, Any]]

_PROGRESS_KEYS = ("phase", "epoch", "epochs", "step", "steps", "val_batch", "val_batches",
                  "warmup", "measured", "eta_s", "img_per_s", "losses", "candidate",
                  "candidate_index", "candidates", "trial", "trials", "trials_done",
                  "trials_planned")
_EPOCH_END_KEYS = ("epoch", "epochs", "losses", "metrics", "lr", "epoch_time_s", "fitness",
                   "eta_s")


class Tail:
    """Complete lines appended to a file since ``offset`` (offset in bytes)."""

    def __init__(self, path: Path, offset: int):
        self.path, self.offset = path, offset

    def read(self) -> tuple[list[bytes], int]:
        """The complete lines after :attr:`offset` (at most :data:`MAX_READ_BYTES`) and the
        offset just past them; ``([], offset)`` while the file is missing. A line longer
        than the limit comes cut into pieces of that size. The caller moves :attr:`offset` once it has
        kept the lines."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(MAX_READ_BYTES)
        except FileNotFoundError:
            return [], self.offset
        end = data.rfind(b"\n")
        if end < 0:
            if len(data) < MAX_READ_BYTES:
                return [], self.offset
            end = len(data) - 1  # a huge line without newline: take it as is
        chunk = data[: end + 1]
        return chunk.splitlines(), self.offset + len(chunk)


def event_kind(name: str) -> str:
    """The ``job_events.kind`` of an engine event: ``artifact``, ``metric`` or ``status``."""
    if name == "artifact":
        return "artifact"
    if name in METRIC_EVENTS:
        return "metric"
    return "status"


def decode_event(raw: bytes) -> dict[str, Any] | None:
    """One line of ``events.jsonl`` as an object; None for a blank line. A line that is not
    a JSON object becomes ``{"event": "bad_event_line", "line": <its first 2000 chars>}``."""
    if not raw.strip():
        return None
    try:
        ev = json.loads(raw)
        if not isinstance(ev, dict):
            raise ValueError("not an object")
    except ValueError:
        ev = {"event": "bad_event_line", "line": raw.decode("utf-8", "replace")[:2000]}
    return ev


class Observed:
    """What the runner keeps from one attempt's engine events (read as records,
    :func:`~libreyolo_core.records.events.parse_event`).

    Args:
        progress: the job's ``progress`` so far (an earlier attempt's, on a resume).
        log_tail_lines: how many of the last log lines :attr:`log_tail` keeps.
    """

    def __init__(self, progress: dict[str, Any] | None, *, log_tail_lines: int,
                 attempt_token: str | None = None):
        self.attempt_token = attempt_token  #: this attempt's; see :meth:`take`
        #: the size of ``events.jsonl`` when this attempt raised its fence: lines of an
        #: earlier attempt before it are that attempt's history, lines after it refused
        self.fence_offset = 0
        self.refused = 0  #: event lines of an earlier attempt refused so far
        self.progress: dict[str, Any] = dict(progress or {})
        self.run_end: RunEndEvent | None = None
        self.profile: ProfileEvent | None = None
        self.artifact_kinds: dict[str, str] = {}  # relative path -> kind the engine named
        self.log_tail: list[str] = []
        self.log_tail_lines = log_tail_lines

    def take(self, event_lines: list[bytes], log_lines: list[bytes],
             start: int = 0) -> list[EventRow]:
        """Observe new lines of ``events.jsonl`` and ``train.log``; the rows to append:
        one per event (its line's JSON as it is), then the log lines in events of at most
        :data:`MAX_LOG_LINES_PER_EVENT` lines. ``start``: the file offset of the first event
        line. A line of another attempt (its ``attempt_token``) that ends past
        :attr:`fence_offset` is refused (one log row says how many)."""
        rows: list[EventRow] = []
        refused = 0
        end = start
        for raw in event_lines:
            end += len(raw) + 1  # the engine ends its lines with "\n"
            data = decode_event(raw)
            if data is None:
                continue
            other = data.get("attempt_token")
            if self.attempt_token is not None and other is not None \
                    and other != self.attempt_token and end > self.fence_offset:
                refused += 1  # the fence: written after this attempt started
                continue
            ev = parse_event(data)
            self.observe(ev)
            rows.append((event_kind(ev.event), float(ev.time or time.time()), data))
        if refused:
            self.refused += refused
            rows.append(("log", time.time(), {"event": "log", "lines": [
                f"refused {refused} event line(s) of an earlier attempt of this job (its "
                f"engine wrote after attempt {self.attempt_token} started)"]}))
        if log_lines:
            text = [ln.decode("utf-8", "replace").rstrip("\r") for ln in log_lines]
            self.log_tail = (self.log_tail + text)[-self.log_tail_lines:]
            now = time.time()
            for i in range(0, len(text), MAX_LOG_LINES_PER_EVENT):
                rows.append(("log", now, {"event": "log",
                                          "lines": text[i:i + MAX_LOG_LINES_PER_EVENT]}))
        return rows

    def observe(self, ev: EngineEvent) -> None:
        """Fold one engine event into the kept state."""
        if isinstance(ev, ProgressEvent):  # progress and epoch_start
            self._keep(ev, _PROGRESS_KEYS)
        elif isinstance(ev, PreflightEvent):
            self.progress["preflight"] = {k: getattr(ev, k, None) for k in PREFLIGHT_PROGRESS}
        elif isinstance(ev, EpochEndEvent):
            for k in ("phase", "val_batch", "val_batches"):  # the epoch's phases are over
                self.progress.pop(k, None)
            self._keep(ev, _EPOCH_END_KEYS)
            if ev.has("epoch"):  # kept in progress so that a resumed attempt still knows it
                self.progress["epochs_completed"] = ev.epoch
            if ev.is_best:
                self.progress["best_epoch"] = ev.epoch
        elif isinstance(ev, ArtifactEvent):
            self.artifact_kinds[ev.path] = str(ev.kind or "other")
        elif isinstance(ev, RunEndEvent):
            self.run_end = ev
        elif isinstance(ev, ProfileEvent):
            self.profile = ev

    def _keep(self, ev: EngineEvent, keys: tuple[str, ...]) -> None:
        """Copy the fields ``keys`` that ``ev`` carried into :attr:`progress` (JSON form)."""
        payload = ev.payload()
        for k in keys:
            if k in payload:
                self.progress[k] = payload[k]
