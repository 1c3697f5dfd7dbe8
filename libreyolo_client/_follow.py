r"""Following a job's events, written once for both clients (no I/O here).

:class:`Follower` decides everything: which request comes next, how long to wait, which
events the caller gets. It hands out *operations* (:meth:`Follower.next_op`) and takes
their answers (:meth:`Follower.answer`) or errors (:meth:`Follower.fail`); ``Client`` and
``AsyncClient`` each have a small driver that performs them with httpx, blocking or
awaiting (the model: httpx's one request flow behind ``Client`` and ``AsyncClient``).
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
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from libreyolo_client._errors import ServiceUnavailable, WaitTimeout, no_answer
from libreyolo_client._models import Event, JobInfo

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


@dataclass(frozen=True)
class Deliver:
    """Hand ``event`` to the caller. Answer: nothing."""

    event: Event


@dataclass(frozen=True)
class Sleep:
    """Wait ``seconds``. Answer: nothing."""

    seconds: float


@dataclass(frozen=True)
class GetPage:
    """``GET path?params`` through the client's retrying request. Answer: the JSON body."""

    path: str
    params: dict[str, Any]


@dataclass(frozen=True)
class OpenStream:
    """Open ``GET path`` as a stream; an error status raises its :class:`APIError` (read
    the body first). Answer: the response's ``content-type`` (``""`` when none)."""

    path: str
    headers: dict[str, str]
    timeout: httpx.Timeout = field(compare=False)


@dataclass(frozen=True)
class NextSSE:
    """The open stream's next event. Answer: an :class:`~libreyolo_client._sse.SSEvent`, or None at its end."""


@dataclass(frozen=True)
class CloseStream:
    """Close the open stream, if any. Answer: nothing. A driver also closes it before it
    throws an error in, and when following stops."""


Op = Deliver | Sleep | GetPage | OpenStream | NextSSE | CloseStream
#: What :func:`follow_events` returns: yields operations, receives their answers.
Follow = Generator[Op, Any, None]


class _Job(Protocol):
    id: str
    info: JobInfo


class Follower:
    """Steps :func:`follow_events` for a driver; arguments as :func:`follow_events`.

    A driver loops: ``op = follower.next_op()`` (None: following is over), performs
    ``op``, then reports its result with :meth:`answer` or its error with :meth:`fail`.
    ``next_op`` raises what following ends with (:class:`WaitTimeout`,
    :class:`ServiceUnavailable`, another :class:`APIError` a driver reported). Close it
    (``contextlib.closing``) when the caller stops early.
    """

    def __init__(self, job: _Job, after: int = 0, *, follow: bool = True,
                 timeout: float | None = None, delay: Callable[[int], float]):
        self._ops = follow_events(job, after, follow=follow, timeout=timeout, delay=delay)
        self._answer: Any = None
        self._error: Exception | None = None

    def next_op(self) -> Op | None:
        """The next operation, or None when every event was delivered."""
        answer, error, self._answer, self._error = self._answer, self._error, None, None
        try:
            return self._ops.send(answer) if error is None else self._ops.throw(error)
        except StopIteration:
            return None

    def answer(self, value: Any) -> None:
        """The result of the operation just performed (see each operation's *Answer*)."""
        self._answer = value

    def fail(self, exc: Exception) -> None:
        """The operation just performed raised ``exc`` (the stream is already closed)."""
        self._error = exc

    def close(self) -> None:
        """Stop following (the caller stopped iterating)."""
        self._ops.close()


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
    last, failures, since_ok = after, 0, time.monotonic()
    while True:
        if failures >= SSE_FAILURES_BEFORE_POLLING:
            yield from _poll(job, last, follow=True, deadline=deadline)
            return
        try:
            got = False
            content_type = yield OpenStream(
                f"/v1/jobs/{job.id}/events/stream",
                {"Accept": "text/event-stream", "Last-Event-ID": str(last)},
                httpx.Timeout(10.0, read=_read_s(deadline)))
            if not content_type.startswith("text/event-stream"):
                raise ServiceUnavailable(0, "the event stream is not text/event-stream "
                                         "(a proxy in the way?)")
            while (sse := (yield NextSSE())) is not None:
                if sse.event == "end":
                    return
                if sse.event in EVENT_TYPES and sse.data:
                    ev = Event.model_validate_json(sse.data)
                    got, failures, since_ok = True, 0, time.monotonic()
                    if ev.seq > last:
                        last = ev.seq
                        yield Deliver(ev)
                check_deadline(deadline, job)
            # the stream ended without `end` (the API restarted): reconnect
            yield CloseStream()
            if not got:
                failures += 1
                yield Sleep(delay(failures - 1))
        except (httpx.TransportError, ServiceUnavailable) as exc:
            yield CloseStream()
            if isinstance(exc, httpx.ReadTimeout):  # nothing said before the deadline
                check_deadline(deadline, job)
            failures += 1
            if time.monotonic() - since_ok > FOLLOW_GIVE_UP_S:
                raise no_answer(exc, None) from exc
            yield Sleep(delay(failures - 1))
        check_deadline(deadline, job)


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

