r"""I/O-free procedures stepped by a driver: the operations, and :class:`Steps`.

Following a job's events (:mod:`libreyolo_client._follow`), reading its log and moving
files (:mod:`libreyolo_client._transfer`) are each written once, as a generator that
yields *operations* and receives their answers. ``Client`` and ``AsyncClient`` each have
one driver (:meth:`libreyolo_client._client.Wire.drive` and its async twin) that performs
the operations with httpx, blocking or awaiting, and nothing else: every rule (what to
ask, how long to wait, when to retry, what a reply means) lives in the generators.

A driver loops: ``op = steps.next_op()`` (None: the procedure is over; its return value is
then :attr:`Steps.result`), performs ``op``, then reports its result with
:meth:`Steps.answer` or its error with :meth:`Steps.fail`. Before it reports an error, and
when the procedure ends, the driver closes the stream it holds open, if any.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

__all__ = ["CloseStream", "Deliver", "GetPage", "GetRaw", "Hash", "NextSSE", "Op",
           "OpenFile", "OpenStream", "Procedure", "Save", "Sleep", "Steps"]

#: ``(done_bytes, total_bytes or None)``, called as a transfer goes.
ProgressFn = Callable[[int, int | None], None]


@dataclass(frozen=True)
class Deliver:
    """Hand ``event`` to the caller (a job :class:`~libreyolo_client._models.Event` when
    following, a log line when reading the log). Answer: nothing."""

    event: Any


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
class GetRaw:
    """``GET path?params`` through the client's retrying request. Answer: the
    :class:`httpx.Response` (body read)."""

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
class OpenFile:
    """Open ``GET path?params`` as a stream of bytes (no retries: the procedure decides).
    The body of an error status (>= 400) is read first. Answer: the
    :class:`httpx.Response`, its body unread unless it is an error."""

    path: str
    params: dict[str, Any]
    headers: dict[str, str]
    timeout: httpx.Timeout = field(compare=False)


@dataclass(frozen=True)
class Save:
    """Write the body of the stream :class:`OpenFile` opened to ``file`` (``mode`` ``"wb"``
    or ``"ab"``), calling ``report(done, total)`` after each chunk with ``done`` counted
    from ``done``. Answer: the bytes done (``done`` + bytes written)."""

    file: Path
    mode: str
    done: int
    total: int | None
    report: ProgressFn | None = field(compare=False, default=None)


@dataclass(frozen=True)
class Hash:
    """The sha256 of the local ``file`` (a worker thread in the async client). Answer:
    the hex digest."""

    file: Path


@dataclass(frozen=True)
class CloseStream:
    """Close the open stream, if any. Answer: nothing. A driver also closes it before it
    throws an error in, and when the procedure ends."""


Op = Deliver | Sleep | GetPage | GetRaw | OpenStream | NextSSE | OpenFile | Save | Hash | \
    CloseStream
#: A procedure: yields operations, receives their answers, returns its result.
Procedure = Generator[Op, Any, Any]


class Steps:
    """Steps a :data:`Procedure` for a driver.

    ``next_op`` raises what the procedure ends with (an :class:`APIError` the driver
    reported and the procedure did not handle, :class:`WaitTimeout`...). Close it
    (``contextlib.closing``) when the caller stops early.
    """

    def __init__(self, procedure: Procedure):
        self._ops = procedure
        self._answer: Any = None
        self._error: Exception | None = None
        #: the procedure's return value, once :meth:`next_op` returned None.
        self.result: Any = None

    def next_op(self) -> Op | None:
        """The next operation, or None when the procedure is over."""
        answer, error, self._answer, self._error = self._answer, self._error, None, None
        try:
            return self._ops.send(answer) if error is None else self._ops.throw(error)
        except StopIteration as stop:
            self.result = stop.value
            return None

    def answer(self, value: Any) -> None:
        """The result of the operation just performed (see each operation's *Answer*)."""
        self._answer = value

    def fail(self, exc: Exception) -> None:
        """The operation just performed raised ``exc`` (the stream is already closed)."""
        self._error = exc

    def close(self) -> None:
        """Stop the procedure (the caller stopped iterating)."""
        self._ops.close()
