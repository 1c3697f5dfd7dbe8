"""One database poller per API process that wakes the SSE streams whose job has news.

Events live in the database (the worker writes them), so any API process can serve any
stream. Without this, every open stream polled the database on its own every
``sse_poll_s``: 500 idle streams cost 4,000 queries a second. With it, an idle process
runs one statement per ``sse_poll_s`` whatever the number of streams
(``max(job_events.id)``, indexed); only when that moves does it read the ``event_seq`` and
``status`` of the watched jobs (one statement) and wake the streams of the jobs that
changed, which then read their new events.

A stream that starts waiting for a job the poller has not looked at yet makes the next
check read the watched jobs too (an event may have come between the stream's read and
its wait). A job whose row disappears, or a write that added no event, is caught by a
full check of the watched jobs every ``recheck_s``. A check that fails (the database went
away) wakes every waiting stream: its own read then fails and it ends cleanly, so no stream
waits on a poller that cannot see. See docs/architecture.md ("Hot reads").
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import Any

import anyio
from sqlalchemy import func, select

from service.db.models import Job, JobEvent
from service.outage import is_outage

__all__ = ["EventNotifier"]

log = logging.getLogger(__name__)


class EventNotifier:
    """Wakes the streams of a process when their job's ``event_seq`` moves.

    Run :meth:`run` in the app's lifespan; a stream calls :meth:`wait` instead of sleeping.
    While :meth:`run` is not running (an app without lifespan), :meth:`wait` sleeps
    ``poll_s`` and returns, so a stream falls back to polling on its own.

    Args:
        sessions: the session factory (``app.state.sessions``).
        poll_s: seconds between two checks (the setting ``sse_poll_s``).
        recheck_s: seconds between two full checks of the watched jobs.

    Attributes:
        checks: statements run so far (tests count them).
    """

    def __init__(self, sessions: Callable[[], Any], poll_s: float, recheck_s: float = 5.0):
        self.sessions = sessions
        self.poll_s = poll_s
        self.recheck_s = recheck_s
        self.running = False
        self.checks = 0
        self._waiters: dict[str, set[_Waiter]] = {}
        self._seen: dict[str, tuple[float, str | None]] = {}  # job -> (event_seq, status)

    async def wait(self, job_id: str, after: int, timeout: float = math.inf) -> None:
        """Return once job ``job_id`` has an event past seq ``after`` (or its row is gone
        or changed status), as the poller sees it; or after ``timeout`` seconds."""
        if not self.running:
            await anyio.sleep(min(self.poll_s, timeout))
            return
        seen = self._seen.get(job_id)
        if seen is not None and seen[0] > after:
            return
        waiter = _Waiter(asyncio.Event(), asyncio.get_running_loop(), after)
        self._waiters.setdefault(job_id, set()).add(waiter)
        try:
            with anyio.move_on_after(timeout):
                await waiter.event.wait()
        finally:
            waiters = self._waiters.get(job_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[job_id]
                    self._seen.pop(job_id, None)

    async def run(self) -> None:
        """Poll until cancelled (the lifespan's task group cancels it). A second call
        while one runs returns at once (tests serve one app from two servers)."""
        if self.running:
            return
        self.running = True
        last_mark: int | None = None
        since_full = 0.0
        try:
            while True:
                await anyio.sleep(self.poll_s)
                since_full += self.poll_s
                if not self._waiters:
                    continue
                try:
                    mark = await anyio.to_thread.run_sync(self._mark)
                    unseen = any(job not in self._seen for job in list(self._waiters))
                    if mark != last_mark or unseen or since_full >= self.recheck_s:
                        last_mark, since_full = mark, 0.0
                        jobs = list(self._waiters)
                        rows = await anyio.to_thread.run_sync(self._states, jobs)
                        self._wake(jobs, rows)
                except Exception as exc:
                    # the poller is blind: a stream left waiting would wait for as long as
                    # the database is away (pings keep its connection open). Every waiting
                    # stream reads its job once more; in an outage that read fails and the
                    # stream ends cleanly (the client resumes with Last-Event-ID), after a
                    # hiccup it gets what is new and waits again.
                    if is_outage(exc):
                        log.warning("SSE notifier: the database is unavailable (%s); waking "
                                    "%d waiting streams", type(exc).__name__,
                                    sum(len(w) for w in self._waiters.values()))
                    else:
                        log.exception("SSE notifier: poll failed; waking the waiting streams")
                    self._wake_all()
        finally:
            self.running = False
            self._wake_all()

    def waiting(self, job_id: str) -> int:
        """How many streams of this process wait for an event of job ``job_id``."""
        return len(self._waiters.get(job_id, ()))

    def _wake_all(self) -> None:
        for waiters in list(self._waiters.values()):
            for waiter in list(waiters):
                waiter.wake()

    def _mark(self) -> int:
        with self.sessions() as session:
            self.checks += 1
            return session.scalar(select(func.max(JobEvent.id))) or 0

    def _states(self, jobs: list[str]) -> dict[str, tuple[int, str]]:
        with self.sessions() as session:
            self.checks += 1
            return {r.id: (r.event_seq, r.status) for r in session.execute(
                select(Job.id, Job.event_seq, Job.status).where(Job.id.in_(jobs)))}

    def _wake(self, jobs: list[str], rows: dict[str, tuple[int, str]]) -> None:
        for job_id in jobs:
            state: tuple[float, str | None] = rows.get(job_id, (math.inf, None))  # vanished: wake, end
            self._seen[job_id] = state
            for waiter in list(self._waiters.get(job_id, ())):
                if state[0] > waiter.after:
                    waiter.wake()


class _Waiter:
    """A waiting stream: its event, the loop it waits in (one app may be served by
    servers on two loops in tests, so a wake from another loop's thread goes through
    ``call_soon_threadsafe``) and the last seq it has."""

    __slots__ = ("event", "loop", "after")

    def __init__(self, event: asyncio.Event, loop: asyncio.AbstractEventLoop, after: int):
        self.event, self.loop, self.after = event, loop, after

    def wake(self) -> None:
        try:
            same = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            same = False
        if same:
            self.event.set()
        elif not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.event.set)
