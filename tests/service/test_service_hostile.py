"""Hostile input gets a 4xx, never a 500, and is bounded before it costs anything (issue
27, section 5), against a real server on SQLite and PostgreSQL."""

from __future__ import annotations

import io
import socket
import zipfile
from urllib.parse import urlsplit

import pytest
from testkit import client, make_user


@pytest.fixture
def mallory(server, sessions):
    name, token = make_user(sessions)
    with client(server.url, token) as c:
        c.token, c.user_name = token, name
        yield c


def _job(c, **over):
    body = {"model": "yolo9-t", "data": "/nowhere/data.yaml", "gpus": 0, "params": {"epochs": 1}}
    return c.post("/v1/jobs", json={**body, **over})


def _raw(url: str, head: bytes, body: bytes = b"", timeout: float = 10) -> bytes:
    """Send ``head`` (and ``body``) on a raw socket; the server's answer, read until it
    closes or goes quiet (a body promised in Content-Length may never be sent)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        sock.sendall(head + body)
        out = b""
        try:
            while b"\r\n\r\n" not in out or not out.endswith(b"}"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                out += chunk
        except TimeoutError:
            pass
        return out


def test_a_body_is_not_read_before_authentication(server):
    """A 200 MB body promised with no token: the 401 comes back before one byte of the
    body is sent (the server does not wait for it)."""
    head = (b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 200000000\r\n\r\n")
    answer = _raw(server.url, head)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert b"before the body is read" in answer


def test_body_caps_per_route(mallory, server):
    settings = server.app.state.settings
    auth = f"Authorization: Bearer {mallory.token}\r\n".encode()
    # a Content-Length over the JSON cap: refused at once, the body never sent
    answer = _raw(server.url, b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\n" + auth +
                  b"Content-Type: application/json\r\nContent-Length: 50000000\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 413") and b"max_json_bytes" in answer, answer[:300]
    # a chunked body (no length) is counted as it comes and cut at the cap
    r = mallory.post("/v1/jobs", content=iter([b" " * 65536] * 40),
                     headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "max_json_bytes" in r.json()["detail"], r.text
    # the dataset upload has its own (larger) cap
    assert settings.max_upload_bytes > settings.max_json_bytes
    r = mallory.post("/v1/datasets", params={"name": "x"}, content=b"PK" + b"\0" * (2 << 20),
                     headers={"Content-Type": "application/zip"})
    assert r.status_code == 422, r.text  # read (not a 413), then refused as not a zip


def test_header_limits(mallory, server):
    settings = server.app.state.settings
    many = {f"x-h{i}": "v" for i in range(settings.max_header_count + 1)}
    r = mallory.get("/v1/jobs", headers=many)
    assert r.status_code == 431 and "max_header_count" in r.json()["detail"], r.text
    r = mallory.get("/v1/jobs", headers={"x-big": "v" * settings.max_header_bytes})
    assert r.status_code in (431, 400), r.text  # the server's parser may refuse it first
    r = mallory.get("/v1/jobs/" + "j" * (settings.max_url_chars + 1))
    assert r.status_code == 414, r.text


def test_nul_and_long_paths_are_4xx(mallory, sessions):
    cases = [
        _job(mallory, data="/tmp/a\x00b.yaml"),
        _job(mallory, data="d\x00x"),
        _job(mallory, data="/" + "a" * 100_000 + ".yaml"),
        _job(mallory, model="job:j0123456789abcdef01234567/weights/\x00best.pt"),
        mallory.post("/v1/datasets/register", json={"name": "x", "path": "/tmp/a\x00.yaml"}),
        mallory.post("/v1/datasets/register", json={"name": "x", "path": "/" + "a" * 100_000 + ".yaml"}),
        mallory.post("/v1/datasets/register", json={"name": "a\x1b[2Jb", "path": "/tmp/x.yaml"}),
        mallory.post("/v1/datasets", params={"name": "a\nb"}, content=b"PK",
                     headers={"Content-Type": "application/zip"}),
        mallory.post("/v1/datasets", params={"name": "a\x00b"}, content=b"PK",
                     headers={"Content-Type": "application/zip"}),
        mallory.get("/v1/jobs/j0%00/artifacts/weights%00best.pt"),
        mallory.get("/v1/jobs/j%00"),
        mallory.get("/v1/datasets/d%00"),
        mallory.get("/v1/models/m%00"),
    ]
    for r in cases:
        assert 400 <= r.status_code < 500, (r.request.url, r.status_code, r.text[:300])


def test_integers_are_bounded_and_the_422_names_the_bound(mallory):
    too_big = [("after", 2**70), ("after", 2**63)]
    for key, value in too_big:
        r = mallory.get("/v1/jobs/j0123456789abcdef01234567/events", params={key: value})
        assert r.status_code == 422 and "9223372036854775807" in r.text, r.text
    job = _job(mallory, data="/tmp/x.yaml")
    assert job.status_code == 422  # (no such file; only the shape of the answers matters here)
    for key, value, bound in (("batch", 2**63, "65536"), ("seed", 2**70, "4294967295"),
                              ("epochs", 10**9, "100000"), ("freeze", 2**70, "10000"),
                              ("patience", 2**40, "100000")):
        r = _job(mallory, params={key: value})
        assert r.status_code == 422 and r.json()["field"] == f"params.{key}", r.text
        assert bound in r.json()["detail"], r.text
    assert _job(mallory, time_budget_s=1e300).status_code == 422


def test_event_stream_and_log_offsets_above_int64(mallory, sessions):
    from testkit import queued_job

    from service.db.models import User

    with sessions() as s:
        owner = s.query(User).filter_by(name=mallory.user_name).one().id
    job_id = queued_job(sessions, owner)
    for big in (str(2**64), "9" * 30):
        r = mallory.get(f"/v1/jobs/{job_id}/events/stream", headers={"Last-Event-ID": big})
        assert r.status_code == 422 and r.json()["field"] == "Last-Event-ID", r.text
    r = mallory.get(f"/v1/jobs/{job_id}/logs", params={"offset": 2**70})
    assert r.status_code == 422 and "9223372036854775807" in r.text, r.text


def _zip_with(flag_bits: int = 0, method: int | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("data.yaml", b"train: images\nnames: [a]\n")
        zf.writestr("images/a.jpg", b"x" * 100)
    data = bytearray(buf.getvalue())
    # patch the central directory entries of the second member
    cd = data.rfind(b"PK\x01\x02")
    if flag_bits:
        data[cd + 8:cd + 10] = flag_bits.to_bytes(2, "little")
    if method is not None:
        data[cd + 10:cd + 12] = method.to_bytes(2, "little")
    return bytes(data)


@pytest.mark.parametrize("flags, method, words", [(1, None, "is encrypted"),
                                                  (0, 97, "compression method 97")])
def test_zip_members_encrypted_or_of_an_unknown_method(mallory, server, flags, method, words):
    uploads = server.app.state.settings.upload_root
    before = set(uploads.iterdir())
    r = mallory.post("/v1/datasets", params={"name": "z"}, content=_zip_with(flags, method),
                     headers={"Content-Type": "application/zip"})
    assert r.status_code == 422 and words in r.json()["detail"], r.text
    assert set(uploads.iterdir()) == before


def test_the_serve_protocol_stops_a_huge_head_while_parsing(api_settings, monkeypatch):
    """``serve``'s HTTP protocol (service.nodelay) refuses 2,000 headers or 16 MiB of them
    as it parses them (431), before the application sees the request."""
    from testkit import ServerThread

    from service.app import create_app
    from service.nodelay import NoDelayHttpToolsProtocol

    monkeypatch.setattr(NoDelayHttpToolsProtocol, "limits", (100, 64 << 10, 16 << 10))
    srv = ServerThread(create_app(api_settings), http=NoDelayHttpToolsProtocol).start()
    try:
        many = b"".join(b"X-H%d: v\r\n" % i for i in range(2000))
        answer = _raw(srv.url, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
        assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
        big = b"X-Big: " + b"v" * (16 << 20) + b"\r\n"
        try:
            answer = _raw(srv.url, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + big + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            answer = b"HTTP/1.1 431 (closed while sending)"
        assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
        answer = _raw(srv.url, b"GET /" + b"a" * (20 << 10) + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 414"), answer[:200]
        assert _raw(srv.url, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                    ).startswith(b"HTTP/1.1 200")
    finally:
        srv.stop()
