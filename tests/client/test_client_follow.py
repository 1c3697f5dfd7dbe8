"""Following a job's events, the same for ``Client`` and ``AsyncClient`` (no service: an
``httpx.MockTransport`` plays it, or a socket that answers and then says nothing)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest

from libreyolo_client import AsyncClient, AsyncJob, Client, Job, ServiceUnavailable, WaitTimeout
from libreyolo_client._follow import (
    CloseStream,
    Deliver,
    GetPage,
    NextSSE,
    OpenStream,
    Sleep,
    follow_events,
)
from libreyolo_client._models import JobInfo
from libreyolo_client._sse import SSEvent

INFO = JobInfo(id="j" + "0" * 24, kind="train", model="yolo9-t", data="d", status="running")
STREAM = f"/v1/jobs/{INFO.id}/events/stream"
PAGE = f"/v1/jobs/{INFO.id}/events"
TWINS = ["sync", "async"]


def sse(*seqs: int, end: bool = True) -> bytes:
    out = b"".join(b"event: status\nid: %d\ndata: %s\n\n"
                   % (s, json.dumps({"seq": s, "time": 1.0, "kind": "status"}).encode())
                   for s in seqs)
    return out + (b"event: end\ndata: {}\n\n" if end else b"")


def sse_response(body: bytes) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)


def page(*seqs: int, done: bool) -> httpx.Response:
    return httpx.Response(200, json={"data": [{"seq": s, "time": 1.0, "kind": "status"}
                                              for s in seqs], "done": done})


class Cut(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A response body that breaks off after ``body`` (the connection drops)."""

    def __init__(self, body: bytes):
        self.body = body

    def __iter__(self):
        yield self.body
        raise httpx.ReadError("connection reset")

    async def __aiter__(self):
        yield self.body
        raise httpx.ReadError("connection reset")


def follow(twin: str, url: str, transport=None, **kw) -> list[int]:
    """The seqs that ``events(**kw)`` yields, through the sync or the async client."""
    opts = dict(retries=0, backoff_s=0.001)
    if twin == "sync":
        with Client(url, "t", transport=transport, **opts) as c:
            return [e.seq for e in Job(c, INFO).events(**kw)]

    async def main():
        async with AsyncClient(url, "t", transport=transport, **opts) as c:
            return [e.seq async for e in AsyncJob(c, INFO).events(**kw)]

    return asyncio.run(asyncio.wait_for(main(), 30))


def mock(handler) -> httpx.MockTransport:
    return httpx.MockTransport(handler)


@pytest.mark.parametrize("twin", TWINS)
def test_a_dropped_stream_resumes_with_last_event_id(twin):
    seen: list[str | None] = []

    def handler(request):
        seen.append(request.headers.get("last-event-id"))
        if len(seen) == 1:
            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  stream=Cut(sse(1, 2, end=False)))
        return sse_response(sse(2, 3))  # the service sends 2 again: kept once

    assert follow(twin, "http://t", mock(handler)) == [1, 2, 3]
    assert seen == ["0", "2"]


@pytest.mark.parametrize("twin", TWINS)
def test_repeated_stream_failures_fall_back_to_polling(twin):
    paths: list[str] = []

    def handler(request):
        paths.append(request.url.path)
        if request.url.path == STREAM:
            return httpx.Response(200, headers={"content-type": "text/html"}, content=b"<p>")
        after = int(request.url.params["after"])
        return page(*[s for s in (1, 2) if s > after], done=after >= 2)

    assert follow(twin, "http://t", mock(handler), after=0) == [1, 2]
    assert paths[:3] == [STREAM] * 3 and set(paths[3:]) == {PAGE}


@pytest.mark.parametrize("twin", TWINS)
def test_polling_rides_out_a_503(twin):
    """Bug fixed: the async follower's polling gave up at the first 503 (the sync one
    waits, up to FOLLOW_GIVE_UP_S)."""
    polls = 0

    def handler(request):
        nonlocal polls
        if request.url.path == STREAM:
            raise httpx.ConnectError("refused", request=request)
        polls += 1
        return httpx.Response(503, json={"detail": "restarting"}) if polls == 1 \
            else page(1, done=True)

    assert follow(twin, "http://t", mock(handler)) == [1]
    assert polls == 2


@pytest.mark.parametrize("twin", TWINS)
def test_following_gives_up_when_the_service_stays_away(twin, monkeypatch):
    monkeypatch.setattr("libreyolo_client._follow.FOLLOW_GIVE_UP_S", 0.0)

    def handler(request):
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(ServiceUnavailable, match="no answer from the service"):
        follow(twin, "http://t", mock(handler))


@pytest.mark.parametrize("twin", TWINS)
def test_not_following_returns_the_events_stored_so_far(twin):
    def handler(request):
        assert request.url.path == PAGE
        return page(*[s for s in (1, 2) if s > int(request.url.params["after"])], done=False)

    assert follow(twin, "http://t", mock(handler), follow=False) == [1, 2]


@pytest.mark.parametrize("twin", TWINS)
def test_the_stream_read_timeout_is_bounded_by_the_deadline(twin):
    """Bug fixed: the async follower read the stream with a fixed 60 s timeout, so
    ``timeout=`` was not kept while the service sent nothing."""
    reads: list[float] = []

    def handler(request):
        reads.append(request.extensions["timeout"]["read"])
        return sse_response(sse(1))

    assert follow(twin, "http://t", mock(handler), timeout=5) == [1]
    assert 1.0 <= reads[0] <= 5.0
    assert follow(twin, "http://t", mock(handler)) == [1]
    assert reads[1] == 60.0


@pytest.fixture
def silent_server():
    """An HTTP server that answers a stream's headers and then sends nothing."""
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.1)
    stop, conns = threading.Event(), []

    def serve():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\n\r\n")
            conns.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in conns:
        conn.close()
    srv.close()


@pytest.mark.parametrize("twin", TWINS)
def test_a_silent_stream_ends_at_the_deadline(twin, silent_server):
    """Bug fixed (async): ``events(timeout=1.5)`` on a stream that stays silent raised
    WaitTimeout only after the fixed 60 s read timeout."""
    t0 = time.monotonic()
    with pytest.raises(WaitTimeout):
        follow(twin, silent_server, timeout=1.5)
    assert time.monotonic() - t0 < 10


def test_the_follower_alone_says_what_to_do():
    """No I/O in the follower: the operations it asks for, given scripted answers."""
    job = Job.__new__(Job)
    job.id, job.info = INFO.id, INFO
    ops = follow_events(job, 4, delay=lambda attempt: 0.5 * 2 ** attempt)
    op = next(ops)
    assert isinstance(op, OpenStream) and op.headers["Last-Event-ID"] == "4"
    assert ops.send("text/html") == CloseStream()  # not an event stream: a failure
    assert ops.send(None) == Sleep(0.5)
    assert isinstance(ops.send(None), OpenStream)
    assert ops.send("text/event-stream") == NextSSE()
    event = SSEvent("status", json.dumps({"seq": 5, "time": 1.0, "kind": "status"}), "5")
    delivered = ops.send(event)
    assert isinstance(delivered, Deliver) and delivered.event.seq == 5
    assert ops.send(None) == NextSSE()
    assert ops.send(event) == NextSSE()  # seq 5 again: not delivered twice
    assert isinstance(ops.throw(httpx.ReadError("reset")), CloseStream)
    assert ops.send(None) == Sleep(0.5)  # failures start again after an event
    for _ in range(2):  # two more connections refused: then polling takes over
        assert isinstance(ops.send(None), OpenStream)
        assert ops.throw(httpx.ConnectError("refused")) == CloseStream()
        assert isinstance(ops.send(None), Sleep)
    assert ops.send(None) == GetPage(PAGE, {"after": 5, "limit": 1000})
    with pytest.raises(StopIteration):
        ops.send({"data": [], "done": True})


@pytest.mark.parametrize("twin", TWINS)
def test_wait_polls_a_row_that_lags_the_stream_only_so_long(twin, monkeypatch):
    """The stream ended but the job's row still says running (a replica behind): ``wait``
    with a timeout polls the row for FINAL_POLL_S, then raises WaitTimeout (the async twin
    polled for ever)."""
    import libreyolo_client._client as client_module

    monkeypatch.setattr(client_module, "FINAL_POLL_S", 1.0)
    polls: list[float] = []

    def handler(request):
        if request.url.path == STREAM:
            return sse_response(sse(1))
        polls.append(time.monotonic())
        return httpx.Response(200, json=INFO.model_dump(mode="json"))

    opts = dict(retries=0, backoff_s=0.001, transport=mock(handler))
    t0 = time.monotonic()
    with pytest.raises(WaitTimeout, match="still running"):
        if twin == "sync":
            with Client("http://t", "t", **opts) as c:
                Job(c, INFO).wait(timeout=60)
        else:
            async def main():
                async with AsyncClient("http://t", "t", **opts) as c:
                    await AsyncJob(c, INFO).wait(timeout=60)

            asyncio.run(asyncio.wait_for(main(), 30))
    assert 1.0 <= time.monotonic() - t0 < 10 and len(polls) >= 2
