"""The Slurm launcher end to end, on the private two-node Slurm (tests/slurm/slurm_cluster.py):
jobs submitted through the API, a worker (the runner, in a thread, as the Celery task runs
it) that submits them with sbatch, the real engine on CPU (Gloo), one rank per node."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import psutil
import pytest
from testkit import ServerThread, client, engine_lines, fresh_database, make_user, wait_for

PARAMS = {"imgsz": 64, "batch": 4, "workers": 0, "seed": 0}
DONE = ("succeeded", "failed", "cancelled")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    from libreyolo_core.data.sample import generate_sample_dataset

    return str(generate_sample_dataset(tmp_path_factory.mktemp("sl-sample"), n_train=8,
                                       n_val=4, imgsz=64, seed=0))


@pytest.fixture(scope="module")
def long_data(tmp_path_factory) -> str:
    """Enough images for an epoch of several steps (a cancel or requeue in mid-epoch)."""
    from libreyolo_core.data.sample import generate_sample_dataset

    return str(generate_sample_dataset(tmp_path_factory.mktemp("sl-long"), n_train=48,
                                       n_val=4, imgsz=64, seed=0))


class Stack:
    """The API on SQLite; ``run(job_id, launcher)`` runs the job as a worker would, in a
    thread (its result in ``self.results``)."""

    def __init__(self, url: str, home: Path):
        from service.app import create_app
        from service.settings import Settings

        base = dict(home=home, database_url=url, broker_url="memory://", engine_command=None,
                    lease_s=30, heartbeat_s=0.5, poll_interval_s=0.2, grace_s=30,
                    reaper_enabled=False, slurm_poll_s=0.5, slurm_partition="debug",
                    slurm_signal_s=30)
        self.local = Settings(**base)
        self.slurm = Settings(**base, launcher="slurm")
        self.app = create_app(self.local)
        self.server = ServerThread(self.app).start()
        self.url, self.sessions = self.server.url, self.app.state.sessions
        self.results: dict[str, str] = {}
        self.threads: list[threading.Thread] = []

    def run(self, job_id: str, launcher: str = "slurm") -> None:
        from worker.runner import run_job

        settings = self.slurm if launcher == "slurm" else self.local

        def body() -> None:
            self.results[job_id] = run_job(job_id, settings=settings, sessions=self.sessions)

        t = threading.Thread(target=body, daemon=True)
        t.start()
        self.threads.append(t)

    def stop(self) -> None:
        for t in self.threads:
            t.join(120)
        self.server.stop()


@pytest.fixture
def stack(slurm, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # one thread per rank on both sides
    for n in ("n1", "n2"):
        slurm.resume(n)
    wait_for(slurm.idle, timeout=60, interval=0.5, what="both Slurm nodes idle")
    with fresh_database("sqlite", tmp_path / "db") as url:
        s = Stack(url, tmp_path / "home")
        yield s
        s.stop()
    for line in slurm.run("squeue", "-h", "-o", "%i").stdout.split():
        slurm.run("scancel", line)


def submit(c, data: str, *, nodes: int, procs: int, epochs: int, **params) -> str:
    r = c.post("/v1/jobs", json={"model": "yolo9-t", "data": data, "gpus": 0, "nodes": nodes,
                                 "procs": procs, "params": {**PARAMS, "epochs": epochs, **params}})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def job(c, job_id: str) -> dict:
    return c.get(f"/v1/jobs/{job_id}").json()


def finished(c, job_id: str, timeout: float) -> dict:
    return wait_for(lambda: (j := job(c, job_id))["status"] in DONE and j, timeout=timeout,
                    interval=0.5, what=f"job {job_id} to end")


def events(c, job_id: str) -> list[dict]:
    evs = c.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))  # no gap, no double
    return evs


def engine_events(c, job_id: str) -> list[dict]:
    return [e["data"] for e in events(c, job_id)
            if e["kind"] != "log" and e["data"]["event"] != "status"]


def first_step_at(c, job_id: str) -> float:
    """Unix time of the job's first training step (its first progress event with a step)."""
    for e in events(c, job_id):
        d = e["data"]
        if d.get("event") == "progress" and d.get("phase") == "training" and d.get("step"):
            return float(d["time"])
    raise AssertionError(f"job {job_id}: no training step")


def epoch_losses(evs: list[dict]) -> list[dict[str, float]]:
    return [e["losses"] for e in evs if e["event"] == "epoch_end"]


def processes_in(job_dir: Path) -> list[int]:
    """Live processes working in ``job_dir`` (torchrun agents, ranks) on either node (both
    nodes are this host)."""
    out, root = [], job_dir.resolve()
    for p in psutil.process_iter(["pid"]):
        try:
            cwd = Path(p.cwd())
            if (cwd == root or root in cwd.parents) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


def in_epoch(c, job_id: str, epoch: int) -> dict:
    """Wait until the job trains in ``epoch`` (a progress event of it with a step)."""
    def seen() -> dict | None:
        j = job(c, job_id)
        if j["status"] in DONE:
            pytest.fail(f"job ended too soon: {j}")
        p = j.get("progress") or {}
        return j if (p.get("epoch") or 0) >= epoch and p.get("step") else None

    return wait_for(seen, timeout=400, interval=0.3, what=f"job {job_id} in epoch {epoch}")


@pytest.mark.slow
def test_two_node_slurm_job_trains_like_two_local_ranks(stack, data):
    """A 2-node CPU job on Slurm (srun torchrun on n1 and n2, one Gloo rank each) succeeds;
    its epochs and losses equal the same job run by the local launcher with 2 ranks.
    Also measured: submit -> first step, Slurm vs local (printed)."""
    _, token = make_user(stack.sessions)
    with client(stack.url, token) as c:
        t0 = time.time()
        on_slurm = submit(c, data, nodes=2, procs=1, epochs=2)
        stack.run(on_slurm, "slurm")
        running = wait_for(lambda: (j := job(c, on_slurm))["cluster"] and
                           j["cluster"].get("state") == "RUNNING" and j, timeout=120,
                           interval=0.2, what="the Slurm job to run")
        got = finished(c, on_slurm, timeout=400)
        logs = c.get(f"/v1/jobs/{on_slurm}/logs").text
        assert got["status"] == "succeeded", (got, logs[-3000:])
        slurm_first = first_step_at(c, on_slurm) - t0
        t1 = time.time()
        local = submit(c, data, nodes=1, procs=2, epochs=2)
        stack.run(local, "local")
        ref = finished(c, local, timeout=400)
        assert ref["status"] == "succeeded", ref
        local_first = first_step_at(c, local) - t1
        multi, single = engine_events(c, on_slurm), engine_events(c, local)
    assert running["cluster"]["nodes"] == "n[1-2]", running
    assert got["cluster"]["job_id"] == running["cluster"]["job_id"]
    assert got["cluster"]["state"] == "COMPLETED" and got["attempt"] == 1
    assert got["end_class"] is None
    assert [e["world_size"] for e in multi if e["event"] == "run_start"] == [2]
    assert "epoch 2/2" in logs, logs[-3000:]  # global rank 0 logs on node 0: the job's log
    assert multi == engine_lines(stack.slurm.artifact_root / on_slurm / "run", stack.slurm)
    a, b = epoch_losses(multi), epoch_losses(single)
    assert len(a) == len(b) == 2
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k] == pytest.approx(y[k], rel=1e-4, abs=1e-6), (k, a, b)
    metrics, ref_metrics = ((r["result"] or {}).get("metrics", {}) for r in (got, ref))
    assert metrics.keys() == ref_metrics.keys() and metrics
    for k, v in metrics.items():  # the same weights to 1e-4 (above): the same scores
        if isinstance(v, float):
            assert v == pytest.approx(ref_metrics[k], abs=0.02), (k, metrics, ref_metrics)
    print(f"submit -> first step: Slurm (2 nodes x 1 rank) {slurm_first:.1f} s, local "
          f"(1 node x 2 ranks) {local_first:.1f} s, ratio {slurm_first / local_first:.2f}")


def test_more_nodes_than_the_partition_stays_queued_with_slurms_reason(stack, data, slurm):
    """3 nodes on a 2-node partition: Slurm keeps it PENDING (PartitionConfig); the API says
    queued, with Slurm's reason and job id; a cancel ends it (scancel), nothing ran."""
    _, token = make_user(stack.sessions)
    with client(stack.url, token) as c:
        job_id = submit(c, data, nodes=3, procs=1, epochs=1, batch=3)
        stack.run(job_id, "slurm")
        j = wait_for(lambda: (j := job(c, job_id))["cluster"] and j["cluster"].get("reason")
                     and j, timeout=60, interval=0.2, what="Slurm's reason")
        assert j["status"] == "queued", j
        assert j["cluster"]["state"] == "PENDING" and j["cluster"]["reason"] == "PartitionConfig"
        assert j["waiting"] == f"Slurm: PartitionConfig (job {j['cluster']['job_id']})"
        squeue = slurm.run("squeue", "-h", "-j", j["cluster"]["job_id"], "-o", "%T %r").stdout
        assert squeue.split() == ["PENDING", "PartitionConfig"]
        time.sleep(3)  # it stays so
        assert job(c, job_id)["status"] == "queued"
        page = c.get(f"/jobs/{job_id}").text
        assert "in Slurm&#39;s queue" in page or "in Slurm's queue" in page
        assert f"job {j['cluster']['job_id']} · PENDING" in page and "PartitionConfig" in page
        want = f"Slurm: PartitionConfig (job {j['cluster']['job_id']})"
        from typer.testing import CliRunner

        from libreyolo_client import Client
        from service.cli import app as cli_app

        with Client(stack.url, token) as sdk:
            info = sdk.job(job_id).info
        assert info.status == "queued" and info.waiting == want
        assert info.cluster is not None and info.cluster["reason"] == "PartitionConfig"
        env = {"LIBREYOLO_URL": stack.url, "LIBREYOLO_TOKEN": token, "LIBREYOLO_NO_BROWSER": "1"}
        shown = CliRunner().invoke(cli_app, ["jobs", "show", job_id], env=env)
        assert shown.exit_code == 0, shown.output
        assert f": {want}" in shown.stdout
        assert f"slurm:    job {j['cluster']['job_id']} PENDING (PartitionConfig)" in shown.stdout
        assert c.post(f"/v1/jobs/{job_id}/cancel").status_code == 202
        done = finished(c, job_id, timeout=60)
    assert done["status"] == "cancelled", done
    assert done["cluster"]["state"] == "CANCELLED"


@pytest.mark.slow
def test_cancel_mid_epoch_saves_last_pt_and_leaves_nothing(stack, long_data, slurm):
    """Cancel in mid-epoch: scancel --signal=TERM reaches both nodes' engines, rank 0 saves
    last.pt, the job ends cancelled, and no process is left on either node."""
    _, token = make_user(stack.sessions)
    with client(stack.url, token) as c:
        job_id = submit(c, long_data, nodes=2, procs=1, epochs=5)
        stack.run(job_id, "slurm")
        in_epoch(c, job_id, 1)
        assert c.post(f"/v1/jobs/{job_id}/cancel").status_code == 202
        done = finished(c, job_id, timeout=120)
        logs = c.get(f"/v1/jobs/{job_id}/logs").text
    job_dir = stack.slurm.artifact_root / job_id
    assert done["status"] == "cancelled", (done, logs[-3000:])
    assert (job_dir / "run" / "weights" / "last.pt").is_file()
    assert done["end_class"] == "user"
    wait_for(lambda: not processes_in(job_dir), timeout=30, interval=0.5,
             what="no process left in the job's folder")
    assert slurm.run("squeue", "-h", "-j", done["cluster"]["job_id"]).stdout.strip() == ""


@pytest.mark.slow
def test_scontrol_requeue_resumes_from_last_pt_as_attempt_2(stack, long_data, slurm):
    """``scontrol requeue`` in mid-run (a preemption's stand-in): the engine saves last.pt
    on Slurm's SIGTERM, Slurm runs the allocation again, it resumes from last.pt under the
    same job id as attempt 2 (an infrastructure end of attempt 1) and loses at most one
    epoch."""
    _, token = make_user(stack.sessions)
    epochs = 3
    with client(stack.url, token) as c:
        job_id = submit(c, long_data, nodes=2, procs=1, epochs=epochs)
        stack.run(job_id, "slurm")
        j = in_epoch(c, job_id, 2)
        slurm_id = j["cluster"]["job_id"]
        requeued_at = time.time()
        assert slurm.scontrol("requeue", slurm_id).returncode == 0
        again = wait_for(lambda: (x := job(c, job_id))["attempt"] == 2 and x, timeout=120,
                         interval=0.3, what="attempt 2")
        assert again["end_class"] == "infrastructure" and "re-queued" in again["end_reason"]
        done = finished(c, job_id, timeout=600)
        evs = engine_events(c, job_id)
        statuses = [e["data"] for e in events(c, job_id) if e["kind"] == "status"]
    assert done["status"] == "succeeded", done
    assert done["attempt"] == 2 and done["cluster"]["job_id"] == slurm_id
    assert done["cluster"]["restarts"] == 1
    assert any("attempt 2 resumes" in s.get("reason", "") for s in statuses), statuses
    starts = [e for e in evs if e["event"] == "run_start"]
    assert len(starts) == 2 and (starts[1].get("start_epoch") or 0) >= 2, starts
    back = [e["time"] for e in evs if e["event"] == "progress" and e["time"] > starts[1]["time"]]
    print(f"scontrol requeue -> attempt 2's first step: {back[0] - requeued_at:.1f} s "
          f"(resumed at epoch {starts[1]['start_epoch']})")
    ended = [e["epoch"] for e in evs if e["event"] == "epoch_end"]
    assert sorted(set(ended)) == list(range(1, epochs + 1))
    assert len(ended) <= epochs + 1, ended  # at most one epoch lost (trained again)


@pytest.mark.slow
def test_node_down_mid_run_is_infrastructure_and_requeued(stack, long_data, slurm):
    """``scontrol update nodename=n2 state=down`` in mid-run: Slurm ends the allocation
    (NODE_FAIL) and re-queues it; our job's attempt 1 ends as infrastructure and it waits
    queued with Slurm's reason; n2 back, attempt 2 resumes from last.pt and succeeds."""
    _, token = make_user(stack.sessions)
    with client(stack.url, token) as c:
        job_id = submit(c, long_data, nodes=2, procs=1, epochs=3)
        stack.run(job_id, "slurm")
        in_epoch(c, job_id, 2)
        assert slurm.scontrol("update", "nodename=n2", "state=down",
                              "reason=test").returncode == 0
        waiting = wait_for(lambda: (x := job(c, job_id))["status"] == "queued" and x,
                           timeout=120, interval=0.3, what="the job queued again")
        assert waiting["end_class"] == "infrastructure", waiting
        assert waiting["waiting"].startswith("Slurm: "), waiting
        slurm.resume("n2")
        done = finished(c, job_id, timeout=600)
        ends = [e["data"] for e in events(c, job_id)
                if e["kind"] == "status" and e["data"].get("end_class")]
    assert done["status"] == "succeeded", done
    assert done["attempt"] == 2 and done["cluster"]["restarts"] == 1
    assert [e["end_class"] for e in ends] == ["infrastructure"], ends
    assert "Slurm re-queued" in ends[0]["why"]


def test_a_new_attempt_cancels_the_slurm_job_an_earlier_one_left(slurm, tmp_path, monkeypatch):
    """The worker of attempt 1 died while its Slurm job ran on: attempt 2's launch cancels
    that job (of our name only) before it submits its own."""
    from service.settings import Settings
    from worker.launcher import LaunchRequest
    from worker.slurm import SlurmLauncher

    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    job_id = "j0123456789abcdefslurm"
    old = slurm.run("sbatch", "--parsable", f"--job-name=ly-{job_id[:12]}", "--nodes=1",
                    f"--output={tmp_path / 'old.out'}", "--wrap", "sleep 300").stdout.strip()
    other = slurm.run("sbatch", "--parsable", "--job-name=someone-else", "--nodes=1",
                      f"--output={tmp_path / 'other.out'}", "--wrap", "sleep 300").stdout.strip()
    launcher = SlurmLauncher(Settings(home=tmp_path, launcher="slurm", slurm_partition="debug"))
    req = LaunchRequest(job_id=job_id, attempt=2, job_dir=tmp_path, spec_path=tmp_path / "job.json",
                        log_path=tmp_path / "train.log", argv=[], env=dict(os.environ), nodes=1,
                        previous={"launcher": "slurm", "job_id": old})
    new = launcher.launch(req)
    try:
        wait_for(lambda: slurm.run("squeue", "-h", "-j", old, "-o", "%T").stdout.strip()
                 in ("", "CANCELLED", "COMPLETING"), timeout=30, what="the old job cancelled")
        assert slurm.run("squeue", "-h", "-j", other, "-o", "%T").stdout.strip() in (
            "RUNNING", "PENDING")
        assert new.slurm_id not in (old, other)
    finally:
        for j in (new.slurm_id, other, old):
            slurm.run("scancel", j)


@pytest.mark.slow
def test_time_limit_near_checkpoints_first(slurm, tmp_path, monkeypatch, long_data):
    """``--time=2 --signal=B:USR1@80``: Slurm's USR1 reaches the batch script 40 s in, which
    passes a SIGTERM to the engine on both nodes; rank 0 saves last.pt and the job fails
    with the time limit named (a job end), before Slurm's TIMEOUT kills anything."""
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with fresh_database("sqlite", tmp_path / "db") as url:
        s = Stack(url, tmp_path / "home")
        s.slurm = s.slurm.model_copy(update={"slurm_time_limit": "2", "slurm_signal_s": 80})
        try:
            _, token = make_user(s.sessions)
            with client(s.url, token) as c:
                job_id = submit(c, long_data, nodes=2, procs=1, epochs=50)
                s.run(job_id, "slurm")
                done = finished(c, job_id, timeout=300)
        finally:
            s.stop()
    assert done["status"] == "failed", done
    assert done["end_class"] == "job" and "time limit is near" in done["end_reason"], done
    assert done["cluster"]["state"] != "TIMEOUT", done
    assert (s.slurm.artifact_root / job_id / "run" / "weights" / "last.pt").is_file()
