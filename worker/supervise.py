"""The watch loop's side of a database outage: retry with backoff, keep the engine.

A lost connection to the database (:func:`service.outage.is_outage`) must not end the
supervision of a running engine: the engine trains on, its events wait in
``events.jsonl``, and once the database answers again the runner renews the lease (which
the reaper, itself waiting for the database, could not take meanwhile unless it expired),
polls for a cancel and catches up with the events. An outage shorter than the lease thus
costs the job nothing; a longer one may lose the lease to the reaper, which re-queues the
job as an infrastructure end (no attempt of ``max_attempts`` used).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from service.outage import is_outage, what_is_down

__all__ = ["Outage"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: the first retry after a failed database call, seconds (doubling up to :data:`MAX_WAIT_S`)
FIRST_WAIT_S = 0.5
MAX_WAIT_S = 5.0


class Outage:
    """Backoff state of one watch loop's database calls.

    Args:
        job_id: named in log lines.
        lease_s: the job's lease length (the log says when an outage outlasts it).
        give_up_s: :meth:`retry` raises the outage's error after this many seconds of it.
    """

    def __init__(self, job_id: str, lease_s: float, give_up_s: float = 3600.0):
        self.job_id, self.lease_s, self.give_up_s = job_id, lease_s, give_up_s
        self.since: float | None = None  #: time.monotonic() of the outage's first failure
        self._next = 0.0
        self._wait = FIRST_WAIT_S
        self._warned_lease = False
        self.outages = 0  #: outages seen so far (for tests and logs)

    @property
    def down(self) -> bool:
        """Whether the last database call failed."""
        return self.since is not None

    def due(self, now: float) -> bool:
        """Whether the next database call may be tried at ``now`` (monotonic seconds)."""
        return now >= self._next

    def failed(self, now: float, exc: BaseException) -> None:
        """A call failed with outage ``exc``: wait before the next (doubling, at most
        :data:`MAX_WAIT_S`)."""
        if self.since is None:
            self.since, self.outages = now, self.outages + 1
            log.warning("job %s: the %s is unavailable (%s); the engine keeps training, "
                        "retrying", self.job_id, what_is_down(exc), type(exc).__name__)
        elif not self._warned_lease and now - self.since > self.lease_s:
            self._warned_lease = True
            log.warning("job %s: the outage has outlasted the lease (%g s); the reaper may "
                        "re-queue the job when the database is back", self.job_id, self.lease_s)
        self._next = now + self._wait
        self._wait = min(MAX_WAIT_S, self._wait * 2)

    def up(self, now: float) -> None:
        """A call succeeded: the outage (if any) is over."""
        if self.since is not None:
            log.warning("job %s: the database is back after %.1f s; supervision resumes",
                        self.job_id, now - self.since)
        self.since, self._next, self._wait = None, 0.0, FIRST_WAIT_S
        self._warned_lease = False

    def retry(self, call: Callable[[], T]) -> T:
        """``call()``, retried with backoff while it fails with an outage, for at most
        ``give_up_s`` (then the error is raised). Other errors are raised at once."""
        while True:
            now = time.monotonic()
            try:
                out = call()
            except Exception as exc:
                if not is_outage(exc) or (self.since is not None
                                          and now - self.since > self.give_up_s):
                    raise
                self.failed(now, exc)
                time.sleep(max(0.0, self._next - time.monotonic()))
                continue
            self.up(now)
            return out
