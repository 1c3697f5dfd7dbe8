"""The async twin's members against a real service (the API on SQLite and on PostgreSQL,
the worker played by ``worker.runner.run_job`` with the fake engine): each answers what
the sync member answers."""

from __future__ import annotations

import asyncio
import hashlib
import uuid

import pytest
from testkit import free_port, write_data_yaml, write_weights

from libreyolo_client import (
    AsyncClient,
    Client,
    Conflict,
    JobStatus,
    NotFound,
    ServiceUnavailable,
    ValidationError,
)

TINY = {"epochs": 2, "imgsz": 64, "batch": 4}


@pytest.fixture(params=["sqlite", "postgresql"])
def service(request):
    """The stack on SQLite (the session's) or on PostgreSQL (this module's)."""
    return request.getfixturevalue("stack" if request.param == "sqlite" else "pg_stack")


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def test_async_health_and_wait_ready(service):
    async def main():
        async with AsyncClient(service.url, service.token()) as c:
            assert await c.health() is True
            assert await c.wait_ready(timeout=5) is None
        async with AsyncClient(f"http://127.0.0.1:{free_port()}", "t") as dead:
            assert await dead.health() is False
            with pytest.raises(ServiceUnavailable, match="did not answer /healthz"):
                await dead.wait_ready(timeout=0.3)

    run(main())


def test_async_datasets_register_upload_list_delete(service, tmp_path):
    data_yaml = str(write_data_yaml(tmp_path / "reg"))
    folder = write_data_yaml(tmp_path / "up").parent

    async def main():
        async with AsyncClient(service.url, service.token(), backoff_s=0.05) as c:
            reg = await c.register_dataset(data_yaml, name="tiny")
            assert reg.path == data_yaml and reg.name == "tiny"
            with pytest.raises(ValidationError) as err:
                await c.register_dataset("/nope/data.yaml")
            assert err.value.field == "path"
            seen: list[tuple[int, int | None]] = []
            up = await c.upload_dataset(folder, progress=lambda d, t: seen.append((d, t)))
            assert up.name == "up" and up.path.endswith("data.yaml") and up.report is not None
            assert seen and seen[-1][0] == seen[-1][1]
            assert {reg.id, up.id} <= {d.id for d in await c.datasets()}
            await c.delete_dataset(up.id)
            assert up.id not in {d.id for d in await c.datasets()}
            with pytest.raises(NotFound):
                await c.delete_dataset(up.id)
            (tmp_path / "empty").mkdir()
            with pytest.raises(FileNotFoundError, match="no dataset yaml"):
                await c.upload_dataset(tmp_path / "empty")  # refused before sending
            return reg

    reg = run(main())
    with Client(service.url, service.token()) as sync:  # another user does not see it
        assert reg.id not in {d.id for d in sync.datasets()}


def test_async_job_keywords_logs_result_download(service, tmp_path):
    """train/profile/tune take the sync client's keywords; a finished job's logs, result,
    metrics, report, artifacts and download (with progress, resuming a part) are the sync
    job's."""
    data_yaml = str(write_data_yaml(tmp_path / "ds"))
    token = service.token()
    key = uuid.uuid4().hex

    async def main():
        async with AsyncClient(service.url, token, backoff_s=0.05) as c:
            job = await c.train(data=data_yaml, gpus=0, priority=3, time_budget_s=600,
                                idempotency_key=key, **TINY)
            assert (job.info.priority, job.info.time_budget_s, job.info.params) == \
                (3, 600, TINY)
            again = await c.train(data=data_yaml, gpus=0, priority=3, time_budget_s=600,
                                  idempotency_key=key, **TINY)
            assert again.id == job.id  # the same request and key: the same job
            tune = await c.tune(data=data_yaml, gpus=0, repeat=2, budget_s=60, priority=1,
                                imgsz=64, batch=4)
            assert tune.info.tune is not None and tune.info.priority == 1
            assert (tune.info.tune["repeat"], tune.info.tune["budget_s"]) == (2, 60)
            prof = await c.profile(data=data_yaml, gpus=0, priority=2, imgsz=64, batch=4)
            assert prof.info.kind == "profile" and prof.info.priority == 2
            for other in (tune, prof):
                await other.cancel()

            service.run_in_background(job.id, FAKE_EPOCH_S="0.3")
            lines = [ln async for ln in job.logs(follow=True, poll_s=0.1)]
            assert lines[0].startswith("fake engine pid=") and lines[-1] == "done"
            assert "epoch 2 step 4/4" in lines
            assert job.info.done  # following re-read the job
            assert [ln async for ln in job.logs()] == lines
            assert [ln async for ln in job.logs(tail=1)] == ["done"]

            info = await job.wait(timeout=60)
            assert info.status is JobStatus.SUCCEEDED and job.status == "succeeded"
            assert job.result is not None and job.metrics["mAP50"] > 0 and job.lever == {}
            with pytest.raises(NotFound):  # the fake engine writes no val/report.json
                await job.report()
            with pytest.raises(Conflict):  # a succeeded job is not resumed
                await c.resume(job.id)
            assert {job.id, tune.id, prof.id} <= {j.id for j in await c.jobs(limit=None)}
            assert len(await c.jobs(limit=1)) == 1

            ranges: list[str | None] = []

            async def hook(request):
                if "artifacts/weights" in request.url.path:
                    ranges.append(request.headers.get("range"))

            c._http.event_hooks["request"].append(hook)
            done: list[int] = []
            out = await job.download("weights/last.pt", tmp_path / "a",
                                     progress=lambda d, t: done.append(d))
            blob = out.read_bytes()
            assert done[-1] == len(blob) and ranges == [None]
            (tmp_path / "b").mkdir()
            (tmp_path / "b" / "last.pt.part").write_bytes(blob[:3])
            assert (await job.download("weights/last.pt", tmp_path / "b")).read_bytes() == blob
            assert ranges[-1] == "bytes=3-"
            return job.id, lines, job.metrics, await job.artifacts()

    job_id, lines, metrics, artifacts = run(main())
    with Client(service.url, token) as c:
        job = c.job(job_id)
        assert list(job.logs()) == lines and job.metrics == metrics
        assert job.artifacts() == artifacts
        with pytest.raises(Conflict):
            c.resume(job_id)


def test_async_upload_and_download_model(service, tmp_path):
    weights = write_weights(tmp_path / "shapes.pt")

    async def main():
        async with AsyncClient(service.url, service.token(), backoff_s=0.05) as c:
            sent: list[int] = []
            m = await c.upload_model(weights, name="twin", progress=lambda d, t: sent.append(d))
            assert m.model_name == "yolo9-t" and sent[-1] == weights.stat().st_size
            path = await c.download_model(m.id, f"{tmp_path}/dl/")  # a folder to be
            assert path == tmp_path / "dl" / "twin.pt"
            assert hashlib.sha256(path.read_bytes()).hexdigest() == m.sha256
            assert await m.download(tmp_path / "again.pt") == tmp_path / "again.pt"
            with pytest.raises(ValueError, match="choose pt or onnx"):
                await c.download_model(m.id, format="tflite")
            with pytest.raises(Conflict):  # not exported: the file answers 409
                await c.download_model(m.id, tmp_path, format="onnx")
            await c.delete_model(m.id)

    run(main())
