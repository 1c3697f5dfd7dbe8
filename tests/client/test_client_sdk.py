"""The SDK against a real API server (uvicorn, SQLite) with the runner playing the worker."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from testkit import REPO

import libreyolo_client
from libreyolo_client import (
    AuthError,
    ChecksumError,
    Client,
    Conflict,
    JobCancelled,
    JobFailed,
    NotFound,
    ServiceUnavailable,
    ValidationError,
    WaitTimeout,
)

TINY = {"epochs": 2, "imgsz": 64, "batch": 4}


def _wait_status(job, statuses, timeout=30.0):
    deadline = time.monotonic() + timeout
    while job.refresh().status not in statuses:
        assert time.monotonic() < deadline, f"{job} never reached {statuses}"
        time.sleep(0.05)


# -- the package -----------------------------------------------------------------------

def test_client_imports_neither_torch_nor_the_service():
    code = ("import sys, libreyolo_client, libreyolo_client.cli, libreyolo_client.demo, "
            "libreyolo_client.datasets_cli;"
            "bad = [m for m in ('torch', 'service', 'worker', 'libreyolo_core') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_all_lists_the_public_names():
    import types

    public = {n for n in dir(libreyolo_client) if not n.startswith("_")
              and not isinstance(getattr(libreyolo_client, n), types.ModuleType)}  # submodules
    assert set(libreyolo_client.__all__) == public
    assert libreyolo_client.__all__ == sorted(libreyolo_client.__all__)


def test_job_status_is_an_enum_that_equals_its_string():
    import json

    from libreyolo_client import JobInfo, JobStatus

    info = JobInfo(id="j1", kind="train", model="yolo9-t", data="d", status="cancelled")
    assert info.status is JobStatus.CANCELLED and info.status == "cancelled" and info.done
    assert f"{info.status}" == "cancelled" and json.dumps(info.status) == '"cancelled"'
    assert info.model_dump(mode="json")["status"] == "cancelled"
    assert {s.value for s in JobStatus if s.done} == {"succeeded", "failed", "cancelled"}
    newer = JobInfo(id="j1", kind="train", model="m", data="d", status="paused")
    assert newer.status == "paused" and not newer.done  # a status this SDK does not know


def test_url_and_token_from_env_and_credentials_file(tmp_path, monkeypatch):
    creds = tmp_path / "credentials"
    creds.write_text(json.dumps({"url": "http://127.0.0.1:9/", "token": "lyt_file"}))
    for k in ("LIBREYOLO_URL", "LIBREYOLO_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("LIBREYOLO_CREDENTIALS_PATH", str(creds))
    with Client() as c:
        assert (c.url, c.token) == ("http://127.0.0.1:9", "lyt_file")
    with Client("http://elsewhere:8000") as c:  # the saved token never goes to another host
        assert c.token is None
    monkeypatch.setenv("LIBREYOLO_URL", "http://envhost:1")
    monkeypatch.setenv("LIBREYOLO_TOKEN", "lyt_env")
    with Client() as c:
        assert (c.url, c.token) == ("http://envhost:1", "lyt_env")
    with Client("http://x:2", "lyt_arg") as c:
        assert (c.url, c.token) == ("http://x:2", "lyt_arg")
    with pytest.raises(TypeError):
        Client("http://x:2", "t", timeout=(1, 2))


# -- submit, read, list, cancel, errors ------------------------------------------------

def test_submit_get_list_cancel(client, data_yaml):
    job = client.train(model="yolo9-t", data=data_yaml, gpus=0, **TINY)
    assert job.status == "queued" and job.info.params == TINY and job.info.kind == "train"
    assert client.job(job.id).info.data == data_yaml
    prof = client.profile(model="yolo9-t", data=data_yaml, gpus=0, imgsz=64, batch=4)
    assert prof.info.kind == "profile"
    listed = [j.id for j in client.jobs()]
    assert listed[:2] == [prof.id, job.id]
    assert [j.id for j in client.jobs(kind="profile")] == [prof.id]
    assert job.cancel().status == "cancelled"
    assert job.cancel().status == "cancelled"  # again: still fine
    assert [j.id for j in client.jobs(status="cancelled")] == [job.id]
    assert [j.id for j in client.jobs(status=["queued", "cancelled"], limit=1)] == [prof.id]
    assert job.page_url == f"{client.url}/jobs/{job.id}"
    prof.cancel()


def test_relative_local_path_is_sent_absolute(client, data_yaml, monkeypatch):
    monkeypatch.chdir(Path(data_yaml).parent.parent)
    job = client.train(data=os.path.join("ds", "data.yaml"), gpus=0, **TINY)
    assert job.info.data == data_yaml
    job.cancel()


@pytest.mark.parametrize("kw, field", [
    ({"imgsz": 100}, "params.imgsz"),
    ({"epokhs": 3}, "params.epokhs"),
    ({"model": "yolo9-q"}, "model"),
    ({"data": "/nope/data.yaml"}, "data"),
    ({"gpus": 3}, "gpus"),
])
def test_validation_error_names_the_field(client, data_yaml, kw, field):
    args = {"model": "yolo9-t", "data": data_yaml, "gpus": 0, **TINY, **kw}
    before = len(client.jobs(limit=None))
    with pytest.raises(ValidationError) as err:
        client.train(**args)
    assert err.value.field == field and err.value.status_code == 422
    assert field in str(err.value)
    assert len(client.jobs(limit=None)) == before


def test_a_non_finite_number_is_a_validation_error_before_sending(client, data_yaml):
    """httpx cannot put NaN or infinity into JSON: the SDK says so as its own error (not a
    bare ValueError), and nothing reaches the service."""
    before = len(client.jobs(limit=None))
    with pytest.raises(ValidationError, match="NaN and infinity") as err:
        client.train(model="yolo9-t", data=data_yaml, gpus=0, **{**TINY, "lr0": float("nan")})
    assert err.value.status_code == 0
    assert err.value.field == "params.lr0" and "params.lr0" in str(err.value)
    assert len(client.jobs(limit=None)) == before


def test_bad_or_missing_token_is_auth_error(stack):
    for token in ("lyt_not_a_token", None):
        with Client(stack.url, token, credentials_path="/nonexistent") as c:
            with pytest.raises(AuthError) as err:
                c.jobs()
            assert err.value.status_code == 401


def test_not_found(client, stack, data_yaml):
    with pytest.raises(NotFound):
        client.job("j" + "0" * 24)
    job = client.train(data=data_yaml, gpus=0, **TINY)
    # another user's job looks the same
    with Client(stack.url, stack.token()) as other, pytest.raises(NotFound):
        other.job(job.id)
    with pytest.raises(NotFound):
        job.download("weights/nope.pt", "/tmp")
    job.cancel()


def test_cancel_finished_job_is_conflict(client, stack, data_yaml):
    job = client.train(data=data_yaml, gpus=0, epochs=1, imgsz=64, batch=4)
    stack.run_in_background(job.id, FAKE_EPOCH_S="0.05").join(30)
    with pytest.raises(Conflict):
        job.cancel()


# -- retries and idempotency -----------------------------------------------------------

class Flaky(httpx.HTTPTransport):
    """Real HTTP, but the first matching request's answer is lost (after the server acted
    on it) or replaced by a 503."""

    def __init__(self, match, mode: str, times: int = 1):
        super().__init__()
        self.match, self.mode, self.left = match, mode, times
        self.seen: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        if self.left and self.match(request):
            self.left -= 1
            if self.mode == "503":
                return httpx.Response(503, json={"detail": "busy", "status": 503})
            r = super().handle_request(request)
            r.read()
            r.close()
            raise httpx.ReadError("connection reset", request=request)
        return super().handle_request(request)


def test_retried_submit_makes_one_job(stack, token, data_yaml):
    flaky = Flaky(lambda r: r.method == "POST" and r.url.path == "/v1/jobs", "lost")
    with Client(stack.url, token, transport=flaky, backoff_s=0.01) as c:
        before = len(c.jobs(limit=None))
        job = c.train(data=data_yaml, gpus=0, **TINY)
        posts = [r for r in flaky.seen if r.method == "POST"]
        assert len(posts) == 2  # the answer to the first was lost; the retry got the job
        assert posts[0].headers["idempotency-key"] == posts[1].headers["idempotency-key"]
        assert len(c.jobs(limit=None)) == before + 1
        assert c.jobs(limit=1)[0].id == job.id
        job.cancel()


def test_reads_retry_on_503_and_give_up_as_service_unavailable(stack, token):
    flaky = Flaky(lambda r: r.method == "GET", "503", times=2)
    with Client(stack.url, token, transport=flaky, backoff_s=0.01) as c:
        c.jobs()
        assert len(flaky.seen) == 3
    with Client("http://127.0.0.1:9", token, retries=2, backoff_s=0.01) as c:
        with pytest.raises(ServiceUnavailable) as err:
            c.jobs()
        assert err.value.status_code == 0 and "no answer" in str(err.value)


# -- following -------------------------------------------------------------------------

def test_wait_follows_events_across_an_api_restart(stack, token, data_yaml):
    """The SSE connection is cut by an API restart mid-run; the SDK reconnects with
    Last-Event-ID and delivers every event once, in order, to the terminal status."""
    requests: list[httpx.Request] = []
    with Client(stack.url, token, backoff_s=0.2) as c:
        c._http.event_hooks["request"].append(requests.append)
        job = c.train(data=data_yaml, gpus=0, epochs=3, imgsz=64, batch=4)
        stack.run_in_background(job.id, FAKE_EPOCH_S="1.0")
        seen, restarted = [], False
        for ev in job.events(timeout=60):
            seen.append(ev)
            if not restarted and ev.name == "progress":
                restarted = True
                stack.restart()
        assert restarted
        assert [e.seq for e in seen] == list(range(1, len(seen) + 1))
        streams = [r for r in requests if r.url.path.endswith("/events/stream")]
        assert len(streams) >= 2
        assert int(streams[-1].headers["last-event-id"]) > 0
        assert seen[-1].kind == "status" and seen[-1].data["status"] == "succeeded"
        assert [e.data["epoch"] for e in seen if e.name == "epoch_end"] == [1, 2, 3]
        info = job.wait(timeout=30)
        assert info.status == "succeeded" and job.metrics["mAP50-95"] == pytest.approx(0.15)


def test_wait_falls_back_to_polling(stack, token, data_yaml):
    flaky = Flaky(lambda r: r.url.path.endswith("/events/stream"), "503", times=100)
    with Client(stack.url, token, transport=flaky, backoff_s=0.01, retries=0) as c:
        job = c.train(data=data_yaml, gpus=0, epochs=2, imgsz=64, batch=4)
        stack.run_in_background(job.id, FAKE_EPOCH_S="0.2")
        got = []
        info = job.wait(timeout=60, on_event=got.append)
        assert info.status == "succeeded"
        assert [e.seq for e in got] == list(range(1, len(got) + 1))
        assert any(r.url.path.endswith("/events") for r in flaky.seen)


def test_failed_job_raises_job_failed_with_the_log_tail(client, stack, data_yaml):
    job = client.train(data=data_yaml, gpus=0, **TINY)
    stack.run_in_background(job.id, FAKE_EXIT="3")
    with pytest.raises(JobFailed) as err:
        job.wait(timeout=60)
    e = err.value
    assert e.reason == "data error" and e.exit_code == 3 and e.job_id == job.id
    assert any("something broke in the data" in ln for ln in e.log_tail)
    assert "something broke in the data" in str(e)
    assert job.info.status == "failed" and job.metrics == {}
    assert job.wait(raise_on_failure=False).status == "failed"


def test_wait_timeout_then_cancel_running_job(client, stack, data_yaml):
    job = client.train(data=data_yaml, gpus=0, epochs=50, imgsz=64, batch=4)
    stack.run_in_background(job.id, FAKE_EPOCH_S="0.5")
    with pytest.raises(WaitTimeout):
        job.wait(timeout=1.0)
    _wait_status(job, {"running"})
    assert job.cancel().status in ("cancelling", "cancelled")
    with pytest.raises(JobCancelled):
        job.wait(timeout=60)


def test_logs_and_follow(client, stack, data_yaml):
    job = client.train(data=data_yaml, gpus=0, **TINY)
    stack.run_in_background(job.id, FAKE_EPOCH_S="0.4")
    followed = list(job.logs(follow=True, poll_s=0.1))
    assert followed[0].startswith("fake engine pid=") and followed[-1] == "done"
    assert "epoch 2 step 4/4" in followed
    assert list(job.logs()) == followed
    assert list(job.logs(tail=1)) == ["done"]


def test_follow_a_log_that_names_service_folders(client, stack, data_yaml):
    """The logs answer names the service's folders by their public names (``job:<id>/...``),
    so its text is shorter than the file's bytes: following resumes at ``X-Log-Size``, not at
    the text's length, and delivers each line once (it repeated tails of lines: found by the
    fresh-user trial)."""
    job = client.train(data=data_yaml, gpus=0, **TINY)
    stack.run_in_background(job.id, FAKE_EPOCH_S="0.4", FAKE_SAY_RUN="1")
    followed = list(job.logs(follow=True, poll_s=0.05))
    assert followed == list(job.logs()), followed
    assert sum(ln.startswith(f"checkpoint job:{job.id}/") for ln in followed) == 8, followed
    assert followed[-1] == "done"


# -- artifacts -------------------------------------------------------------------------

@pytest.fixture
def finished_job(client, stack, data_yaml):
    """A succeeded job with a 3 MB weights/best.pt recorded with its sha256."""
    from service.db.models import Artifact

    job = client.train(data=data_yaml, gpus=0, epochs=1, imgsz=64, batch=4)
    stack.run_in_background(job.id, FAKE_EPOCH_S="0.05").join(30)
    assert job.wait(timeout=30).status == "succeeded"
    blob = os.urandom(3 << 20)
    run = stack.settings.artifact_root / job.id / "run"
    (run / "weights" / "best.pt").write_bytes(blob)
    with stack.sessions() as s:
        s.add(Artifact(job_id=job.id, path="weights/best.pt", kind="checkpoint",
                       size_bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest()))
        s.commit()
    return job, blob


def test_artifacts_and_download(finished_job, tmp_path):
    job, blob = finished_job
    arts = {a.path: a for a in job.artifacts()}
    assert {"weights/best.pt", "weights/last.pt", "timeline.html"} <= set(arts)
    assert arts["weights/best.pt"].sha256 == hashlib.sha256(blob).hexdigest()
    out = job.download("weights/best.pt", tmp_path)
    assert out == tmp_path / "best.pt" and out.read_bytes() == blob
    assert not (tmp_path / "best.pt.part").exists()
    html = job.download("timeline.html", tmp_path / "t" / "timeline.html")
    assert html.read_text().startswith("<html>")


def test_download_resumes_a_partial_file_with_range(finished_job, tmp_path):
    job, blob = finished_job
    ranges: list[str | None] = []
    job._client._http.event_hooks["request"].append(
        lambda r: ranges.append(r.headers.get("range")) if "artifacts/" in r.url.path else None)
    (tmp_path / "best.pt.part").write_bytes(blob[: len(blob) // 2])
    progress: list[int] = []
    out = job.download("weights/best.pt", tmp_path, progress=lambda d, t: progress.append(d))
    assert out.read_bytes() == blob
    assert ranges == [f"bytes={len(blob) // 2}-"]
    assert progress[0] > len(blob) // 2 and progress[-1] == len(blob)


def test_download_with_a_corrupt_partial_file_starts_over(finished_job, tmp_path):
    job, blob = finished_job
    (tmp_path / "best.pt.part").write_bytes(b"\0" * 1000)
    assert job.download("weights/best.pt", tmp_path).read_bytes() == blob


def test_download_cut_halfway_resumes_and_matches_sha256(stack, token, finished_job, tmp_path):
    job, blob = finished_job

    class CutOnce(httpx.HTTPTransport):
        def __init__(self):
            super().__init__()
            self.cut, self.ranges = False, []

        def handle_request(self, request):
            r = super().handle_request(request)
            if "artifacts/weights" not in request.url.path:
                return r
            self.ranges.append(request.headers.get("range"))
            if self.cut:
                return r
            self.cut = True
            inner = r.stream

            class Half(httpx.SyncByteStream):
                def __iter__(self):
                    sent = 0
                    for chunk in inner:
                        yield chunk
                        sent += len(chunk)
                        if sent >= len(blob) // 2:
                            raise httpx.ReadError("connection lost", request=request)

                def close(self):
                    inner.close()

            return httpx.Response(r.status_code, headers=r.headers, stream=Half(),
                                  request=request)

    cut = CutOnce()
    with Client(stack.url, token, transport=cut, backoff_s=0.01) as c:
        out = c.job(job.id).download("weights/best.pt", tmp_path)
    assert out.read_bytes() == blob
    assert cut.ranges[0] is None and cut.ranges[1].startswith("bytes=")
    assert 0 < int(cut.ranges[1][6:-1]) < len(blob)


class _CorruptingTransport(httpx.HTTPTransport):
    """A real connection that flips the first byte of every artifact body: corruption in
    transit, which only the client's own sha256 check can see (a file changed on the
    server is re-hashed there, so its headers always describe the bytes sent)."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if "/artifacts/" not in request.url.path or response.status_code not in (200, 206):
            return response
        body = bytearray(response.read())
        body[0] ^= 0xFF
        return httpx.Response(response.status_code, headers=response.headers,
                              content=bytes(body), request=request)


def test_download_checksum_mismatch_raises(finished_job, stack, token, tmp_path):
    from libreyolo_client import Client

    job, _ = finished_job
    with Client(stack.url, token, backoff_s=0.1, transport=_CorruptingTransport()) as c, \
            pytest.raises(ChecksumError):
        c.job(job.id).download("weights/best.pt", tmp_path)
    assert not (tmp_path / "best.pt").exists() and not (tmp_path / "best.pt.part").exists()


# -- datasets --------------------------------------------------------------------------

def test_register_dataset_and_train_on_it(client, data_yaml):
    ds = client.register_dataset(data_yaml, name="tiny")
    assert ds.path == data_yaml and ds.id in [d.id for d in client.datasets()]
    job = client.train(data=ds.id, gpus=0, **TINY)
    assert job.info.data == data_yaml
    job.cancel()
    with pytest.raises(ValidationError) as err:
        client.register_dataset("/nope/data.yaml")
    assert err.value.field == "path"


def test_upload_dataset_folder_and_zip(client, tmp_path):
    from testkit import write_data_yaml

    folder = write_data_yaml(tmp_path / "up").parent
    seen: list[tuple[int, int]] = []
    ds = client.upload_dataset(folder, progress=lambda d, t: seen.append((d, t)))
    assert ds.name == "up" and ds.path.endswith("data.yaml") and ds.report is not None
    assert seen and seen[-1][0] == seen[-1][1]
    bad = tmp_path / "bad.zip"
    import zipfile

    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("../evil.txt", "x")
    with pytest.raises(ValidationError) as err:
        client.upload_dataset(bad)
    assert err.value.field == "body"
    # the dataset's yaml itself: named as such before anything is sent (it was uploaded
    # as if a zip and refused with "body: not a zip file")
    with pytest.raises(ValueError, match=r"data.yaml is not a zip: upload its folder"):
        client.upload_dataset(folder / "data.yaml")


# -- async twin ------------------------------------------------------------------------

def test_async_client_submit_wait_download(stack, token, data_yaml, tmp_path):
    import asyncio

    from libreyolo_client import AsyncClient

    async def main():
        async with AsyncClient(stack.url, token, backoff_s=0.05) as c:
            job = await c.train(data=data_yaml, gpus=0, **TINY)
            stack.run_in_background(job.id, FAKE_EPOCH_S="0.1")
            info = await job.wait(timeout=60)
            assert info.status == "succeeded"
            assert job.id in [j.id for j in await c.jobs()]
            out = await job.download("weights/last.pt", tmp_path)
            assert json.loads(out.read_text())["epoch"] == 2
            with pytest.raises(ValidationError) as err:
                await c.train(data=data_yaml, gpus=0, imgsz=100)
            assert err.value.field == "params.imgsz"

    asyncio.run(main())


def test_concurrent_followers_each_get_every_event(stack, token, data_yaml):
    with Client(stack.url, token) as c:
        job = c.train(data=data_yaml, gpus=0, **TINY)
        out: dict[int, list[int]] = {}

        def follow(i):
            with Client(stack.url, token) as ci:
                out[i] = [e.seq for e in ci.job(job.id).events(timeout=60)]

        threads = [threading.Thread(target=follow, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        stack.run_in_background(job.id, FAKE_EPOCH_S="0.1")
        for t in threads:
            t.join(60)
        assert out[0] == out[1] == list(range(1, len(out[0]) + 1))


def test_credentials_keep_one_token_per_url(tmp_path, monkeypatch):
    from service.credentials import save_credentials

    creds = tmp_path / "credentials"
    creds.write_text(json.dumps({"url": "http://127.0.0.1:8000", "token": "lyt_old"}))  # old form
    assert save_credentials(creds, "http://127.0.0.1:8001/", "lyt_second") == \
        "http://127.0.0.1:8000"  # another service: the default stays
    assert save_credentials(creds, "http://127.0.0.1:8000", "lyt_first") is None
    assert creds.stat().st_mode & 0o777 == 0o600
    for k in ("LIBREYOLO_URL", "LIBREYOLO_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("LIBREYOLO_CREDENTIALS_PATH", str(creds))
    with Client() as c:
        assert (c.url, c.token) == ("http://127.0.0.1:8000", "lyt_first")
    with Client("http://127.0.0.1:8001") as c:
        assert c.token == "lyt_second"
    with Client("http://127.0.0.1:8002") as c:
        assert c.token is None


def test_multi_node_job_nodes_world_size_and_node_workers(client, stack, data_yaml):
    """``nodes`` goes with the submit; the job says its world size and, as its workers claim
    their node slots (the real gang code), each node's worker; the event printer names the
    gang's progress and the nodes of the start."""
    import io

    from testkit import take_node

    from libreyolo_client import NodeWorker
    from libreyolo_client._progress import EventPrinter

    job = client.train(data=data_yaml, gpus=0, nodes=2, **TINY)
    assert (job.info.nodes, job.info.world_size, job.info.node_workers) == (2, 2, [])
    take_node(stack.sessions, job.id, "w-a", "10.0.0.1")
    assert job.refresh().node_workers == [NodeWorker(node_rank=0, worker="w-a", host="host-w-a",
                                                     addr="10.0.0.1")]
    assert take_node(stack.sessions, job.id, "w-b", "10.0.0.2").started
    info = job.refresh()
    assert info.status == "running" and info.world_size == 2
    assert [(n.node_rank, n.worker, n.addr, n.exit_code) for n in info.node_workers or []] == [
        (0, "w-a", "10.0.0.1", None), (1, "w-b", "10.0.0.2", None)]
    out = io.StringIO()
    printer = EventPrinter(job.id, stream=out)
    for ev in job.events(follow=False):
        printer(ev)
    lines = out.getvalue().splitlines()
    assert f"[{job.id}] nodes: node 0 of 2 claimed by w-a; 1 of 2 nodes gathered" in lines
    assert f"[{job.id}] status: running  attempt=1  worker=w-a  world_size=2  " \
        "nodes=0:w-a@10.0.0.1,1:w-b@10.0.0.2  rendezvous=10.0.0.1:29500" in lines
    job.cancel()

    one = client.train(data=data_yaml, gpus=0, **TINY)
    assert (one.info.nodes, one.info.world_size, one.info.node_workers) == (1, 1, None)
    one.cancel()


@pytest.mark.parametrize("kind, nodes", [("train", 0), ("train", 17), ("profile", 2)])
def test_a_bad_node_count_is_a_validation_error_of_nodes(client, data_yaml, kind, nodes):
    before = len(client.jobs(limit=None))
    with pytest.raises(ValidationError) as err:
        client.submit(kind, "yolo9-t", data_yaml, gpus=0, nodes=nodes, params=dict(TINY))
    assert err.value.field == "nodes", err.value
    assert len(client.jobs(limit=None)) == before


def test_async_client_sends_nodes(stack, token, data_yaml):
    import asyncio

    from libreyolo_client import AsyncClient

    async def main():
        async with AsyncClient(stack.url, token, backoff_s=0.05) as c:
            params = {**TINY, "batch": 6}  # the global batch: divisible by 3 nodes x 2 ranks
            job = await c.train(data=data_yaml, gpus=0, nodes=3, procs=2, **params)
            assert (job.info.nodes, job.info.procs, job.info.world_size) == (3, 2, 6)
            assert job.info.params == params  # nodes and procs are options, not training keys
            await job.cancel()
            with pytest.raises(ValidationError) as err:
                await c.profile(data=data_yaml, gpus=0, nodes=2, imgsz=64, batch=4)
            assert err.value.field == "nodes"

    asyncio.run(main())
