r"""Following a job's events, written once for both clients (no I/O here).

:class:`Follower` decides everything: which request comes next, how long to wait, which
events the caller gets. It hands out *operations* (:meth:`Follower.next_op`) and takes
their answers (:meth:`Follower.answer`) or errors (:meth:`Follower.fail`); ``Client`` and
``AsyncClient`` each have one driver that performs them with httpx, blocking or awaiting
(the model: httpx's one request flow behind ``Client`` and ``AsyncClient``); the
operations and the stepping are :mod:`libreyolo_client._steps`, shared with the log and
file transfers of :mod:`libreyolo_client._transfer`.
Inside, the rules are one generator, :func:`follow_events`, written as plain blocking code
whose I/O points are ``yield``\s.

The rules, as ``Job.events`` documents them:

- Follow the Server-Sent Events stream ``GET /v1/jobs/{id}/events/stream``; each connection
  sends ``Last-Event-ID`` (the last ``seq`` delivered), so a dropped connection resumes with
  no gap, and an event the service sends again is not delivered twice. ``end`` ends it.
- A stream read waits at most until the caller's deadline (at least 1 s, at most 60 s), so
  ``timeout=`` holds while the service says nothing.
- A stream that fails (no answer, 502/503/504, a body that is not ``text/event-stream``)
  or ends without an event is retried with the client's backoff; after
  :data:`SSE_FAILURES_BEFORE_POLLING` in a row, polling ``GET /v1/jobs/{id}/events``
  (1 s between empty pages) takes over until the job is done.
- The follower gives up with :class:`ServiceUnavailable` when the service has not answered
  for :data:`FOLLOW_GIVE_UP_S` seconds, and raises :class:`WaitTimeout` past the deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from libreyolo_client._errors import ServiceUnavailable, WaitTimeout, no_answer
from libreyolo_client._models import Event, JobInfo
from libreyolo_client._steps import (
    CloseStream,
    Deliver,
    GetPage,
    NextSSE,
    OpenStream,
    Procedure,
    Sleep,
    Steps,
)

__all__ = ["FOLLOW_GIVE_UP_S", "SSE_FAILURES_BEFORE_POLLING", "CloseStream", "Deliver", "Follow",
           "Follower", "GetPage", "NextSSE", "OpenStream", "Sleep", "check_deadline",
           "follow_events"]

#: give up following a job when the service has not answered for this long (seconds).
FOLLOW_GIVE_UP_S = 300.0
#: consecutive SSE failures before following falls back to polling ``/events``.
SSE_FAILURES_BEFORE_POLLING = 3
#: the longest wait for the stream's next line, seconds (the service pings more often).
STREAM_READ_S = 60.0
#: SSE event types that carry a job event (``end`` closes the stream; others are skipped).
EVENT_TYPES = ("log", "metric", "status", "artifact")
PAGE_LIMIT = 1000
POLL_S = 1.0


#: What :func:`follow_events` returns: yields operations, receives their answers.
Follow = Procedure


class _Job(Protocol):
    id: str
    info: JobInfo


class Follower(Steps):
    """Steps :func:`follow_events` for a driver (see :class:`~libreyolo_client._steps.Steps`);
    arguments as :func:`follow_events`."""

    def __init__(self, job: _Job, after: int = 0, *, follow: bool = True,
                 timeout: float | None = None, delay: Callable[[int], float]):
        super().__init__(follow_events(job, after, follow=follow, timeout=timeout,
                                       delay=delay))


def follow_events(job: _Job, after: int = 0, *, follow: bool = True,
                  timeout: float | None = None, delay: Callable[[int], float]) -> Follow:
    """The operations that deliver ``job``'s events after ``seq`` ``after``, each once.

    Args:
        job: the handle (its ``id``, and ``info.status`` for a :class:`WaitTimeout`).
        after: start after this ``seq`` (0 = from the first event).
        follow: follow until the job ends; False returns the events stored so far.
        timeout: seconds from the first step; None = no limit.
        delay: the client's backoff, seconds before retry number ``attempt`` (0, 1, ...).

    Raises (out of ``send``/``throw``):
        WaitTimeout: ``timeout`` passed.
        ServiceUnavailable: no answer for :data:`FOLLOW_GIVE_UP_S` seconds.
        APIError: any other error the driver throws in (NotFound, AuthError...).
    """
    if not follow:
        yield from _poll(job, after, follow=False, deadline=None)
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    seen = _Seen(last=after)
    while True:
        if seen.failures >= SSE_FAILURES_BEFORE_POLLING:
            yield from _poll(job, seen.last, follow=True, deadline=deadline)
            return
        try:
            got = yield from _stream(job, seen, deadline)
            if got is None:  # `end`
                return
            # the stream ended without `end` (the API restarted): reconnect
            yield CloseStream()
            if not got:
                seen.failures += 1
                yield Sleep(delay(seen.failures - 1))
        except (httpx.TransportError, ServiceUnavailable) as exc:
            yield CloseStream()
            if isinstance(exc, httpx.ReadTimeout):  # nothing said before the deadline
                check_deadline(deadline, job)
            seen.failures += 1
            if time.monotonic() - seen.since_ok > FOLLOW_GIVE_UP_S:
                raise no_answer(exc, None) from exc
            yield Sleep(delay(seen.failures - 1))
        check_deadline(deadline, job)


@dataclass
class _Seen:
    """Where following stands: the last ``seq`` delivered, stream failures in a row, and
    when the service last sent an event (``time.monotonic()``)."""

    last: int
    failures: int = 0
    since_ok: float = field(default_factory=time.monotonic)


def _stream(job: _Job, seen: _Seen, deadline: float | None) -> Procedure:
    """One connection to the event stream, from ``seen.last``: delivers its new events
    (each event received resets ``seen.failures``). Returns whether it received any, or
    None when it said ``end``."""
    got = False
    content_type = yield OpenStream(
        f"/v1/jobs/{job.id}/events/stream",
        {"Accept": "text/event-stream", "Last-Event-ID": str(seen.last)},
        httpx.Timeout(10.0, read=_read_s(deadline)))
    if not content_type.startswith("text/event-stream"):
        raise ServiceUnavailable(0, "the event stream is not text/event-stream "
                                 "(a proxy in the way?)")
    while (sse := (yield NextSSE())) is not None:
        if sse.event == "end":
            return None
        if sse.event in EVENT_TYPES and sse.data:
            ev = Event.model_validate_json(sse.data)
            got, seen.failures, seen.since_ok = True, 0, time.monotonic()
            if ev.seq > seen.last:
                seen.last = ev.seq
                yield Deliver(ev)
        check_deadline(deadline, job)
    return got


def _read_s(deadline: float | None) -> float:
    """The stream's read timeout: until the deadline, within [1, STREAM_READ_S] seconds."""
    if deadline is None:
        return STREAM_READ_S
    return max(1.0, min(STREAM_READ_S, deadline - time.monotonic()))


def _poll(job: _Job, after: int, *, follow: bool, deadline: float | None) -> Follow:
    """Events by polling ``GET /events?after=`` (:data:`POLL_S` between empty pages); a
    :class:`ServiceUnavailable` is waited out while following, up to FOLLOW_GIVE_UP_S."""
    last, since_ok = after, time.monotonic()
    while True:
        try:
            page = yield GetPage(f"/v1/jobs/{job.id}/events",
                                 {"after": last, "limit": PAGE_LIMIT})
        except ServiceUnavailable:
            if not follow or time.monotonic() - since_ok > FOLLOW_GIVE_UP_S:
                raise
            yield Sleep(POLL_S)
            continue
        since_ok = time.monotonic()
        for e in page["data"]:
            ev = Event.model_validate(e)
            if ev.seq > last:
                last = ev.seq
                yield Deliver(ev)
        if page.get("done") or (not follow and not page["data"]):
            return
        if not page["data"]:
            check_deadline(deadline, job)
            yield Sleep(POLL_S)


def check_deadline(deadline: float | None, job: _Job) -> None:
    """Raise :class:`WaitTimeout` when ``deadline`` (``time.monotonic()``) has passed."""
    if deadline is not None and time.monotonic() > deadline:
        raise WaitTimeout(f"job {job.id} not finished in time (status {job.info.status}); "
                          "it keeps running on the service")

