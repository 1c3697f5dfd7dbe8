"""Attempts are fenced across hosts (real engine, real processes and signals).

Two workers in PID namespaces of their own (``unshare --pid --fork --mount-proc``: neither
sees the other's processes, as on two hosts) share the database and the artifact store.
Worker A's process is SIGSTOPped mid-run past its lease; its engine trains on. The reaper
re-queues the job (an infrastructure end: no attempt of max_attempts used) and worker B
starts attempt 2, resuming from last.pt. From then on attempt 1's engine writes nothing: its
next event or checkpoint finds the fence and it exits 6. Then A gets SIGCONT: it finds its
lease lost and writes nothing either. Attempt 2 succeeds; the job's events are attempt 2's
from its start, with no line of attempt 1 after the re-queue.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from testkit import REPO, make_user, queued_job, wait_for

HERE = Path(__file__).resolve().parent

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                       reason="needs root and unshare (separate PID namespaces)"),
]


def _worker(env: dict[str, str], job_id: str, name: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable,
         str(HERE / "ns_worker.py"), job_id, name],
        env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT, cwd=str(REPO))


def _python_of(unshare: subprocess.Popen) -> psutil.Process:
    """The worker's python (the child of unshare's forked child, pid 1 of its namespace)."""
    def find():
        for p in psutil.Process(unshare.pid).children(recursive=True):
            if "ns_worker.py" in " ".join(p.cmdline()):
                return p
        return None
    return wait_for(find, timeout=20, what="the worker's python")


def _lines(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def test_a_stopped_workers_engine_is_fenced_off_on_another_host(make_settings, sqlite_url,
                                                                tmp_path):
    from libreyolo_core.data.sample import generate_sample_dataset
    from service.db.models import Job, JobEvent, User
    from service.db.session import make_engine, make_session_factory
    from service.reaper import reap_once
    from service.storage import ArtifactStore

    # attempt 1 must still be training when attempt 2 raises the fence (the lease, the
    # reaper and worker B's start take ~8 s): 12 steps an epoch, 20 epochs. With 2 steps an
    # epoch a quiet machine finished all 12 epochs first and attempt 2 found nothing to do.
    data = generate_sample_dataset(tmp_path / "sample", n_train=48, n_val=2, imgsz=64)
    settings = make_settings(sqlite_url, engine_command=None, lease_s=4, heartbeat_s=0.5,
                             poll_interval_s=0.1, grace_s=5)
    engine = make_engine(settings.database_url)
    sessions = make_session_factory(engine)
    name, _ = make_user(sessions)
    with sessions() as s:
        owner = s.query(User).filter_by(name=name).one().id
    job_id = queued_job(sessions, owner, data=str(data), procs=1,
                        params={"epochs": 20, "imgsz": 64, "batch": 4, "workers": 0,
                                "val": False})
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "LIBREYOLO_HOME": str(settings.home), "LIBREYOLO_DATABASE_URL": sqlite_url,
           "LIBREYOLO_BROKER_URL": "memory://", "LIBREYOLO_LEASE_S": "4",
           "LIBREYOLO_HEARTBEAT_S": "0.5", "LIBREYOLO_POLL_INTERVAL_S": "0.1",
           "LIBREYOLO_GRACE_S": "5", "LIBREYOLO_REAPER_ENABLED": "false"}
    store = ArtifactStore(settings.artifact_root)
    run_dir = store.run_dir(job_id)
    events_path = run_dir / "events.jsonl"
    a = _worker(env, job_id, "host-a", tmp_path / "a.log")
    b = None
    try:
        wait_for(lambda: events_path.exists() and sum(
            e["event"] == "epoch_end" for e in _lines(events_path)) >= 2,
            timeout=180, interval=0.2, what="two epochs of attempt 1")
        a_py = _python_of(a)
        with sessions() as s:
            pid_in_ns = s.get(Job, job_id).pid
        a_engine = next(p for p in a_py.children() if p.is_running())
        a_py.send_signal(signal.SIGSTOP)  # host A's worker freezes; its engine trains on
        t_stop = time.monotonic()
        wait_for(lambda: reap_once(sessions, settings, lambda *m: None)["requeued"] == 1,
                 timeout=30, interval=0.5, what="the reaper to re-queue the job")
        with sessions() as s:
            job = s.get(Job, job_id)
            assert (job.status, job.end_class, job.attempt) == ("queued", "infrastructure", 1)
        b = _worker(env, job_id, "host-b", tmp_path / "b.log")
        wait_for(lambda: (store.job_dir(job_id) / "attempt.fence").read_text().startswith("2."),
                 timeout=30, interval=0.1, what="attempt 2 to raise the fence")
        fence_at = len(events_path.read_bytes())
        # attempt 1's engine (another namespace: B could not kill it) stops at its next
        # write; its frozen worker cannot reap it, so it waits as a zombie until SIGCONT
        wait_for(lambda: a_engine.status() == psutil.STATUS_ZOMBIE, timeout=60,
                 interval=0.2, what="attempt 1's engine to stop at the fence")
        a_py.send_signal(signal.SIGCONT)
        assert a.wait(60) == 0
        assert b.wait(300) == 0
        a_out, b_out = (tmp_path / "a.log").read_text(), (tmp_path / "b.log").read_text()
        assert "result: lost" in a_out, a_out[-3000:]
        assert "result: succeeded" in b_out, b_out[-3000:]
        with sessions() as s:
            job = s.get(Job, job_id)
            evs = list(s.query(JobEvent).filter_by(job_id=job_id).order_by(JobEvent.seq))
        assert (job.status, job.attempt, job.infra_retries) == ("succeeded", 2, 1)
        log = store.log_path(job_id).read_text()
        assert "fenced: this engine runs attempt 1." in log
        # no line of attempt 1 after attempt 2 raised the fence; before it, attempt 1's
        # lines are its history (written while its worker was frozen), kept once
        after = _lines_from(events_path, fence_at)
        assert after and all(e.get("attempt_token", "").startswith("2.") for e in after), \
            {e.get("attempt_token") for e in after}
        stored = [e.payload for e in evs if e.kind != "log" and e.payload.get("event") != "status"]
        assert stored == _lines(events_path)
        first = [e for e in _lines(events_path) if e.get("attempt_token", "").startswith("1.")]
        second = [e for e in _lines(events_path) if e.get("attempt_token", "").startswith("2.")]
        a_last = max(e["epoch"] for e in first if e["event"] == "epoch_end")
        b_first = min(e["epoch"] for e in second if e["event"] == "progress")
        ends = [e["epoch"] for e in second if e["event"] == "epoch_end"]
        assert b_first == a_last + 1 and ends == list(range(b_first, 21)), (a_last, b_first, ends)
        print(f"SIGSTOP past the lease: attempt {job.attempt} (infrastructure retry "
              f"{job.infra_retries}; max_attempts untouched); attempt 1's engine trained on to "
              f"epoch {a_last} and was fenced off, attempt 2 resumed at epoch {b_first}: 0 "
              f"completed epochs lost (the epoch in progress at the fence is redone); "
              f"{time.monotonic() - t_stop:.0f} s from SIGSTOP to the end; attempt 1's engine "
              f"was pid {pid_in_ns} in its own namespace")
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                for c in psutil.Process(p.pid).children(recursive=True):
                    c.send_signal(signal.SIGCONT)
                    c.kill()
                p.kill()
        engine.dispose()


def _lines_from(path: Path, offset: int) -> list[dict]:
    with open(path, "rb") as f:
        f.seek(offset)
        tail = f.read().decode()
    first = tail.find("\n")  # the offset may fall inside a line
    return [json.loads(ln) for ln in tail[first + 1:].splitlines() if ln.strip()] \
        if not tail.startswith("{") else [json.loads(ln) for ln in tail.splitlines() if ln.strip()]
