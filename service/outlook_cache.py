"""A per-process memo of :func:`service.scheduler.outlook`, so the hot reads stay cheap.

``GET /v1/jobs/{id}`` and ``GET /v1/jobs`` show a queued job's place in its queue. Working
that out reads the whole queue and replays the fair-share order (about 45 ms at 1,000
queued jobs on SQLite), which every read of a queued job would otherwise pay.

An entry is reused while all of these hold, else the queue is read again:

- nothing was written to the queue's state: ``max(job_events.id)`` (every submit, claim,
  cancel and re-queue appends a ``status`` event; so do a running job's progress events,
  which move the estimates) and ``max(jobs.id)`` are what they were (one cheap indexed
  statement per read);
- the number of live workers serving the queue is the same;
- it is younger than ``max_age_s`` (default 10 s): aging raises effective priorities with
  the clock alone (1 per ``aging_minutes``, 15 min), and a changed per-user cap writes no
  event, so those show within that. (At 2 s, the read that refreshed the entry, ~25 ms
  at 1,000 queued jobs on this 2-core machine, was the p99 of a job read at one client.)

One thread computes a queue's outlook at a time. After a write the others wait for its
answer instead of reading the queue too (32 concurrent reads of a queued job cost one
computation); when an entry has only aged, they keep answering from it meanwhile.
See docs/architecture.md ("Hot reads").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.db.models import Job, JobEvent
from service.scheduler import Outlook, outlook
from service.settings import Settings

__all__ = ["OutlookCache"]

#: ``(max event id, max job id)``, built once: a statement built per call cost more than
#: running it (construction and cache key; the memo checks it on every read)
_WRITE_MARK = select(select(func.max(JobEvent.__table__.c.id)).scalar_subquery(),
                     select(func.max(Job.__table__.c.id)).scalar_subquery())


@dataclass(frozen=True)
class _Entry:
    mark: tuple
    at: float
    outlooks: dict[str, Outlook]


class OutlookCache:
    """Memo of the outlooks of each queue (one per API process, on ``app.state``).

    Args:
        max_age_s: an entry is read again after this many seconds even when nothing was
            written (aging, cap changes).
        clock: monotonic seconds (tests pass a fake one).

    Attributes:
        computed: how many times a queue's outlook was computed (tests read it).
    """

    def __init__(self, max_age_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self.computed = 0

    @staticmethod
    def _write_mark(session: Session) -> tuple:
        """``(max event id, max job id)``: changes with every write that moves a queue."""
        return tuple(session.execute(_WRITE_MARK).one())

    def outlooks(self, session: Session, settings: Settings, queues: Iterable[str],
                 live: dict[str, int]) -> dict[str, Outlook]:
        """:func:`service.scheduler.outlook` of ``queues``: ``{job id: Outlook}`` of every
        queued job of those queues, from the memo when still valid (see the module)."""
        queues = sorted(set(queues))
        if not queues:
            return {}
        mark = self._write_mark(session)
        out: dict[str, Outlook] = {}
        for queue in queues:
            key = (mark, live.get(queue, 0))
            entry = self._entries.get(queue)
            if entry is None or entry.mark != key:  # a write: wait for the new answer
                with self._lock:
                    entry = self._entries.get(queue)
                    if entry is None or entry.mark != key:
                        entry = self._compute(session, settings, queue, key, live)
            elif self._clock() - entry.at > self.max_age_s and self._lock.acquire(blocking=False):
                try:  # only aged: one thread refreshes, the others keep the last answer
                    entry = self._compute(session, settings, queue, key, live)
                finally:
                    self._lock.release()
            out.update(entry.outlooks)
        return out

    def _compute(self, session: Session, settings: Settings, queue: str, key: tuple,
                 live: dict[str, int]) -> _Entry:
        entry = _Entry(key, self._clock(), outlook(session, settings, [queue], live))
        self._entries[queue] = entry
        self.computed += 1
        return entry
