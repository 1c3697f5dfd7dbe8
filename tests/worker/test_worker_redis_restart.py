"""A real Redis restart (a private ``redis-server`` without persistence) while a job waits.

Two cases: the message sits in Redis when Redis restarts empty (no worker yet), and Redis
is down when the job is submitted while a worker is connected (the worker reconnects).
Either way the reaper re-sends the message of the queued job and it runs exactly once.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from test_worker_celery import start_worker, stop_worker, submit
from testkit import ServerThread, client, free_port, make_user, wait_for, write_data_yaml

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None,
                                reason="redis-server is not installed")


class PrivateRedis:
    """A ``redis-server`` on a free port with no persistence: a restart loses every key."""

    def __init__(self, folder: Path):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.folder = folder
        self.proc: subprocess.Popen | None = None

    def start(self) -> PrivateRedis:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.folder)],
            stdout=open(self.folder / "redis.log", "ab"),  # noqa: SIM115 - redis writes it while it runs
            stderr=subprocess.STDOUT)
        wait_for(self.ping, timeout=10, interval=0.05, what="redis-server to start")
        return self

    def ping(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_timeout=1).ping())
        except redis.RedisError:
            return False

    def keys(self) -> list[bytes]:
        import redis

        return list(redis.Redis(port=self.port, socket_timeout=1).scan_iter("*"))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # as abrupt as a crash; nothing is saved
            self.proc.wait(10)
        self.proc = None


@pytest.fixture
def redis_server(tmp_path):
    srv = PrivateRedis(tmp_path / "redis").start()
    yield srv
    srv.stop()


@pytest.fixture
def redis_stack(make_settings, sqlite_url, redis_server):
    """API (fast reaper, re-send after 2 s) with the private Redis as the broker."""
    from service.app import create_app

    settings = make_settings(sqlite_url, broker_url=redis_server.url, reaper_enabled=True,
                             reaper_interval_s=0.5, resend_after_s=2)
    app = create_app(settings)
    srv = ServerThread(app).start()
    srv.settings, srv.sessions = settings, app.state.sessions
    yield srv
    srv.stop()


def _final(c, job_id: str, timeout: float = 90) -> dict:
    return wait_for(lambda: (j := c.get(f"/v1/jobs/{job_id}").json())["status"] in
                    ("succeeded", "failed", "cancelled") and j, timeout=timeout,
                    what="the job to finish")


def _statuses(c, job_id: str) -> list[str]:
    evs = c.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
    return [e["data"]["status"] for e in evs if e["data"].get("event") == "status"]


def test_redis_restarted_with_the_message_queued_job_still_runs(redis_stack, redis_server,
                                                                 tmp_path):
    _, token = make_user(redis_stack.sessions)
    with client(redis_stack.url, token) as c:
        job_id = submit(c, str(write_data_yaml(tmp_path / "ds")), epochs=2)
        wait_for(redis_server.keys, timeout=10, what="the message in Redis")
        redis_server.stop()
        redis_server.start()
        w = start_worker(redis_stack.settings, tmp_path / "w.log")
        try:
            job = _final(c, job_id)
        finally:
            stop_worker(w)
        assert job["status"] == "succeeded", job
        assert job["attempt"] == 1
        assert _statuses(c, job_id) == ["queued", "running", "succeeded"]


def test_redis_down_at_submit_worker_reconnects_and_job_runs(redis_stack, redis_server,
                                                             tmp_path):
    _, token = make_user(redis_stack.sessions)
    w = start_worker(redis_stack.settings, tmp_path / "w.log")
    try:
        with client(redis_stack.url, token) as c:
            data = str(write_data_yaml(tmp_path / "ds"))
            warm = submit(c, data, epochs=1)  # the worker is connected and consuming
            assert _final(c, warm)["status"] == "succeeded"
            redis_server.stop()
            t0 = time.monotonic()
            job_id = submit(c, data, epochs=2)  # the send fails; the row is queued
            submit_s = time.monotonic() - t0
            time.sleep(1.0)
            redis_server.start()
            job = _final(c, job_id)
            assert job["status"] == "succeeded", job
            assert job["attempt"] == 1
            assert _statuses(c, job_id) == ["queued", "running", "succeeded"]
    finally:
        stop_worker(w)
    assert submit_s < 30, f"a submit with the broker down took {submit_s:.1f} s"


def test_redis_restarted_empty_queued_job_is_resent_within_seconds(make_settings, sqlite_url,
                                                                   redis_server, tmp_path):
    """With the default resend_after_s (600 s): the reaper sees the broker's new epoch
    (Redis's run_id) and re-sends the queued job's lost message at its next pass."""
    from service.app import create_app
    from service.settings import Settings

    assert Settings(home=tmp_path / "x").resend_after_s == 600  # not what brings it back
    settings = make_settings(sqlite_url, broker_url=redis_server.url, reaper_enabled=True,
                             reaper_interval_s=1.0)
    app = create_app(settings)
    srv = ServerThread(app).start()
    try:
        _, token = make_user(app.state.sessions)
        with client(srv.url, token) as c:
            job_id = submit(c, str(write_data_yaml(tmp_path / "ds")), epochs=1)
            wait_for(redis_server.keys, timeout=10, what="the message in Redis")
            time.sleep(2.5)  # the reaper has seen this Redis's epoch
            redis_server.stop()
            redis_server.start()
            t0 = time.monotonic()
            import redis

            queue = redis.Redis(port=redis_server.port, socket_timeout=1)
            assert queue.llen("cpu") == 0  # restarted empty: the message is lost
            wait_for(lambda: queue.llen("cpu") > 0, timeout=30, interval=0.1,
                     what="the message to be sent again")
            resent_s = time.monotonic() - t0
            w = start_worker(settings, tmp_path / "w.log")
            try:
                job = _final(c, job_id)
            finally:
                stop_worker(w)
            assert job["status"] == "succeeded" and job["attempt"] == 1, job
            assert _statuses(c, job_id) == ["queued", "running", "succeeded"]
    finally:
        srv.stop()
    print(f"redis restarted empty: the queued job's message was sent again {resent_s:.1f} s "
          f"after the restart (reaper every {settings.reaper_interval_s:g} s; "
          f"resend_after_s {settings.resend_after_s:g} s)")
