"""Real servers: the API (uvicorn), Celery workers as processes, SQLite or Redis broker."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from testkit import (
    REDIS_URL,
    REPO,
    ServerThread,
    client,
    engine_lines,
    free_port,
    make_user,
    pid_alive,
    wait_for,
    write_data_yaml,
)

from service.db.models import Job, JobEvent


def worker_env(settings, **extra) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "LIBREYOLO_HOME": str(settings.home),
           "LIBREYOLO_DATABASE_URL": settings.database_url,
           "LIBREYOLO_BROKER_URL": settings.broker_url,
           "LIBREYOLO_BROKER_TRANSPORT_OPTIONS": json.dumps(settings.broker_transport_options),
           "LIBREYOLO_ARTIFACT_ROOT": str(settings.artifact_root),
           "LIBREYOLO_ENGINE_COMMAND": json.dumps(settings.engine_command),
           "LIBREYOLO_LEASE_S": str(settings.lease_s),
           "LIBREYOLO_HEARTBEAT_S": str(settings.heartbeat_s),
           "LIBREYOLO_POLL_INTERVAL_S": str(settings.poll_interval_s)}
    return env | extra


def start_worker(settings, log: Path, **extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "worker", "--cpu", "--loglevel", "WARNING"],
                            cwd=REPO, env=worker_env(settings, **extra),
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT)


def stop_worker(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.fixture
def stack(make_settings, sqlite_url, tmp_path):
    """API server (with a fast reaper) on SQLite + the embedded SQLite broker."""
    from service.app import create_app

    settings = make_settings(sqlite_url, broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}",
                             lease_s=3, reaper_enabled=True, reaper_interval_s=0.5,
                             heartbeat_s=0.5, poll_interval_s=0.1)
    app = create_app(settings)
    srv = ServerThread(app).start()
    srv.settings, srv.sessions = settings, app.state.sessions
    yield srv
    srv.stop()


def submit(c: httpx.Client, data: str, epochs: int) -> str:
    r = c.post("/v1/jobs", json={"model": "yolo9-t", "data": data, "gpus": 0,
                                 "params": {"epochs": epochs, "imgsz": 64, "batch": 2}})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_kill9_worker_then_second_worker_resumes(stack, tmp_path):
    """kill -9 the worker mid-training: the engine dies with it, the reaper re-queues after
    the lease, a second worker resumes from last.pt; attempt 2, no event lost or doubled."""
    settings = stack.settings
    data = str(write_data_yaml(tmp_path / "ds"))
    _, token = make_user(stack.sessions)
    with client(stack.url, token) as c:
        job_id = submit(c, data, epochs=5)
        w1 = start_worker(settings, tmp_path / "w1.log", FAKE_EPOCH_S="0.8")
        try:
            def epoch2_done() -> bool:
                evs = c.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
                return any(e["data"].get("event") == "epoch_end" and e["data"]["epoch"] >= 2
                           for e in evs)

            wait_for(epoch2_done, timeout=60, what="epoch 2 to end")
            assert c.get(f"/v1/jobs/{job_id}").json()["status"] == "running"
            with stack.sessions() as s:
                engine_pid = s.get(Job, job_id).pid
            assert pid_alive(engine_pid)
            w1.kill()
            w1.wait()
            wait_for(lambda: not pid_alive(engine_pid), timeout=10, what="engine to die")
        finally:
            stop_worker(w1)
        wait_for(lambda: c.get(f"/v1/jobs/{job_id}").json()["status"] == "queued", timeout=20,
                 what="the reaper to re-queue")
        w2 = start_worker(settings, tmp_path / "w2.log", FAKE_EPOCH_S="0.2")
        try:
            job = wait_for(lambda: (j := c.get(f"/v1/jobs/{job_id}").json())["status"] in
                           ("succeeded", "failed") and j, timeout=60, what="success")
        finally:
            stop_worker(w2)
        assert job["status"] == "succeeded", job
        assert job["attempt"] == 2
        evs = c.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
    run_dir = settings.artifact_root / job_id / "run"
    engine = [e["data"] for e in evs if e["kind"] != "log" and e["data"]["event"] != "status"]
    assert engine == engine_lines(run_dir, settings)  # every engine line exactly once, in order
    assert sorted({e["epoch"] for e in engine if e["event"] == "epoch_end"}) == [1, 2, 3, 4, 5]
    statuses = [e["data"]["status"] for e in evs if e["data"]["event"] == "status"]
    assert statuses == ["queued", "running", "queued", "running", "succeeded"]
    spec = json.loads((settings.artifact_root / job_id / "job.json").read_text())
    assert spec["resume"] == str(run_dir / "weights" / "last.pt")


def test_one_worker_starts_the_other_users_job_next(stack, tmp_path):
    """Fair share on one real CPU worker (embedded broker; messages only wake it): user A
    queues 10 jobs, then user B queues 1; B's job is the next to start after the job that
    is running, though A's nine other messages are ahead of B's in the broker."""
    settings = stack.settings
    data = str(write_data_yaml(tmp_path / "ds"))
    _, token_a = make_user(stack.sessions)
    _, token_b = make_user(stack.sessions)
    w = start_worker(settings, tmp_path / "w.log", FAKE_EPOCH_S="1.0")
    a_jobs: list[str] = []
    with client(stack.url, token_a) as ca, client(stack.url, token_b) as cb:
        try:
            a_jobs = [submit(ca, data, epochs=2) for _ in range(10)]
            wait_for(lambda: ca.get(f"/v1/jobs/{a_jobs[0]}").json()["status"] == "running",
                     timeout=60, what="A's first job to start")
            b_job = submit(cb, data, epochs=1)
            b = cb.get(f"/v1/jobs/{b_job}").json()
            if b["status"] == "queued":  # A's first job still runs
                assert b["queue_position"] == 1, b
            wait_for(lambda: cb.get(f"/v1/jobs/{b_job}").json()["status"] == "succeeded",
                     timeout=60, what="B's job to succeed")
            with stack.sessions() as s:
                started = [j.id for j in s.query(Job).filter(Job.id.in_([*a_jobs, b_job]),
                                                             Job.started_at.isnot(None))
                           .order_by(Job.started_at)]
            assert started[:2] == [a_jobs[0], b_job], started
        finally:  # nothing of A's stays queued for the next test's workers
            for job_id in a_jobs:
                ca.post(f"/v1/jobs/{job_id}/cancel")
            wait_for(lambda: all(ca.get(f"/v1/jobs/{j}").json()["status"] in
                                 ("succeeded", "failed", "cancelled") for j in a_jobs),
                     timeout=60, what="A's jobs to end")
            stop_worker(w)


def test_redis_broker_and_lost_message_is_resent(make_settings, sqlite_url, tmp_path):
    """Redis as the broker. The queue is wiped while the job waits (a Redis restart without
    persistence); the reaper re-sends the message and the job still runs."""
    import redis

    from service.app import create_app

    r = redis.Redis.from_url(REDIS_URL)
    try:
        r.ping()
    except redis.RedisError:
        pytest.skip(f"Redis at {REDIS_URL} not reachable")
    prefix = f"lyt-test-{secrets.token_hex(4)}:"
    settings = make_settings(sqlite_url, broker_url=REDIS_URL,
                             broker_transport_options={"global_keyprefix": prefix},
                             reaper_enabled=True, reaper_interval_s=0.5, resend_after_s=2)
    srv = ServerThread(create_app(settings)).start()
    w = None
    try:
        _, token = make_user(srv.server.config.app.state.sessions)
        with client(srv.url, token) as c:
            job_id = submit(c, str(write_data_yaml(tmp_path / "ds")), epochs=2)
            wait_for(lambda: list(r.scan_iter(match=prefix + "*")), what="message in Redis")
            for key in r.scan_iter(match=prefix + "*"):
                r.delete(key)
            w = start_worker(settings, tmp_path / "w.log")
            job = wait_for(lambda: (j := c.get(f"/v1/jobs/{job_id}").json())["status"] in
                           ("succeeded", "failed") and j, timeout=60, what="success")
            assert job["status"] == "succeeded" and job["attempt"] == 1
            arts = c.get(f"/v1/jobs/{job_id}/artifacts").json()["data"]
            best = next(a for a in arts if a["path"] == "weights/last.pt")
            blob = c.get(best["url"]).content
            import hashlib

            assert hashlib.sha256(blob).hexdigest() == best["sha256"]
    finally:
        if w is not None:
            stop_worker(w)
        srv.stop()
        for key in r.scan_iter(match=prefix + "*"):
            r.delete(key)


def test_up_embedded_mode_runs_a_job_and_stops_cleanly(tmp_path):
    """`libreyolo-service up`: token saved (mode 600), API + worker, a job succeeds, a
    killed worker is restarted and the next job succeeds, and SIGTERM leaves no child."""
    from testkit import fake_engine

    port = free_port()
    home = tmp_path / "homedir"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(home),
           "LIBREYOLO_ENGINE_COMMAND": json.dumps(fake_engine(tmp_path)),
           "LIBREYOLO_POLL_INTERVAL_S": "0.1", "LIBREYOLO_GRACE_S": "3"}
    for k in ("LIBREYOLO_DATABASE_URL", "LIBREYOLO_BROKER_URL", "LIBREYOLO_HOME"):
        env.pop(k, None)
    up = subprocess.Popen([sys.executable, "-m", "service.cli", "up", "--port", str(port),
                           "--cpu"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    creds = home / ".config" / "libreyolo" / "credentials"
    try:
        wait_for(creds.exists, timeout=60, what="credentials")
        assert creds.stat().st_mode & 0o777 == 0o600
        saved = json.loads(creds.read_text())
        assert saved["url"] == f"http://127.0.0.1:{port}"
        wait_for(lambda: _ok(saved["url"] + "/healthz"), timeout=60, what="the API")
        with client(saved["url"], saved["token"]) as c:
            job_id = submit(c, str(write_data_yaml(tmp_path / "ds")), epochs=2)
            job = wait_for(lambda: (j := c.get(f"/v1/jobs/{job_id}").json())["status"] in
                           ("succeeded", "failed") and j, timeout=90, what="success")
            assert job["status"] == "succeeded"
            # the worker announced itself: its heartbeat row serves the cpu queue
            assert 'libreyolo_workers{queue="cpu"} 1.0' in c.get("/metrics").text
        assert (tmp_path / ".libreyolo" / "libreyolo.db").exists()
        children = _children(up.pid)
        assert len(children) == 2
        # the worker dies (kill -9): `up` starts a new one and the next job still runs
        worker = next(pid for pid in children if b"worker" in Path(f"/proc/{pid}/cmdline").read_bytes())
        os.kill(worker, signal.SIGKILL)
        wait_for(lambda: len(kids := _children(up.pid)) == 2 and worker not in kids, timeout=60,
                 what="a restarted worker")
        with client(saved["url"], saved["token"]) as c:
            job_id = submit(c, str(write_data_yaml(tmp_path / "ds2")), epochs=1)
            job = wait_for(lambda: (j := c.get(f"/v1/jobs/{job_id}").json())["status"] in
                           ("succeeded", "failed") and j, timeout=120, what="success after restart")
            assert job["status"] == "succeeded"
        children = _children(up.pid)
    finally:
        up.send_signal(signal.SIGTERM)
        out, _ = up.communicate(timeout=60)
    assert up.returncode == 0, out
    assert saved["token"] in out and "the worker process exited (code -9); restarting it" in out
    if os.geteuid() == 0:  # #28.10: our word before Celery's superuser warning
        assert "note:   running as root, so Celery warns below" in out, out[:3000]
    for pid in children:
        wait_for(lambda pid=pid: not pid_alive(pid), timeout=10, what=f"child {pid} to exit")


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _children(ppid: int) -> list[int]:
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == ppid:
                out.append(int(entry.name))
    return out


def test_job_events_table_has_unique_seq(sqlite_url):
    from sqlalchemy import inspect

    from service.db.session import make_engine

    engine = make_engine(sqlite_url)
    uniques = inspect(engine).get_unique_constraints(JobEvent.__tablename__)
    assert any(u["column_names"] == ["job_id", "seq"] for u in uniques)
    engine.dispose()


def test_up_children_end_with_it_after_kill9_and_a_taken_port_is_named(tmp_path):
    """A kill -9 of `up` leaves no orphan (its API and worker get SIGTERM from the kernel);
    `up` on a port something holds exits 1 at once, naming the port."""
    import socket

    port = free_port()
    home = tmp_path / "homedir"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(home)}
    for k in ("LIBREYOLO_DATABASE_URL", "LIBREYOLO_BROKER_URL", "LIBREYOLO_HOME"):
        env.pop(k, None)
    argv = [sys.executable, "-m", "service.cli", "up", "--port", str(port), "--cpu"]
    up = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _ok(f"http://127.0.0.1:{port}/healthz"), timeout=60, what="the API")
        children = wait_for(lambda: len(k := _children(up.pid)) == 2 and k, timeout=30,
                            what="the API and the worker")
    finally:
        up.kill()
        up.wait(timeout=10)
    for pid in children:
        wait_for(lambda pid=pid: not pid_alive(pid), timeout=45, what=f"orphan {pid} to exit")

    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"127.0.0.1:{port} is already in use" in r.stderr and "Traceback" not in r.stderr
