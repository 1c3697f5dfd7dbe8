"""uvicorn's HTTP protocol (the httptools C parser) with Nagle's algorithm off on every
accepted TCP connection.

``serve --workers N`` (N > 1) hands the API processes a listening socket made by
uvicorn's supervisor with protocol number 0, and asyncio sets ``TCP_NODELAY`` only on
sockets whose protocol is ``IPPROTO_TCP``. Without it a keep-alive client waited for the
peer's delayed ACK (~40 ms) on every request (measured: 45 ms against 1.4 ms a request).
httptools rather than h11 (pure Python): 0.2 ms less CPU a request (``GET /v1/jobs/{id}``
1.4 -> 1.2 ms, ``/healthz`` 0.65 -> 0.45 ms; bench/service_latency.py, docs/scaling.md).

It also bounds the request head while it is parsed, before it is buffered: at most
``max_header_count`` headers and ``max_header_bytes`` of them (431), ``max_url_chars`` of
URL (414); uvicorn's httptools protocol has no such limit (16 MiB of headers were read).
The settings are read once per process, from the environment.
"""

from __future__ import annotations

import asyncio
import socket

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

__all__ = ["NoDelayHttpToolsProtocol"]


class NoDelayHttpToolsProtocol(HttpToolsProtocol):
    """:class:`~uvicorn.protocols.http.httptools_impl.HttpToolsProtocol` that sets
    ``TCP_NODELAY``."""

    #: (headers, header bytes, URL characters), from the settings on first use
    limits: tuple[int, int, int] | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if NoDelayHttpToolsProtocol.limits is None:
            from service.settings import Settings

            s = Settings()
            NoDelayHttpToolsProtocol.limits = (s.max_header_count, s.max_header_bytes,
                                               s.max_url_chars)
        self._refused: int | None = None
        self._head = [0, 0]
        super().connection_made(transport)

    def on_message_begin(self) -> None:
        self._head = [0, 0]
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        assert self.limits is not None
        if len(self.url) + len(url) > self.limits[2]:
            self._refused = 414
            raise ValueError("URL too long")
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.limits is not None
        self._head[0] += 1
        self._head[1] += len(name) + len(value) + 4
        if self._head[0] > self.limits[0] or self._head[1] > self.limits[1]:
            self._refused = 431
            raise ValueError("request head too large")
        super().on_header(name, value)

    def send_400_response(self, msg: str) -> None:
        """The parser's refusal: a 431 or 414 when a limit above stopped it."""
        if self._refused is None:
            super().send_400_response(msg)
            return
        assert self.limits is not None
        count, size, url = self.limits
        text = (f"the URL is longer than {url} characters (max_url_chars)" if self._refused == 414
                else f"more than {count} headers (max_header_count) or {size} bytes of them "
                     "(max_header_bytes)")
        self.transport.write(b"".join([
            STATUS_LINE[self._refused], b"content-type: text/plain; charset=utf-8\r\n",
            b"content-length: " + str(len(text)).encode() + b"\r\n",
            b"connection: close\r\n\r\n", text.encode()]))
        self.transport.close()
