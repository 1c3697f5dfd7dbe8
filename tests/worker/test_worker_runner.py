"""Runner and reaper with a fake engine script, on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

import pytest
from testkit import engine_lines, make_user, pid_alive, queued_job, wait_for

from service.db.models import Artifact, Job, JobEvent, User, utcnow
from service.lifecycle import CLAIM, REQUEST_CANCEL
from service.ops import transition
from service.reaper import reap_once
from service.storage import ArtifactStore
from worker.launch import NodeLaunch, build_command, build_env, job_spec
from worker.runner import run_job


def new_job(sessions, params=None, gpus=0, **over) -> str:
    name, _ = make_user(sessions)
    with sessions() as s:
        owner_id = s.query(User).filter_by(name=name).one().id
    return queued_job(sessions, owner_id, params=params or {"epochs": 3}, gpus=gpus, **over)


def job_row(sessions, job_id) -> Job:
    with sessions() as s:
        return s.get(Job, job_id)


def events(sessions, job_id) -> list[JobEvent]:
    with sessions() as s:
        return list(s.query(JobEvent).filter_by(job_id=job_id).order_by(JobEvent.seq))


def engine_events_in_db(evs) -> list[dict]:
    return [e.payload for e in evs if e.kind != "log" and e.payload.get("event") != "status"]


def test_launch_command_and_env(tmp_path):
    from service.settings import Settings

    s = Settings(home=tmp_path, engine_python="/py")
    spec = tmp_path / "job.json"
    assert build_command(spec, 1, s) == ["/py", "-m", "libreyolo_core.cli", "train",
                                         f"spec={spec}"]
    assert build_command(spec, 4, s) == [
        "/py", "-m", "libreyolo_core.distributed.torchrun", "--standalone", "--nproc_per_node=4",
        "-m", "libreyolo_core.cli", "train", f"spec={spec}"]
    # one node of a multi-node job: the static rendezvous at node 0's endpoint, with this
    # node's slot as torch's node rank (global rank 0 then runs on node 0)
    node = NodeLaunch(nnodes=2, node_rank=1, endpoint="10.0.0.2:29400", run_id="j1-2",
                      local_addr="10.0.0.3", join_timeout_s=120)
    assert build_command(spec, 2, s, node) == [
        "/py", "-m", "libreyolo_core.distributed.torchrun", "--nnodes=2", "--node-rank=1",
        "--rdzv-backend=static", "--rdzv-endpoint=10.0.0.2:29400", "--rdzv-id=j1-2",
        "--rdzv-conf=timeout=120", "--local-addr=10.0.0.3", "--max-restarts=0",
        "--nproc-per-node=2", "-m", "libreyolo_core.cli", "train", f"spec={spec}"]
    assert build_env(["2", "3", "5"], 2, {})["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert build_env(["0"], 0, {})["CUDA_VISIBLE_DEVICES"] == ""
    spec_d = job_spec(kind="train", model="yolo9-t", data="/d.yaml", params={"epochs": 1},
                      gpus=0, job_dir=tmp_path, resume=False)
    assert spec_d.to_dict() == {"kind": "train", "model": "yolo9-t", "data": "/d.yaml",
                      "params": {"epochs": 1, "device": "cpu"}, "project": str(tmp_path),
                      "name": "run", "exist_ok": True, "resume": False}


def test_run_job_succeeds_with_ordered_events_and_artifacts(settings, sessions):
    job_id = new_job(sessions)
    assert run_job(job_id, settings=settings, sessions=sessions) == "succeeded"
    job = job_row(sessions, job_id)
    assert job.status == "succeeded" and job.attempt == 1 and job.lease_owner is None
    assert job.result["best_epoch"] == 3 and job.result["metrics"]["mAP50"] == pytest.approx(0.3)
    # the class names travel with per_class_AP (JSON keys: the class ids as strings)
    assert job.result["names"] == {"0": "circle"} and set(job.result["metrics"]["per_class_AP"]) == {"0"}
    assert job.progress["epoch"] == 3 and job.result["epochs_completed"] == 3
    store = ArtifactStore(settings.artifact_root)
    spec = json.loads((store.job_dir(job_id) / "job.json").read_text())
    assert spec["project"] == str(store.job_dir(job_id)) and spec["name"] == "run"
    assert spec["resume"] is False and spec["params"]["device"] == "cpu"
    evs = events(sessions, job_id)
    assert [e.seq for e in evs] == list(range(1, len(evs) + 1))
    statuses = [e.payload["status"] for e in evs if e.payload.get("event") == "status"]
    assert statuses == ["queued", "running", "succeeded"]
    assert engine_events_in_db(evs) == engine_lines(store.run_dir(job_id))
    logs = [ln for e in evs if e.kind == "log" for ln in e.payload["lines"]]
    assert logs[-1] == "done" and "epoch 2 step 4/4" in logs
    with sessions() as s:
        arts = {a.path: a for a in s.query(Artifact).filter_by(job_id=job_id)}
    assert {"weights/last.pt", "events.jsonl", "results.csv", "timeline.html"} <= set(arts)
    assert arts["weights/last.pt"].kind == "checkpoint"
    assert arts["timeline.html"].kind == "timeline"
    for rel, a in arts.items():
        data = (store.run_dir(job_id) / rel).read_bytes()
        assert a.sha256 == hashlib.sha256(data).hexdigest() and a.size_bytes == len(data)


def test_duplicate_delivery_runs_once(settings, sessions):
    job_id = new_job(sessions, {"epochs": 1})
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        run_job(job_id, settings=settings, sessions=sessions))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == ["skipped", "succeeded"]
    assert job_row(sessions, job_id).attempt == 1
    assert run_job(job_id, settings=settings, sessions=sessions) == "skipped"


def _start(settings, sessions, job_id):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault(
        "status", run_job(job_id, settings=settings, sessions=sessions)))
    t.start()
    wait_for(lambda: job_row(sessions, job_id).pid and any(
        e.payload.get("event") == "progress" for e in events(sessions, job_id)),
        what="the engine to report progress")
    return t, out, job_row(sessions, job_id).pid


@pytest.mark.parametrize("ignore_term", [0, 1])
def test_cancel_running_job_kills_the_process_group(make_settings, db_url, ignore_term):
    settings = make_settings(db_url, grace_s=1.0)
    from service.db.session import make_engine, make_session_factory

    sessions = make_session_factory(make_engine(db_url))
    job_id = new_job(sessions, {"epochs": 50, "fake_epoch_s": 1.0,
                                "fake_ignore_term": ignore_term})
    t, out, pid = _start(settings, sessions, job_id)
    assert pid_alive(pid)
    t0 = time.monotonic()
    with sessions() as s:
        assert transition(s, job_id, REQUEST_CANCEL, cancel_requested=True)
        s.commit()
    t.join(30)
    assert out["status"] == "cancelled"
    assert time.monotonic() - t0 < settings.grace_s + 3
    assert not pid_alive(pid)
    job = job_row(sessions, job_id)
    assert job.status == "cancelled" and job.finished_at is not None
    lines = engine_lines(ArtifactStore(settings.artifact_root).run_dir(job_id))
    if not ignore_term:  # the engine stopped cleanly: last.pt and run_end interrupted
        assert lines[-1]["event"] == "run_end" and lines[-1]["status"] == "interrupted"
    # an epoch cut off by the cancel is not a completed one
    ends = [e["epoch"] for e in lines if e["event"] == "epoch_end"]
    assert job.result["epochs_completed"] == (ends[-1] if ends else 0), (job.result, ends)
    assert engine_events_in_db(events(sessions, job_id)) == lines


def test_engine_failure_records_exit_code_and_log_tail(settings, sessions):
    job_id = new_job(sessions, {"epochs": 2, "fake_exit": 3})
    assert run_job(job_id, settings=settings, sessions=sessions) == "failed"
    job = job_row(sessions, job_id)
    assert job.error["exit_code"] == 3 and job.error["reason"] == "data error"
    assert "fatal: something broke in the data" in job.error["log_tail"]
    # the engine's error file (what the CLI printed) wins over run_end's error field
    assert job.error["engine_error"] == "DatasetError: data broke" and job.error["failed_rank"] == 0
    assert "launcher_exit_code" not in job.error  # one process: its code is the engine's


def test_time_budget_stops_the_run(settings, sessions):
    job_id = new_job(sessions, {"epochs": 50, "fake_epoch_s": 1.0}, time_budget_s=0.5)
    assert run_job(job_id, settings=settings, sessions=sessions) == "failed"
    assert "time budget" in job_row(sessions, job_id).error["reason"]


def test_worker_shutdown_requeues_for_resume(settings, sessions):
    job_id = new_job(sessions, {"epochs": 50, "fake_epoch_s": 0.4})
    stop, sent, out = threading.Event(), [], {}
    t = threading.Thread(target=lambda: out.setdefault("s", run_job(
        job_id, settings=settings, sessions=sessions, stop=stop,
        on_requeue=lambda *a: sent.append(a))))
    t.start()
    wait_for(lambda: any(e.payload.get("event") == "epoch_end" for e in events(sessions, job_id)))
    stop.set()
    t.join(30)
    assert out["s"] == "queued" and sent == [(job_id, "cpu", 0)]
    job = job_row(sessions, job_id)
    assert job.status == "queued" and job.attempt == 0  # a hand-back is not a failed attempt
    assert _requeue_reasons(sessions, job_id) == ["worker shut down; re-queued, resuming from last.pt"]
    # the shutting-down worker takes the re-sent message itself: it hands it back without
    # starting (and killing) an attempt
    assert run_job(job_id, settings=settings, sessions=sessions, stop=stop,
                   on_requeue=lambda *a: sent.append(a)) == "skipped"
    job = job_row(sessions, job_id)
    assert job.status == "queued" and job.attempt == 0 and len(sent) == 2
    # however often the service restarts, the next worker resumes and max_attempts is intact
    assert run_job(job_id, settings=settings, sessions=sessions) == "succeeded"
    job = job_row(sessions, job_id)
    assert job.attempt == 1
    spec = json.loads((ArtifactStore(settings.artifact_root).job_dir(job_id) / "job.json").read_text())
    assert spec["resume"].endswith("last.pt")


def test_reaper_requeues_expired_lease_and_next_run_resumes(settings, sessions):
    """A worker died mid-run: its lease expires, the reaper re-queues, the next run
    resumes from last.pt, and events the dead worker never copied are not lost."""
    job_id = new_job(sessions, {"epochs": 3})
    store = ArtifactStore(settings.artifact_root)
    run = store.run_dir(job_id)
    (run / "weights").mkdir(parents=True)
    (run / "weights" / "last.pt").write_text(json.dumps({"epoch": 1}))
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [
        {"event": "run_start", "time": 1.0}, {"event": "epoch_end", "time": 2.0, "epoch": 1}]))
    with sessions() as s:  # the dead worker claimed it long ago
        transition(s, job_id, CLAIM, attempt=1, lease_owner="dead:1",
                   lease_expires_at=utcnow(), started_at=utcnow(), pid=999999)
        s.commit()
    sent = []
    counts = reap_once(sessions, settings, lambda *a: sent.append(a))
    assert counts["requeued"] == 1 and sent == [(job_id, "cpu", 0)]
    assert job_row(sessions, job_id).status == "queued"
    reason = _requeue_reasons(sessions, job_id)[-1]
    assert "re-queued for attempt 2 (infrastructure retry 1 of 10), resuming from last.pt" \
        in reason, reason
    requeued = job_row(sessions, job_id)
    assert (requeued.end_class, requeued.end_reason, requeued.infra_retries) == \
        ("infrastructure", "lease expired (worker lost)", 1)
    assert run_job(job_id, settings=settings, sessions=sessions) == "succeeded"
    job = job_row(sessions, job_id)
    assert job.attempt == 2 and job.end_class is None  # a success clears the last end
    spec = json.loads((store.job_dir(job_id) / "job.json").read_text())
    assert spec["resume"] == str(run / "weights" / "last.pt")
    evs = events(sessions, job_id)
    assert [e.seq for e in evs] == list(range(1, len(evs) + 1))
    assert engine_events_in_db(evs) == engine_lines(run)
    ends = [e["epoch"] for e in engine_lines(run) if e["event"] == "epoch_end"]
    assert ends == [1, 2, 3]
    statuses = [e.payload["status"] for e in evs if e.payload.get("event") == "status"]
    assert statuses == ["queued", "running", "queued", "running", "succeeded"]


def _requeue_reasons(sessions, job_id) -> list[str]:
    return [e.payload["reason"] for e in events(sessions, job_id)
            if e.payload.get("status") == "queued" and "reason" in e.payload]


def test_reaper_says_when_there_is_no_last_pt_to_resume_from(settings, sessions):
    """Killed during epoch 1: no last.pt yet, so the next attempt starts again."""
    job_id = new_job(sessions)
    with sessions() as s:
        transition(s, job_id, CLAIM, attempt=1, lease_owner="dead:1",
                   lease_expires_at=utcnow())
        s.commit()
    assert reap_once(sessions, settings, lambda *a: None)["requeued"] == 1
    [reason] = _requeue_reasons(sessions, job_id)
    assert "attempt 2 (infrastructure retry 1 of 10), starting again (no last.pt yet)" \
        in reason and "resuming" not in reason


def test_reaper_fails_after_the_infrastructure_budget_and_resends_lost_messages(
        make_settings, db_url, sessions):
    """A lost worker is an infrastructure end: re-queued while infra_retries is below
    max_infra_retries (attempt 3 of max_attempts 3 does not matter), then failed."""
    settings = make_settings(db_url, max_infra_retries=2)
    job_id = new_job(sessions)
    with sessions() as s:
        transition(s, job_id, CLAIM, attempt=3, lease_owner="dead:1",
                   lease_expires_at=utcnow())
        s.commit()
    assert reap_once(sessions, settings, lambda *a: None)["requeued"] == 1
    with sessions() as s:  # claimed again by a worker that dies too; its budget is spent
        s.get(Job, job_id).infra_retries = 2
        transition(s, job_id, CLAIM, attempt=4, lease_owner="dead:2",
                   lease_expires_at=utcnow())
        s.commit()
    lost = new_job(sessions)
    with sessions() as s:
        s.get(Job, lost).enqueued_at = utcnow().replace(year=2000)
        s.commit()
    sent = []
    counts = reap_once(sessions, settings, lambda *a: sent.append(a))
    assert counts["failed"] == 1 and counts["resent"] >= 1
    job = job_row(sessions, job_id)
    assert job.status == "failed" and job.end_class == "infrastructure"
    assert "on attempt 4, after 2 infrastructure retries" in job.error["reason"], job.error
    assert (lost, "cpu", 0) in sent
    assert reap_once(sessions, settings, lambda *a: sent.append(a))["resent"] == 0


def test_kill_leftovers_only_hits_the_job_dir(tmp_path):
    import subprocess
    import sys

    from worker.process import kill_leftovers

    job_dir = tmp_path / "job"
    job_dir.mkdir()
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=job_dir,
                         start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             cwd=tmp_path, start_new_session=True)
    try:
        assert kill_leftovers(other.pid, job_dir) == 0
        assert kill_leftovers(p.pid, job_dir) == 1
        p.wait(10)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
    assert Path(job_dir).exists() and os.getpid()


def test_poll_interval_step_sets_polling_transports_only():
    """The embedded broker is polled every broker_poll_s (kombu's 1 s default was the
    idle worker's submit -> running latency); event-driven transports are left alone."""
    from types import SimpleNamespace

    from worker.tasks import poll_interval_step

    step = poll_interval_step(0.1)
    polling = SimpleNamespace(connection=SimpleNamespace(
        transport=SimpleNamespace(polling_interval=1.0)))
    evented = SimpleNamespace(connection=SimpleNamespace(
        transport=SimpleNamespace(polling_interval=None)))
    step.start(step.__new__(step), polling)
    step.start(step.__new__(step), evented)
    assert polling.connection.transport.polling_interval == 0.1
    assert evented.connection.transport.polling_interval is None


def test_an_infrastructure_exit_requeues_on_its_own_budget_then_fails(make_settings, db_url,
                                                                      sessions):
    """The engine's watchdog exit (5, a hang) is an infrastructure end: re-queued without
    using an attempt while max_infra_retries allows, then failed naming the budget. A data
    error (exit 3) is the job's: failed at once."""
    settings = make_settings(db_url, max_infra_retries=1)
    job_id = new_job(sessions, {"epochs": 2, "fake_exit": 5})
    sent = []
    assert run_job(job_id, settings=settings, sessions=sessions,
                   on_requeue=lambda *a: sent.append(a)) == "queued"
    job = job_row(sessions, job_id)
    assert (job.status, job.end_class, job.infra_retries) == ("queued", "infrastructure", 1)
    assert sent[0] == (job_id, "cpu", 0)
    reason = _requeue_reasons(sessions, job_id)[-1]
    assert reason.startswith("infrastructure: DatasetError: data broke; re-queued for attempt "
                             "2 (infrastructure retry 1 of 1)"), reason
    assert run_job(job_id, settings=settings, sessions=sessions) == "failed"
    job = job_row(sessions, job_id)
    assert job.end_class == "infrastructure" and job.attempt == 2
    assert job.error["reason"].endswith("after 1 infrastructure retries"), job.error
    assert job.error["exit_code"] == 5

    data_error = new_job(sessions, {"epochs": 2, "fake_exit": 3})
    assert run_job(data_error, settings=settings, sessions=sessions) == "failed"
    job = job_row(sessions, data_error)
    assert (job.end_class, job.attempt, job.infra_retries) == ("job", 1, 0)
    assert job.end_reason == "data error: DatasetError: data broke"
