"""A small Server-Sent Events parser (WHATWG HTML, "Parsing an event stream")."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass

__all__ = ["SSEvent", "SSEParser", "aparse_sse", "parse_sse"]


@dataclass
class SSEvent:
    """One dispatched event: ``event`` (default ``message``), ``data`` and ``id``."""

    event: str
    data: str
    id: str | None


class SSEParser:
    """Feed lines (without their line break); :meth:`feed` returns an event on a blank line.

    Comment lines (``:ping``) and unknown fields are ignored; ``data`` lines are joined
    with ``\\n``; ``retry`` is ignored (the SDK has its own backoff).
    """

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None

    def feed(self, line: str) -> SSEvent | None:
        line = line.rstrip("\r")
        if not line:
            if not self._data and not self._event:
                return None
            out = SSEvent(self._event or "message", "\n".join(self._data), self._id)
            self._event, self._data = "", []
            return out
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
        elif field == "id" and "\0" not in value:
            self._id = value
        return None


def parse_sse(lines: Iterable[str]) -> Iterator[SSEvent]:
    """Events from an iterable of text lines (e.g. ``httpx.Response.iter_lines()``)."""
    parser = SSEParser()
    for line in lines:
        ev = parser.feed(line)
        if ev is not None:
            yield ev


async def aparse_sse(lines: AsyncIterator[str]) -> AsyncIterator[SSEvent]:
    """Async twin of :func:`parse_sse` (e.g. over ``httpx.Response.aiter_lines()``)."""
    parser = SSEParser()
    async for line in lines:
        ev = parser.feed(line)
        if ev is not None:
            yield ev
