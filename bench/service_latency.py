"""Service latency: submit -> running, the hot reads under load, idle SSE streams, API memory.

Prints a table, then ONE line, e.g.::

    service_latency load=3.1/2.8 | sqlite p=1: submit->running p50=180 p99=260 ms,
    job c1 cpu=1.9 ms p50=2.4 p99=4.0 | job c32 cpu=1.7 ms 410 req/s p50=70 p99=95 | ...
    sse500 idle_cpu=0.4% fanout p50=120 max=300 ms, api_rss=95 MB | ...

For each backend (SQLite + the embedded kombu SQLAlchemy broker; PostgreSQL + Redis when
both are reachable) and each API process count (``--procs``, ``serve --workers N``) the
real processes are started: ``libreyolo-service serve`` (API and reaper) and
``python -m worker --cpu`` with a trivial engine (``engine_command = true``), so the
engine's start-up is not measured.

- submit -> running (first process count only): ``--jobs`` jobs one after another on the
  idle worker; for each, from the ``POST /v1/jobs`` response to the job row's
  ``started_at`` (set by the worker's atomic claim; same host clock).
- hot reads: ``--queued`` jobs are queued (in ``gpu-1``, which no worker serves) so the
  read job's queue position is a real computation; then ``GET /v1/jobs/{id}`` (a queued
  job), ``GET /v1/jobs`` (50 jobs a page) and ``GET /v1/jobs/{id}/events`` (50 events), each
  at concurrency 1 (``--requests``/4 requests) and ``--concurrency`` (``--requests``), over
  keep-alive connections (``http.client``, one thread each) after a warm-up; ``floor``
  is ``GET /healthz`` (a route that returns a constant) measured the same way: what
  uvicorn, FastAPI and the load generator cost on this machine without the service's
  work. ``cpu`` is the CPU time (user + system) of every API process during the measured
  part divided by the requests: what one request costs the server, which the other work
  on the machine affects less than the latency. At concurrency C a closed loop holds
  p50 near C / throughput, whatever the server does.
- SSE: ``--streams`` streams held open on 10 running jobs. ``idle_cpu``: the API
  processes' CPU over 5 s while no event comes (% of one core); ``fanout``: one event
  written to each of the 10 jobs in one commit, the time until each stream has it
  (p50 and the last stream).
- api_rss: resident memory of the API processes after start-up (psutil), before any load.

``load`` is the 1-minute load average (``uptime``) at the start and the end: the machine
is shared, so read latencies next to it; the CPU per request and the ratios measured in
the same run move less.

Goals: submit->running p50 < 300 ms, GET p99 < 20 ms at concurrency 32, ~1 ms CPU per
hot read, idle streams cost no CPU, API RSS < 150 MB.

Usage: ``python bench/service_latency.py [--backends sqlite postgresql] [--procs 1 2]
[--jobs 20] [--requests 1600] [--concurrency 32] [--queued 1000] [--streams 500]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _service import free_port, pct, pg_ok, scratch_database, stop_process, wait_until  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

@contextlib.contextmanager
def _broker(kind: str, tmp: Path) -> Iterator[str]:
    """Embedded SQLite broker for SQLite; a private redis-server for PostgreSQL."""
    if kind == "sqlite":
        yield f"sqla+sqlite:///{tmp / 'broker.db'}"
        return
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", str(tmp)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import redis

        def up() -> bool:
            try:
                return bool(redis.Redis(port=port, socket_timeout=1).ping())
            except redis.RedisError:
                return False

        wait_until(up, 10, "redis-server")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait()


def _serve_argv(port: int, procs: int) -> list[str]:
    exe = Path(sys.executable).with_name("libreyolo-service")
    head = [str(exe)] if exe.exists() else [sys.executable, "-m", "service.cli"]
    return head + ["serve", "--port", str(port)] + (["--workers", str(procs)] if procs > 1 else [])


def _row(table: list[str], row: str) -> None:
    """Add a table row and print it at once (a later failure keeps what was measured)."""
    table.append(row)
    print(row, flush=True)


def _api_procs(api: subprocess.Popen) -> list:
    """The serve process and its children (uvicorn's supervisor and its API processes)."""
    import psutil

    root = psutil.Process(api.pid)
    return [root, *root.children(recursive=True)]


def _cpu_s(procs: list) -> float:
    """User + system CPU seconds of ``procs`` so far."""
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except Exception:  # a process that ended
            pass
    return total


def _get_load(url: str, token: str, path: str, n: int, conc: int,
              procs: list) -> tuple[list[float], float, float]:
    """``n`` GETs of ``path`` over ``conc`` keep-alive connections (one thread and one
    ``http.client`` connection each) after a warm-up; returns the latencies (ms), the
    wall time of the measured part (s) and the CPU seconds ``procs`` used meanwhile.

    Not httpx: on this machine one asyncio httpx client drove at most ~130 requests/s at
    32 connections and added ~3.5 ms to each request at 1, whatever the server (a route
    returning a constant had p99 ~1.3 s at 32 connections): the benchmark measured its
    client. ``http.client`` costs ~0.5 ms of CPU a request."""
    import http.client
    import threading
    from urllib.parse import urlsplit

    where = urlsplit(url)
    headers = {"Authorization": f"Bearer {token}"}
    lat: list[float] = []
    failed: list[str] = []
    start = threading.Barrier(conc + 1, timeout=120)

    def one(k: int) -> None:
        conn = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port, timeout=60)

        def get() -> float:
            t0 = time.perf_counter()
            conn.request("GET", path, headers=headers)
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                failed.append(f"GET {path}: {r.status}")
            return (time.perf_counter() - t0) * 1000

        try:
            for _ in range(max(2, 64 // conc)):  # warm-up
                get()
            start.wait()
            mine = [get() for _ in range(k)]
            lat.extend(mine)
        finally:
            conn.close()

    threads = [threading.Thread(target=one, args=(max(1, n // conc),)) for _ in range(conc)]
    for t in threads:
        t.start()
    start.wait()
    t0, c0 = time.perf_counter(), _cpu_s(procs)
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - t0, _cpu_s(procs) - c0
    if failed or len(lat) < conc * max(1, n // conc):
        raise SystemExit(f"GET {path}: {len(failed)} failed requests {failed[:1]}, "
                         f"{len(lat)} answered")
    return lat, wall, cpu


def _seed(sessions, owner_id: str, queued: int, streams_jobs: int) -> tuple[str, list[str]]:
    """``queued`` queued gpu-1 jobs (the read job is the last: 50 log events) and
    ``streams_jobs`` running cpu jobs with a lease far ahead (one event each); returns
    (read job, running jobs)."""
    from datetime import timedelta

    from service.db.models import Job, utcnow
    from service.ops import append_events

    now = utcnow()
    row = dict(owner_id=owner_id, kind="train", model="yolo9-t", data="/data/x.yaml",
               params={"epochs": 1}, gpus=1, procs=1, priority=0, queue="gpu-1",
               status="queued", attempt=0, max_attempts=3, cancel_requested=False,
               event_seq=0, events_offset=0, log_offset=0, created_at=now, enqueued_at=now)
    status = ("status", time.time(), {"event": "status", "status": "queued"})
    ids: list[str] = []
    with sessions() as s:
        for _ in range(queued):
            job = Job(**row)
            s.add(job)
            s.flush()
            append_events(s, job.id, [status])
            ids.append(job.id)
        append_events(s, ids[-1], [("log", time.time(), {"lines": [f"line {i}" for i in range(8)]})
                                   for _ in range(50)])
        running = []
        for _ in range(streams_jobs):
            job = Job(**{**row, "queue": "cpu", "gpus": 0, "status": "running", "attempt": 1,
                         "lease_owner": "bench", "started_at": now,
                         "lease_expires_at": now + timedelta(hours=1)})
            s.add(job)
            s.flush()
            append_events(s, job.id, [status])
            running.append(job.id)
        s.commit()
    return ids[-1], running


async def _sse(url: str, token: str, jobs: list[str], n: int, procs: list, sessions) -> tuple[float, list[float]]:
    """Hold ``n`` streams on ``jobs``; returns (idle CPU % of one core, fan-out ms)."""
    import httpx

    from service.ops import append_events

    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    arrived: list[float] = []
    caught_up = [0]
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits,
                                 timeout=httpx.Timeout(120, read=None)) as c:
        async def follow(job_id: str) -> None:
            async with c.stream("GET", f"/v1/jobs/{job_id}/events/stream") as r:
                r.raise_for_status()
                async for line in r.aiter_lines():
                    if line.startswith("id: 1"):
                        caught_up[0] += 1 if line == "id: 1" else 0
                    elif line == "id: 2":
                        arrived.append(time.perf_counter())
                        return

        tasks = [asyncio.create_task(follow(jobs[i % len(jobs)])) for i in range(n)]
        deadline = time.monotonic() + 180
        while caught_up[0] < n:
            if time.monotonic() > deadline or any(t.done() for t in tasks):
                raise SystemExit(f"only {caught_up[0]} of {n} SSE streams opened")
            await asyncio.sleep(0.1)
        await asyncio.sleep(2.0)
        c0, t0 = _cpu_s(procs), time.perf_counter()
        await asyncio.sleep(5.0)
        idle = 100 * (_cpu_s(procs) - c0) / (time.perf_counter() - t0)

        def write() -> float:
            with sessions() as s:
                for job_id in jobs:
                    append_events(s, job_id, [("metric", time.time(), {"event": "progress"})])
                s.commit()
            return time.perf_counter()

        sent = await asyncio.to_thread(write)
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
    return idle, [(t - sent) * 1000 for t in arrived]


def run_backend(kind: str, procs_list: list[int], jobs: int, requests: int, conc: int,
                queued: int, streams: int, table: list[str],
                reads_wanted: tuple[str, ...] = ("floor", "job", "list", "events")) -> str:
    """Start API + worker on one backend for each process count, measure, stop; returns
    the result fragment (and appends rows to ``table``)."""
    import httpx
    from sqlalchemy import select

    from service.db.models import Job, User
    from service.db.session import make_engine, make_session_factory
    from service.lifecycle import TERMINAL

    tmp = Path(tempfile.mkdtemp(prefix=f"bench-svc-{kind}-"))
    parts: list[str] = []
    with scratch_database(kind, tmp) as db_url, _broker(kind, tmp) as broker_url:
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "PYTHONPATH": path, "LIBREYOLO_HOME": str(tmp / "home"),
               "LIBREYOLO_DATABASE_URL": db_url, "LIBREYOLO_BROKER_URL": broker_url,
               "LIBREYOLO_ENGINE_COMMAND": json.dumps([shutil.which("true") or "/bin/true"]),
               "LIBREYOLO_CHECK_DATA_PATHS": "false"}
        token = subprocess.run(
            [sys.executable, "-m", "service.cli", "token", "create", "--name", "bench",
             "--admin"], env=env, cwd=tmp, capture_output=True, text=True, check=True,
        ).stdout.strip().splitlines()[-1]
        engine = make_engine(db_url)
        sessions = make_session_factory(engine)
        worker = subprocess.Popen([sys.executable, "-m", "worker", "--cpu", "--loglevel",
                                   "WARNING"], env=env, cwd=tmp, stdout=subprocess.DEVNULL,
                                  stderr=open(tmp / "worker.log", "wb"))  # noqa: SIM115 - the child writes it until killed
        read_job = ""
        try:
            for n_procs in procs_list:
                port = free_port()
                url = f"http://127.0.0.1:{port}"
                api = subprocess.Popen(_serve_argv(port, n_procs), env=env, cwd=tmp,
                                       stdout=subprocess.DEVNULL,
                                       stderr=open(tmp / f"api{n_procs}.log", "wb"))  # noqa: SIM115 - as above
                try:
                    def healthy(url: str = url) -> bool:
                        try:
                            return httpx.get(url + "/healthz", timeout=2).status_code == 200
                        except httpx.HTTPError:
                            return False

                    wait_until(healthy, 90, "the API")
                    time.sleep(1.5)  # settle: the reaper's first pass, lazy imports
                    procs = _api_procs(api)
                    rss_mb = sum(p.memory_info().rss for p in procs[1 if n_procs > 1 else 0:]) / 2**20
                    head = f"{kind} p={n_procs}:"
                    with sessions() as s:
                        owner = s.scalars(select(User.id).where(User.name == "bench")).one()
                    if not read_job:
                        head += _submit_to_running(url, token, tmp, sessions, jobs, TERMINAL, Job)
                        read_job, _ = _seed(sessions, owner, queued, 0)
                    _, running = _seed(sessions, owner, 1, 10)  # fresh streams' jobs each run
                    reads = []
                    paths = {"floor": "/healthz", "job": f"/v1/jobs/{read_job}", "list": "/v1/jobs",
                             "events": f"/v1/jobs/{read_job}/events?limit=50"}
                    for name in reads_wanted:
                        path = paths[name]
                        for c in (1, conc):
                            n = requests // 4 if c == 1 else requests
                            lat, wall, cpu = _get_load(url, token, path, n, c, procs)
                            cpu_ms = cpu / len(lat) * 1000
                            rps = len(lat) / wall
                            _row(table, f"{kind:10} {n_procs:5} {name:7} {c:4} {cpu_ms:8.2f} "
                                         f"{rps:8.0f} {pct(lat, 0.5):8.1f} {pct(lat, 0.99):8.1f}")
                            reads.append(f"{name} c{c} cpu={cpu_ms:.1f} ms {rps:.0f} req/s "
                                         f"p50={pct(lat, 0.5):.1f} p99={pct(lat, 0.99):.1f}")
                    sse = ""
                    if streams:
                        idle, fan = asyncio.run(_sse(url, token, running, streams, procs, sessions))
                        sse = (f"; sse{streams} idle_cpu={idle:.2f}% fanout p50={pct(fan, 0.5):.0f} "
                               f"max={max(fan):.0f} ms")
                        _row(table, f"{kind:10} {n_procs:5} sse{streams}: idle API CPU {idle:.2f}% "
                                     f"of a core; event to all streams p50={pct(fan, 0.5):.0f} "
                                     f"max={max(fan):.0f} ms")
                    parts.append(f"{head} " + "; ".join(reads) + sse + f", api_rss={rss_mb:.0f} MB")
                except BaseException:
                    log = (tmp / f"api{n_procs}.log").read_text(errors="replace")
                    print(f"API log (tail):\n{log[-8000:]}", file=sys.stderr)
                    raise
                finally:
                    stop_process(api)
        finally:
            stop_process(worker)
            engine.dispose()
    shutil.rmtree(tmp, ignore_errors=True)
    return " | ".join(parts)


def _submit_to_running(url: str, token: str, tmp: Path, sessions, jobs: int, terminal, job_cls) -> str:
    """Submit ``jobs`` jobs one after another; the submit -> running fragment."""
    import httpx
    from sqlalchemy import select

    body = {"model": "yolo9-t", "data": str(tmp / "data.yaml"), "gpus": 0,
            "params": {"epochs": 1, "imgsz": 64, "batch": 2}}
    lat: list[float] = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                      timeout=30) as c:
        for i in range(jobs + 1):  # the first one warms the worker up
            r = c.post("/v1/jobs", json=body)
            t_resp = time.time()
            r.raise_for_status()
            job_id = r.json()["id"]

            def done(job_id: str = job_id):
                with sessions() as s:
                    job = s.scalar(select(job_cls).where(job_cls.id == job_id))
                    return job if job.status in terminal else None

            job = wait_until(done, 120, f"job {job_id}", interval=0.01)
            if i:
                lat.append((job.started_at.timestamp() - t_resp) * 1000)
    return (f" submit->running p50={statistics.median(lat):.0f} p99={pct(lat, 0.99):.0f} ms;")


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; print the table and the result line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument("--procs", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--requests", type=int, default=1600)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--queued", type=int, default=1000)
    parser.add_argument("--streams", type=int, default=500, help="0: no SSE part")
    parser.add_argument("--reads", nargs="+", default=["floor", "job", "list", "events"],
                        choices=["floor", "job", "list", "events"],
                        help="floor: GET /healthz, the cost without the service's work")
    args = parser.parse_args(argv)
    load0 = os.getloadavg()[0]
    table: list[str] = []
    _row(table, f"{'backend':10} {'procs':5} {'read':7} {'conc':>4} {'cpu_ms':>8} {'req/s':>8} "
             f"{'p50_ms':>8} {'p99_ms':>8}")
    parts = []
    for kind in args.backends:
        if kind == "postgresql" and not (pg_ok() and shutil.which("redis-server")):
            parts.append("postgresql: skipped (PostgreSQL or redis-server missing)")
            continue
        parts.append(run_backend(kind, args.procs, args.jobs, args.requests, args.concurrency,
                                 args.queued, args.streams, table, tuple(args.reads)))
    print(f"service_latency load={load0:.1f}/{os.getloadavg()[0]:.1f} (1-min, 2 cores) | "
          + " | ".join(parts)
          + " (goals: submit->running p50<300 ms, GET p99<20 ms at c=32, ~1 ms CPU a read, "
            "api_rss<150 MB)", flush=True)


if __name__ == "__main__":
    main()
