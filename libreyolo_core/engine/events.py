"""``events.jsonl``: the engine's append-only record of a run, read by the service's worker.

One JSON object per line, each a typed record of :mod:`libreyolo_core.records.events`
(``run_start``, ``progress``, ``epoch_end``, ``artifact``, ``captured_region_changed``,
``profile``, ``preflight``, ``tune_candidate``, ``tune``, ``run_end``) with ``event`` and
``time`` (unix seconds). Every line is flushed as it is written, so a reader tailing the
file never sees half a run's history after a crash.
"""

from __future__ import annotations

import json
from pathlib import Path

from libreyolo_core.engine import fence
from libreyolo_core.records.events import EngineEvent, parse_event

__all__ = ["EventLog", "read_events"]


class EventLog:
    """Appends events to ``<run_dir>/events.jsonl``; a disabled log (non-zero rank) writes nothing."""

    def __init__(self, path: Path | None):
        self.path = path
        self._fh = open(path, "a", encoding="utf-8") if path is not None else None  # noqa: SIM115
        self._token = fence.token()  # the service's attempt token (None outside it)

    def write(self, event: EngineEvent) -> EngineEvent:
        """Write one event line (:meth:`EngineEvent.to_dict`) and return the record.

        Under the service the line carries ``attempt_token``, and an engine whose attempt
        was fenced off ends before writing (:func:`libreyolo_core.engine.fence.check`)."""
        if self._fh is not None:
            line = event.to_dict()
            if self._token is not None:
                fence.check(f"event {event.event!r}")
                line["attempt_token"] = self._token
            self._fh.write(json.dumps(line, ensure_ascii=False) + "\n")
            self._fh.flush()
        return event

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_events(path: str | Path) -> list[EngineEvent]:
    """Parse an ``events.jsonl`` file into records (:func:`parse_event`); a torn last line
    (crash mid-write) is skipped."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict):
            out.append(parse_event(data))
    return out
