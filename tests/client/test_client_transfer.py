"""Downloads are one procedure for both clients (``libreyolo_client._transfer``): through
``Client`` and ``AsyncClient`` the same requests go out and the same file comes back
(no service: an ``httpx.MockTransport`` plays it), and the procedure's rules hold when it
is stepped by hand."""

from __future__ import annotations

import asyncio
import hashlib

import httpx
import pytest

from libreyolo_client import APIError, AsyncClient, AsyncJob, ChecksumError, Client, Job
from libreyolo_client._models import JobInfo
from libreyolo_client._steps import CloseStream, GetPage, Hash, OpenFile
from libreyolo_client._transfer import download_artifact

INFO = JobInfo(id="j" + "0" * 24, kind="train", model="yolo9-t", data="d", status="succeeded")
BLOB = bytes(range(256)) * 64
SHA = hashlib.sha256(BLOB).hexdigest()
FILE = f"/v1/jobs/{INFO.id}/artifacts/weights/best.pt"


class Service:
    """Artifacts list and one file with Range; the first ``corrupt`` bodies are wrong."""

    def __init__(self, corrupt: int = 0):
        self.corrupt, self.seen = corrupt, []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append((request.url.path, request.headers.get("range")))
        if request.url.path.endswith("/artifacts"):
            return httpx.Response(200, json={"data": [
                {"path": "weights/best.pt", "kind": "checkpoint", "size_bytes": len(BLOB),
                 "sha256": SHA}]})
        start = int((request.headers.get("range") or "bytes=0-")[6:-1])
        body = BLOB[start:]
        if self.corrupt:
            self.corrupt -= 1
            body = bytes([body[0] ^ 0xFF]) + body[1:]
        headers = {"x-content-sha256": SHA}
        if start:
            headers["content-range"] = f"bytes {start}-{len(BLOB) - 1}/{len(BLOB)}"
            return httpx.Response(206, headers=headers, content=body)
        return httpx.Response(200, headers=headers, content=body)


def download(twin: str, service: Service, dest, **kw):
    """``Job.download`` through the sync or the async client; the bytes written."""
    opts = dict(retries=0, backoff_s=0.001, transport=httpx.MockTransport(service))
    if twin == "sync":
        with Client("http://t", "t", **opts) as c:
            return Job(c, INFO).download("weights/best.pt", dest, **kw).read_bytes()

    async def main():
        async with AsyncClient("http://t", "t", **opts) as c:
            out = await AsyncJob(c, INFO).download("weights/best.pt", dest, **kw)
            return out.read_bytes()

    return asyncio.run(asyncio.wait_for(main(), 30))


def progress_to(done: list[int]):
    return lambda d, t: done.append(d)


@pytest.mark.parametrize("corrupt", [0, 1])
def test_both_clients_send_the_same_requests_and_write_the_same_file(tmp_path, corrupt):
    seen = {}
    for twin in ("sync", "async"):
        (tmp_path / twin).mkdir()
        (tmp_path / twin / "best.pt.part").write_bytes(BLOB[:100])  # an earlier try's part
        service = Service(corrupt)
        progress: list[int] = []
        assert download(twin, service, tmp_path / twin, progress=progress_to(progress)) == BLOB
        assert progress[-1] == len(BLOB)
        seen[twin] = service.seen
    assert seen["sync"] == seen["async"]
    assert seen["sync"][1] == (FILE, "bytes=100-")  # the part is resumed
    if corrupt:  # a wrong sha256: the part is dropped and the file fetched once more whole
        assert seen["sync"][2:] == [(FILE, None)]


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_a_sha256_still_wrong_after_a_fresh_download_raises(twin, tmp_path):
    with pytest.raises(ChecksumError, match="after a fresh download"):
        download(twin, Service(corrupt=2), tmp_path)
    assert list(tmp_path.iterdir()) == []  # no part, no file


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_a_dest_with_the_right_bytes_is_kept(twin, tmp_path):
    (tmp_path / "best.pt").write_bytes(BLOB)
    service = Service()
    assert download(twin, service, tmp_path) == BLOB
    assert [p for p, _ in service.seen] == [f"/v1/jobs/{INFO.id}/artifacts"]


def test_the_procedure_stepped_by_hand(tmp_path):
    """A 416 for a part as long as the file means it is complete; a 206 whose
    Content-Range does not start at the part's size is an error."""
    part = tmp_path / "best.pt.part"
    part.write_bytes(BLOB)
    ops = download_artifact(INFO, "weights/best.pt", tmp_path, retries=0,
                            delay=lambda attempt: 0.0, report=None)
    assert next(ops) == GetPage(f"/v1/jobs/{INFO.id}/artifacts", {})
    op = ops.send({"data": [{"path": "weights/best.pt", "kind": "checkpoint",
                             "size_bytes": len(BLOB), "sha256": SHA}]})
    assert isinstance(op, OpenFile) and op.headers == {"Range": f"bytes={len(BLOB)}-"}
    assert ops.send(httpx.Response(416)) == CloseStream()
    assert ops.send(None) == Hash(part)
    with pytest.raises(StopIteration) as stop:
        ops.send(SHA)
    assert stop.value.value == tmp_path / "best.pt" and not part.exists()

    (tmp_path / "x.part").write_bytes(BLOB[:10])
    ops = download_artifact(INFO, "weights/best.pt", tmp_path / "x", retries=0,
                            delay=lambda attempt: 0.0, report=None)
    next(ops)
    assert ops.send({"data": []}).headers == {"Range": "bytes=10-"}
    with pytest.raises(APIError, match="unexpected Content-Range"):
        ops.send(httpx.Response(206, headers={"content-range": "bytes 0-9/100"}))
