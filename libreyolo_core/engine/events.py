"""``events.jsonl``: the engine's append-only record of a run, read by the service's worker.

One JSON object per line, each with ``event`` (``run_start``, ``epoch_start``,
``progress``, ``epoch_end``, ``artifact``, ``captured_region_changed``, ``profile``,
``run_end``) and ``time`` (unix seconds). Every line is flushed as it is written, so a
reader tailing the file never sees half a run's history after a crash.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

__all__ = ["EventLog", "read_events"]


def _clean(value: Any) -> Any:
    """JSON-safe copy: tensors/numpy scalars to numbers, non-finite floats to None."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value


class EventLog:
    """Appends events to ``<run_dir>/events.jsonl``; a disabled log (non-zero rank) writes nothing."""

    def __init__(self, path: Path | None):
        self.path = path
        self._fh = open(path, "a", encoding="utf-8") if path is not None else None  # noqa: SIM115

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        """Write one event line and return it."""
        record = {"event": event, "time": round(time.time(), 3), **_clean(fields)}
        if self._fh is not None:
            self._fh.write(json.dumps(record, ensure_ascii=False) + "\n")
            self._fh.flush()
        return record

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """Parse an ``events.jsonl`` file; a torn last line (crash mid-write) is skipped."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
