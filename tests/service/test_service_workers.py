"""Worker heartbeats: a job no live worker serves is flagged at submit, in ``GET`` /
``jobs show`` / ``jobs list`` / the page, refused under ``refuse_unserved``; the queue
depth metric counts queued jobs (a cancel takes effect at once)."""

from __future__ import annotations

import re

import pytest
from testkit import ServerThread, client, make_user
from typer.testing import CliRunner


@pytest.fixture
def cpu_worker(server):
    """A live CPU worker's row, written by the worker's real heartbeat (no thread)."""
    from worker.heartbeat import Heartbeat, queues_for

    beat = Heartbeat(server.app.state.sessions, "test-cpu-worker@host", queues_for([]), 0, 10.0)
    beat.beat()
    yield beat
    beat.stop()


def _depth(text: str, queue: str) -> float:
    m = re.search(rf'^libreyolo_queue_depth{{queue="{queue}"}} (\S+)$', text, re.M)
    assert m, text
    return float(m.group(1))


def test_gpu_job_with_only_a_cpu_worker_is_flagged(server, sessions, data_yaml, cpu_worker):
    _, token = make_user(sessions)
    body = {"model": "yolo9-t", "data": data_yaml, "params": {"epochs": 1, "imgsz": 64}}
    with client(server.url, token) as c:
        depth0 = _depth(c.get("/metrics").text, "gpu-1")
        r = c.post("/v1/jobs", json=body | {"gpus": 1})
        assert r.status_code == 201, r.text
        job = r.json()
        assert len(job["warnings"]) == 1 and "'gpu-1'" in job["warnings"][0], job
        assert "online workers serve cpu" in job["warnings"][0]
        assert "gpus=0" in job["warnings"][0]  # the way out on this service
        want = "waiting for a gpu-1 worker (none online)"
        assert c.get(f"/v1/jobs/{job['id']}").json()["waiting"] == want
        listed = c.get("/v1/jobs", params={"status": "queued"}).json()["data"]
        assert next(j for j in listed if j["id"] == job["id"])["waiting"] == want
        metrics = c.get("/metrics").text
        assert _depth(metrics, "gpu-1") == depth0 + 1
        assert 'libreyolo_workers{queue="cpu"} 1.0' in metrics
        assert 'libreyolo_workers{queue="gpu-1"} 0.0' in metrics
        page = c.get(f"/jobs/{job['id']}").text
        assert want in page

        env = {"LIBREYOLO_URL": server.url, "LIBREYOLO_TOKEN": token, "LIBREYOLO_NO_BROWSER": "1"}
        from service.cli import app as cli_app

        runner = CliRunner()
        shown = runner.invoke(cli_app, ["jobs", "show", job["id"]], env=env)
        assert shown.exit_code == 0, shown.output
        assert f"status:   queued (attempt 0/3): {want}" in shown.stdout
        listed = runner.invoke(cli_app, ["jobs", "list", "--status", "queued"], env=env)
        assert want in next(ln for ln in listed.stdout.splitlines() if job["id"] in ln)
        sub = runner.invoke(cli_app, ["jobs", "submit", "--data", data_yaml, "--gpus", "1",
                                      "epochs=1"], env=env)
        assert sub.exit_code == 0, sub.output
        assert "warning: no live worker serves queue 'gpu-1'" in sub.stderr

        # a CPU job on this service: served, no warning, nothing waiting
        r = c.post("/v1/jobs", json=body | {"gpus": 0})
        assert r.status_code == 201 and r.json()["warnings"] == [] and r.json()["waiting"] is None

        # cancelling the queued jobs takes them out of the queue depth at once
        for j in c.get("/v1/jobs", params={"status": "queued"}).json()["data"]:
            assert c.post(f"/v1/jobs/{j['id']}/cancel").status_code == 202
        assert _depth(c.get("/metrics").text, "gpu-1") == 0


def test_sdk_warns_and_refuse_unserved_is_a_409(server, sessions, api_settings, data_yaml, cpu_worker):
    from libreyolo_client import Client, SubmitWarning
    from service.app import create_app

    _, token = make_user(sessions)
    with Client(server.url, token=token) as c:
        with pytest.warns(SubmitWarning, match="gpu-2"):
            job = c.train("yolo9-t", data_yaml, gpus=2, epochs=1, imgsz=64, batch=2)
        assert job.info.waiting == "waiting for a gpu-2 worker (none online)"
        job.cancel()

    strict = create_app(api_settings.model_copy(update={"refuse_unserved": True}))
    srv = ServerThread(strict).start()
    try:
        with client(srv.url, token) as c:
            r = c.post("/v1/jobs", json={"model": "yolo9-t", "data": data_yaml, "gpus": 1,
                                         "params": {"epochs": 1}})
            assert r.status_code == 409, r.text
            assert "no live worker serves queue 'gpu-1'" in r.json()["detail"]
            assert r.json()["field"] == "gpus"
            assert c.get("/v1/jobs", params={"status": "queued"}).json()["data"] == []
            r = c.post("/v1/jobs", json={"model": "yolo9-t", "data": data_yaml, "gpus": 0,
                                         "params": {"epochs": 1}})
            assert r.status_code == 201, r.text
            c.post(f"/v1/jobs/{r.json()['id']}/cancel")
    finally:
        srv.stop()


def test_stale_and_stopped_workers_are_offline(server, sessions):
    from datetime import timedelta

    from sqlalchemy import update

    from service.db.models import WorkerRow, utcnow
    from service.workers import live_queues
    from worker.heartbeat import Heartbeat

    beat = Heartbeat(sessions, "test-gpu-worker@host", ["gpu-1", "gpu-2"], 2, 10.0)
    beat.beat()
    with sessions() as s:
        assert live_queues(s, 35)["gpu-2"] >= 1
        s.execute(update(WorkerRow).where(WorkerRow.name == beat.name)
                  .values(last_seen_at=utcnow() - timedelta(seconds=60)))
        s.commit()
        assert "gpu-2" not in live_queues(s, 35)  # its heartbeat is too old
    beat.beat()
    beat.stop()  # a clean shutdown deletes the row
    with sessions() as s:
        assert s.get(WorkerRow, beat.name) is None
