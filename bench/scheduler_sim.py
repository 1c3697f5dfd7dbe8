"""Scheduler simulation: the real API, the real PostgreSQL and the real claim code, with many
simulated workers and a trivial engine.

Prints a table, then ONE line, e.g.::

    scheduler_sim load=3.0 jobs=1000 users=20 workers=50: submit 95 jobs/s, claims 41/s
    (claim() p50=120 p99=900 ms), queued->running p50=8.1 p99=20.3 s, longest wait 21.0 s,
    Jain running share 0.97, makespan 25 s

- ``serve`` (one API process, its reaper) on a fresh PostgreSQL database; ``--users``
  users submit ``--jobs`` jobs through ``POST /v1/jobs`` (8 clients at once, all up front):
  a quarter of the users submit half of the jobs (heavy users), the rest share the other
  half.
- ``--workers`` simulated workers: ``--procs`` processes of threads, each calling
  :func:`service.scheduler.claim` on queue ``gpu-1`` (the same call a woken Celery worker
  makes), "running" the job for a uniform ``--min-s``..``--max-s`` seconds, then marking it
  succeeded (:func:`service.ops.transition`). An idle worker calls ``claim`` again after
  ``--idle-s`` (a real worker is woken by a message instead). The per-user cap is the
  default (``max_running_per_user`` = 4).
- ``--two-node`` of the jobs (default 0.2) are 2-node jobs: a worker the scheduler sends
  to one takes a node slot (:mod:`service.gang`) and waits for the gang
  (:func:`service.gang.gather_step` every 50 ms, as a real worker waits, at most
  ``gang_wait_s`` = 30 s, then releases the slot); node 0 "runs" and finishes the job, the
  other node waits until it ends. A job's duration is drawn from its id, so both nodes
  agree. Fairness counts a 2-node job as two running slots of its owner.

Reported, from the job rows: claims/s (claims over the time from the first start to the
last), the time spent inside ``claim()`` (p50, p99), queued -> running (``started_at -
enqueued_at``: p50, p99, the longest), and fairness: Jain's index
``(sum x)^2 / (n * sum x^2)`` of the running jobs per user ``x`` over the users with work
left (queued or running), sampled every 0.1 s while some job waits, averaged. 1.0: every
user with work runs as many jobs as the others.

Then, to see how a claim's cost grows with the queue (the simulation's queue is at most
``--jobs`` long): ``claim()`` with one claimer and no contention on queues of ``--solo``
sizes (default 1,000, 10,000 and 100,000 jobs inserted straight into the database),
the median of 20 claims each (5 above 10,000).

Usage: ``python bench/scheduler_sim.py [--jobs 1000] [--users 20] [--workers 50]
[--procs 4] [--min-s 0.5] [--max-s 1.5] [--solo 1000 10000 100000]``
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _service import free_port, pct, pg_ok, scratch_database, stop_process, wait_until  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _worker_proc(db_url: str, names: list[str], total: int, min_s: float, max_s: float,
                 idle_s: float, out: mp.Queue) -> None:
    """Simulated workers ``names`` (threads of this process) until ``total`` jobs are done;
    puts the list of claim() durations (s) on ``out``."""
    from sqlalchemy import func, select

    from service.db.models import Job, utcnow
    from service.db.session import make_engine, make_session_factory
    from service.gang import NodeAddress, gather_step
    from service.lifecycle import FINISH, TERMINAL, JobStatus
    from service.ops import transition
    from service.scheduler import claim, owner_cap
    from service.settings import Settings

    settings = Settings(database_url=db_url, broker_url="memory://", gang_wait_s=30)
    where = NodeAddress("sim", "127.0.0.1", 29500)
    engine = make_engine(db_url, pool_size=len(names) + 1, max_overflow=0)
    sessions = make_session_factory(engine)
    spans: list[float] = []

    def done() -> bool:
        with sessions() as s:
            return s.scalar(select(func.count()).where(Job.status == "succeeded")) >= total

    def gathered(got, name: str) -> bool:
        deadline = time.monotonic() + settings.gang_wait_s
        while time.monotonic() < deadline:
            with sessions() as s:
                owner = s.scalar(select(Job.owner_id).where(Job.id == got.job_id))
                state, _ = gather_step(s, got, worker_id=name, lease_s=settings.lease_s,
                                       cap=owner_cap(s, owner, settings))
            if state != "waiting":
                return state == "running"
            time.sleep(0.05)
        return False  # the slot's lease lapses; the next claim frees it

    def work(name: str) -> None:
        while True:
            t0 = time.perf_counter()
            with sessions() as s:
                got = claim(s, "gpu-1", name, settings, where=where)
                job_id = None if got is None else got.job_id
            spans.append(time.perf_counter() - t0)
            if got is None:
                if done():
                    return
                time.sleep(idle_s)
                continue
            if not got.started and not gathered(got, name):
                continue
            time.sleep(random.Random(job_id).uniform(min_s, max_s))
            if got.node_rank:  # not node 0: wait for node 0 to end the job
                while True:
                    with sessions() as s:
                        if s.scalar(select(Job.status).where(Job.id == job_id)) in TERMINAL:
                            break
                    time.sleep(0.05)
                continue
            with sessions() as s:
                transition(s, job_id, FINISH, JobStatus.SUCCEEDED, finished_at=utcnow(),
                           lease_owner=None, lease_expires_at=None)
                s.commit()

    with ThreadPoolExecutor(len(names)) as pool:
        list(pool.map(work, names))
    engine.dispose()
    out.put(spans)


def _submit_all(url: str, tokens: list[str], plan: list[int], nodes: list[int]) -> float:
    """POST every job of ``plan`` (user index per job; ``nodes`` per job) through the API;
    returns jobs/s."""
    import httpx

    body = {"model": "yolo9-t", "data": "/data/sim.yaml", "gpus": 1, "params": {"epochs": 1}}
    clients = [httpx.Client(base_url=url, headers={"Authorization": f"Bearer {t}"}, timeout=60)
               for t in tokens]
    def post(i: int) -> None:
        for attempt in range(3):  # a keep-alive connection the server just closed: retry
            try:
                r = clients[plan[i]].post("/v1/jobs", json=body | {"nodes": nodes[i]},
                                          headers={"Idempotency-Key": f"sim-{i}"})
                r.raise_for_status()
                return
            except httpx.TransportError:
                if attempt == 2:
                    raise

    try:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(post, range(len(plan))))
        return len(plan) / (time.perf_counter() - t0)
    finally:
        for c in clients:
            c.close()


def _jain(values: list[int]) -> float:
    s, s2 = sum(values), sum(v * v for v in values)
    return 1.0 if s2 == 0 else s * s / (len(values) * s2)


def _fairness(rows: list, step: float = 0.1) -> tuple[float, float]:
    """Mean Jain's index of running jobs per user with work left, sampled every ``step`` s
    while a job waits; and the mean number of users with work left then."""
    t_start = min(r.started_at for r in rows).timestamp()
    t_end = max(r.started_at for r in rows).timestamp()  # after this nothing waits
    idx, users = [], []
    t = t_start
    while t < t_end:
        running: dict[str, int] = {}
        left: set[str] = set()
        for r in rows:
            q, s, f = r.enqueued_at.timestamp(), r.started_at.timestamp(), r.finished_at.timestamp()
            if q <= t < f:
                left.add(r.owner_id)
            if s <= t < f:
                running[r.owner_id] = running.get(r.owner_id, 0) + r.nodes
        if left:
            idx.append(_jain([running.get(u, 0) for u in left]))
            users.append(len(left))
        t += step
    return statistics.mean(idx), statistics.mean(users)


def solo_claims(db_url: str, sizes: list[int], users: int, n: int = 20) -> list[tuple[int, float]]:
    """``claim()`` with ONE claimer (no contention) on a queue of each size in ``sizes``
    (jobs inserted straight into the database, spread over ``users`` owners): the median
    seconds of ``n`` claims, per size. Shows how a claim's cost grows with the queue."""
    from sqlalchemy import insert

    from service.db.models import Job, new_id, utcnow
    from service.db.session import make_engine, make_session_factory
    from service.lifecycle import FINISH, JobStatus
    from service.ops import transition
    from service.scheduler import claim
    from service.settings import Settings
    from service.users import create_user_token

    settings = Settings(database_url=db_url, broker_url="memory://", max_running_per_user=0)
    engine = make_engine(db_url)
    sessions = make_session_factory(engine)
    with sessions() as s:
        owners = [create_user_token(s, name=f"solo-{i:03d}")[0].id for i in range(users)]
        s.commit()
    out, have = [], 0
    for size in sorted(sizes):
        now = utcnow()
        with sessions() as s:
            s.execute(insert(Job), [dict(
                id=new_id("j"), owner_id=owners[i % users], kind="train", model="yolo9-t",
                data="/d.yaml", params={}, gpus=1, procs=1, priority=0, queue="solo",
                status="queued", attempt=0, max_attempts=3, cancel_requested=False,
                event_seq=0, events_offset=0, log_offset=0, created_at=now, enqueued_at=now)
                for i in range(size - have)])
            s.commit()
        spans = []
        for _ in range(n if size <= 10_000 else max(3, n // 4)):
            t0 = time.perf_counter()
            with sessions() as s:
                got = claim(s, "solo", "solo-worker", settings)
                job_id = None if got is None else got.job_id
            spans.append(time.perf_counter() - t0)
            with sessions() as s:  # finished at once: the owner's running count stays 0
                transition(s, job_id, FINISH, JobStatus.SUCCEEDED, finished_at=utcnow())
                s.commit()
        have = size - n
        out.append((size, statistics.median(spans)))
    engine.dispose()
    return out


def main(argv: list[str] | None = None) -> None:
    """Run the simulation; print the table and the result line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--workers", type=int, default=50)
    parser.add_argument("--procs", type=int, default=4, help="processes the workers run in")
    parser.add_argument("--min-s", type=float, default=0.5)
    parser.add_argument("--max-s", type=float, default=1.5)
    parser.add_argument("--idle-s", type=float, default=0.2)
    parser.add_argument("--two-node", type=float, default=0.2,
                        help="fraction of the jobs that are 2-node jobs")
    parser.add_argument("--solo", nargs="*", type=int, default=[1000, 10000, 100000],
                        help="queue sizes of the one-claimer claim() cost (none: skip)")
    args = parser.parse_args(argv)
    if not pg_ok():
        print("scheduler_sim: skipped (PostgreSQL not reachable)")
        return
    import httpx
    from sqlalchemy import select

    from service.db.migrate import upgrade
    from service.db.models import Job
    from service.db.session import make_engine, make_session_factory
    from service.users import create_user_token

    load0 = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="bench-sim-"))
    rng = random.Random(0)
    heavy = max(1, args.users // 4)
    plan = [rng.randrange(heavy) for _ in range(args.jobs // 2)] + \
        [rng.randrange(heavy, args.users) for _ in range(args.jobs - args.jobs // 2)]
    rng.shuffle(plan)
    nodes = [2 if rng.random() < args.two_node else 1 for _ in plan]
    solo = ""
    if args.solo:
        with scratch_database("postgresql", tmp) as db_url:
            upgrade(db_url)
            solo = ", one claimer: claim() " + ", ".join(
                f"{t * 1000:.0f} ms at {size} queued" for size, t in
                solo_claims(db_url, args.solo, args.users))
    with scratch_database("postgresql", tmp) as db_url:
        upgrade(db_url)
        engine = make_engine(db_url)
        sessions = make_session_factory(engine)
        tokens = []
        with sessions() as s:
            for i in range(args.users):
                tokens.append(create_user_token(s, name=f"sim-user-{i:02d}")[1])
            s.commit()
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "PYTHONPATH": str(REPO), "LIBREYOLO_HOME": str(tmp / "home"),
               "LIBREYOLO_DATABASE_URL": db_url, "LIBREYOLO_BROKER_URL": "memory://",
               "LIBREYOLO_CHECK_DATA_PATHS": "false"}
        api = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(port)],
                               env=env, cwd=tmp, stdout=subprocess.DEVNULL,
                               stderr=open(tmp / "api.log", "wb"))  # noqa: SIM115 - the child writes it until killed
        procs: list[mp.Process] = []
        try:
            def healthy() -> bool:
                try:
                    return httpx.get(url + "/healthz", timeout=2).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_until(healthy, 90, "the API")
            ctx = mp.get_context("spawn")
            out = ctx.Queue()
            names = [f"sim-w{i:03d}" for i in range(args.workers)]
            groups = [names[i::args.procs] for i in range(args.procs)]
            procs = [ctx.Process(target=_worker_proc, args=(db_url, g, args.jobs, args.min_s,
                                                           args.max_s, args.idle_s, out))
                     for g in groups if g]
            for p in procs:
                p.start()
            submit_rate = _submit_all(url, tokens, plan, nodes)
            spans = [s for _ in procs for s in out.get(timeout=1800)]
            for p in procs:
                p.join(60)
            with sessions() as s:
                rows = s.execute(select(Job.owner_id, Job.enqueued_at, Job.started_at,
                                        Job.finished_at, Job.nodes)
                                 .where(Job.status == "succeeded")).all()
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
            stop_process(api)
            engine.dispose()
    shutil.rmtree(tmp, ignore_errors=True)
    waits = [(r.started_at - r.enqueued_at).total_seconds() for r in rows]
    starts = sorted(r.started_at.timestamp() for r in rows)
    makespan = max(r.finished_at.timestamp() for r in rows) - min(r.enqueued_at.timestamp()
                                                                  for r in rows)
    claims_s = (len(starts) - 1) / max(1e-9, starts[-1] - starts[0])
    jain, active = _fairness(rows)
    ideal = sum(nodes) * (args.min_s + args.max_s) / 2 / args.workers
    waits2 = [(r.started_at - r.enqueued_at).total_seconds() for r in rows if r.nodes > 1]
    print(f"{'jobs':>6} {'users':>5} {'workers':>7} {'claims/s':>8} {'claim p50/p99 ms':>17} "
          f"{'wait p50/p99 s':>15} {'max wait s':>10} {'jain':>5} {'makespan s':>10} {'ideal s':>7}")
    print(f"{len(rows):6} {args.users:5} {args.workers:7} {claims_s:8.1f} "
          f"{pct(spans, 0.5) * 1000:8.0f}/{pct(spans, 0.99) * 1000:<8.0f} "
          f"{pct(waits, 0.5):7.1f}/{pct(waits, 0.99):<7.1f} {max(waits):10.1f} {jain:5.2f} "
          f"{makespan:10.1f} {ideal:7.1f}")
    print(f"scheduler_sim load={load0:.1f}/{os.getloadavg()[0]:.1f} (1-min, 2 cores) "
          f"jobs={len(rows)} ({sum(n > 1 for n in nodes)} 2-node) users={args.users} "
          f"workers={args.workers}: "
          f"submit {submit_rate:.0f} jobs/s, claims {claims_s:.1f}/s (claim() p50="
          f"{pct(spans, 0.5) * 1000:.0f} p99={pct(spans, 0.99) * 1000:.0f} ms), queued->running "
          f"p50={pct(waits, 0.5):.1f} p99={pct(waits, 0.99):.1f} s, longest wait "
          f"{max(waits):.1f} s (2-node jobs: p50={pct(waits2, 0.5) if waits2 else 0:.1f} "
          f"p99={pct(waits2, 0.99) if waits2 else 0:.1f} s), Jain running share {jain:.2f} over {active:.1f} users with work, "
          f"makespan {makespan:.0f} s (ideal {ideal:.0f} s: node slots x mean duration / workers)"
          + solo, flush=True)


if __name__ == "__main__":
    main()
