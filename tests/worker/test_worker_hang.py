"""The hang watchdog with real training (CPU): a hook sleeps for ever at step 5; the stacks
of every rank reach the log, the tree is killed, the attempt ends ``infrastructure: hang``,
is re-queued (no attempt of max_attempts used) and resumes from last.pt to succeed. One
process, and two Gloo ranks under torchrun."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from testkit import engine_lines, make_user, pid_alive, queued_job

HERE = Path(__file__).resolve().parent


def _hang_command(spec: Path, nproc: int, settings, node=None) -> list[str]:
    script = str(HERE / "hang_entry.py")
    if nproc > 1:
        return [sys.executable, "-m", "libreyolo_core.distributed.torchrun", "--standalone",
                f"--nproc_per_node={nproc}", script, "train", f"spec={spec}"]
    return [sys.executable, script, "train", f"spec={spec}"]


@pytest.mark.slow
@pytest.mark.parametrize("procs", [1, 2])
def test_a_hung_step_is_explained_killed_and_resumed(make_settings, sqlite_url, tmp_path,
                                                     monkeypatch, procs):
    from libreyolo_core.data.sample import generate_sample_dataset
    from service.db.models import Job, JobEvent, User
    from service.db.session import make_engine, make_session_factory
    from service.storage import ArtifactStore
    from worker.runner import run_job

    # 8 images, batch 4 (2 ranks: 2 each): 2 steps an epoch; step 5 is epoch 3's first,
    # after last.pt of epoch 2
    data = generate_sample_dataset(tmp_path / "sample", n_train=8, n_val=2, imgsz=64)
    monkeypatch.setenv("HANG_AT_STEP", "5")
    monkeypatch.setenv("HANG_RANK", str(procs - 1))  # with 2 ranks, rank 1 hangs
    settings = make_settings(sqlite_url, engine_command=None, lease_s=60, heartbeat_s=1,
                             poll_interval_s=0.2, hang_factor=5, hang_min_s=8, grace_s=5)
    engine = make_engine(settings.database_url)
    sessions = make_session_factory(engine)
    name, _ = make_user(sessions)
    with sessions() as s:
        owner = s.query(User).filter_by(name=name).one().id
    job_id = queued_job(sessions, owner, data=str(data), procs=procs,
                        params={"epochs": 4, "imgsz": 64, "batch": 4, "workers": 0,
                                "val": False})
    store = ArtifactStore(settings.artifact_root)
    t0 = time.monotonic()
    first = run_job(job_id, settings=settings, sessions=sessions, command=_hang_command)
    hang_s = time.monotonic() - t0
    with sessions() as s:
        job = s.get(Job, job_id)
    assert first == "queued", (job.status, job.error)
    assert (job.end_class, job.infra_retries, job.attempt) == ("infrastructure", 1, 1)
    # the rank that sleeps, or with 2 ranks rank 0 waiting for it in a collective: whichever
    # watchdog fires first names itself; both are the same hang
    ranks = {f"hang: rank {r}: no step finished for" for r in range(procs)}
    assert any(job.end_reason.startswith(r) for r in ranks), job.end_reason
    log = store.log_path(job_id).read_text()
    # every rank's stacks are in the log: the hung rank's shows the hook's sleep
    assert log.count("the stacks of every thread of rank") >= procs, log[-4000:]
    assert "_hanging_step" in log and "Thread 0x" in log
    with sessions() as s:
        pid = s.get(Job, job_id).pid
    assert pid and not pid_alive(pid)
    t1 = time.monotonic()
    second = run_job(job_id, settings=settings, sessions=sessions, command=_hang_command)
    resume_s = time.monotonic() - t1
    with sessions() as s:
        job = s.get(Job, job_id)
        evs = list(s.query(JobEvent).filter_by(job_id=job_id).order_by(JobEvent.seq))
    assert second == "succeeded", job.error
    assert job.attempt == 2 and job.end_class is None
    spec = (store.job_dir(job_id) / "job.json").read_text()
    assert "last.pt" in spec  # the second attempt resumed
    ends = [e["epoch"] for e in engine_lines(store.run_dir(job_id)) if e["event"] == "epoch_end"]
    assert ends == [1, 2, 3, 4], ends  # at most the hung epoch was lost
    status = [(e.payload["status"], e.payload.get("end_class")) for e in evs
              if e.payload.get("event") == "status"]
    assert status == [("queued", None), ("running", None), ("queued", "infrastructure"),
                      ("running", None), ("succeeded", None)]
    # time to recover: from the last step the engine reported before the hang to the
    # re-queue (detection + stacks + kill), then to the resumed attempt's first step
    requeue = next(e for e in evs if e.payload.get("status") == "queued"
                   and e.payload.get("end_class"))
    before = [e.time for e in evs if e.seq < requeue.seq and e.payload.get("event") == "progress"]
    after = [e.time for e in evs if e.seq > requeue.seq and e.payload.get("event") == "progress"
             and e.payload.get("step") is not None]
    print(f"hang ({procs} rank(s)), hang_min_s={settings.hang_min_s:g}: re-queued "
          f"{requeue.time - before[-1]:.1f} s after the last step before it; training again "
          f"{after[0] - before[-1]:.1f} s after it (first attempt {hang_s:.1f} s, resumed "
          f"attempt {resume_s:.1f} s)")
    engine.dispose()
