"""#28.11 (a public bug report): the SDK ignored Retry-After on 503 and 429. It waits
what the header asks, bounded by MAX_RETRY_AFTER_S, against a real HTTP server."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class _Busy(BaseHTTPRequestHandler):
    """Answers ``plan`` in order (status, Retry-After), then 200 with a health body."""

    plan: list[tuple[int, str | None]] = []
    seen: list[float] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        type(self).seen.append(time.monotonic())
        status, after = type(self).plan.pop(0) if type(self).plan else (200, None)
        body = json.dumps({"status": "ok"} if status == 200 else
                          {"title": "busy", "status": status, "detail": "try later"}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if status == 200 else
                         "application/problem+json")
        if after is not None:
            self.send_header("Retry-After", after)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def busy():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Busy)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    _Busy.seen = []
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


@pytest.mark.parametrize("status", [503, 429])
def test_retry_after_is_honoured(busy, status):
    from libreyolo_client import Client

    _Busy.plan = [(status, "1"), (status, "1")]
    with Client(busy, token="t", backoff_s=0.01, retries=3) as c:
        assert c._json("GET", "/healthz") == {"status": "ok"}
    gaps = [b - a for a, b in zip(_Busy.seen, _Busy.seen[1:], strict=False)]
    assert len(gaps) == 2 and all(g >= 0.95 for g in gaps), gaps  # not the 0.01 s backoff


def test_retry_after_is_bounded(busy, monkeypatch):
    import libreyolo_client._client as client_mod
    from libreyolo_client import Client

    monkeypatch.setattr(client_mod, "MAX_RETRY_AFTER_S", 0.2)
    _Busy.plan = [(503, "3600")]
    with Client(busy, token="t", backoff_s=0.01, retries=2) as c:
        assert c._json("GET", "/healthz") == {"status": "ok"}
    assert _Busy.seen[1] - _Busy.seen[0] >= 0.19  # it waited, but not the hour asked


def test_retry_after_as_an_http_date():
    import httpx

    from libreyolo_client._client import retry_after_s

    r = httpx.Response(503, headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})
    assert retry_after_s(r) == 0.0  # in the past: no wait
    assert retry_after_s(httpx.Response(503, headers={"Retry-After": "2.5"})) == 2.5
    assert retry_after_s(httpx.Response(503)) is None
