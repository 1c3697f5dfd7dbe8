"""Service latency: submit -> running, ``GET /v1/jobs/{id}`` under load, API memory.

Prints ONE line, e.g.::

    service_latency sqlite+sqla-broker: submit->running p50=180 p99=260 ms, GET c=32
    p50=40.1 p99=60.2 ms (1600 req), api_rss=95 MB | postgresql+redis: ...

For each backend (SQLite + the embedded kombu SQLAlchemy broker; PostgreSQL + Redis when
both are reachable) the real processes are started: ``libreyolo-service serve`` (API and
reaper) and ``python -m worker --cpu`` with a trivial engine (``engine_command = true``),
so the engine's start-up is not measured.

- submit -> running: ``--jobs`` jobs one after another on the idle worker; for each, from
  the ``POST /v1/jobs`` response to the job row's ``started_at`` (set by the worker's atomic
  claim; same host clock). The next job is sent once the previous one is terminal.
- GET: ``--requests`` ``GET /v1/jobs/{id}`` over ``--concurrency`` httpx async
  connections, after a warm-up; per-request latency.
- api_rss: resident memory of the serve process after start-up (psutil), before any load.

Goals: submit->running p50 < 300 ms, GET p99 < 20 ms, API RSS < 150 MB.

Usage: ``python bench/service_latency.py [--backends sqlite postgresql] [--jobs 20]
[--requests 1600] [--concurrency 32]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PG_ADMIN = os.environ.get("LIBREYOLO_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of values, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _wait(pred, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(interval)


def _pg_ok() -> bool:
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN, connect_timeout=3):
            return True
    except Exception:
        return False


@contextlib.contextmanager
def _database(kind: str, tmp: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{tmp / 'bench.db'}"
        return
    import psycopg

    name = f"lyb_{secrets.token_hex(6)}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + \
            f"/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def _broker(kind: str, tmp: Path) -> Iterator[str]:
    """Embedded SQLite broker for SQLite; a private redis-server for PostgreSQL."""
    if kind == "sqlite":
        yield f"sqla+sqlite:///{tmp / 'broker.db'}"
        return
    port = _free_port()
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

        _wait(up, 10, "redis-server")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait()


def _serve_argv(port: int) -> list[str]:
    exe = Path(sys.executable).with_name("libreyolo-service")
    head = [str(exe)] if exe.exists() else [sys.executable, "-m", "service.cli"]
    return head + ["serve", "--port", str(port)]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _get_load(url: str, token: str, job_id: str, n: int, conc: int) -> list[float]:
    import httpx

    lat: list[float] = []
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits,
                                 timeout=30) as c:
        async def one(k: int) -> None:
            for _ in range(k):
                t0 = time.perf_counter()
                r = await c.get(f"/v1/jobs/{job_id}")
                lat.append((time.perf_counter() - t0) * 1000)
                r.raise_for_status()

        await asyncio.gather(*(one(max(1, 64 // conc)) for _ in range(conc)))  # warm-up
        lat.clear()
        await asyncio.gather(*(one(n // conc) for _ in range(conc)))
    return lat


def run_backend(kind: str, jobs: int, requests: int, conc: int) -> str:
    """Start API + worker on one backend, measure, stop; returns the result fragment."""
    import httpx
    import psutil
    from sqlalchemy import select

    from service.db.models import Job
    from service.db.session import make_engine, make_session_factory
    from service.lifecycle import TERMINAL

    tmp = Path(tempfile.mkdtemp(prefix=f"bench-svc-{kind}-"))
    port = _free_port()
    with _database(kind, tmp) as db_url, _broker(kind, tmp) as broker_url:
        env = {**os.environ, "PYTHONPATH": str(REPO), "LIBREYOLO_HOME": str(tmp / "home"),
               "LIBREYOLO_DATABASE_URL": db_url, "LIBREYOLO_BROKER_URL": broker_url,
               "LIBREYOLO_ENGINE_COMMAND": json.dumps([shutil.which("true") or "/bin/true"]),
               "LIBREYOLO_CHECK_DATA_PATHS": "false"}
        token = subprocess.run(
            [sys.executable, "-m", "service.cli", "token", "create", "--name", "bench",
             "--admin"], env=env, cwd=tmp, capture_output=True, text=True, check=True,
        ).stdout.strip().splitlines()[-1]
        api = subprocess.Popen(_serve_argv(port), env=env, cwd=tmp, stdout=subprocess.DEVNULL,
                               stderr=open(tmp / "api.log", "wb"))
        worker = subprocess.Popen([sys.executable, "-m", "worker", "--cpu", "--loglevel",
                                   "WARNING"], env=env, cwd=tmp, stdout=subprocess.DEVNULL,
                                  stderr=open(tmp / "worker.log", "wb"))
        engine = make_engine(db_url)
        sessions = make_session_factory(engine)
        url = f"http://127.0.0.1:{port}"
        try:
            def healthy() -> bool:
                try:
                    return httpx.get(url + "/healthz", timeout=2).status_code == 200
                except httpx.HTTPError:
                    return False

            _wait(healthy, 60, "the API")
            time.sleep(1.0)  # settle: the reaper's first pass, lazy imports
            rss_mb = psutil.Process(api.pid).memory_info().rss / 2**20
            body = {"model": "yolo9-t", "data": str(tmp / "data.yaml"), "gpus": 0,
                    "params": {"epochs": 1, "imgsz": 64, "batch": 2}}
            lat: list[float] = []
            job_id = ""
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                              timeout=30) as c:
                for i in range(jobs + 1):  # the first one warms the worker up
                    r = c.post("/v1/jobs", json=body)
                    t_resp = time.time()
                    r.raise_for_status()
                    job_id = r.json()["id"]

                    def done(job_id: str = job_id) -> Job | None:
                        with sessions() as s:
                            job = s.scalar(select(Job).where(Job.id == job_id))
                            return job if job.status in TERMINAL else None

                    job = _wait(done, 120, f"job {job_id}", interval=0.01)
                    if i:
                        lat.append((job.started_at.timestamp() - t_resp) * 1000)
            get_lat = asyncio.run(_get_load(url, token, job_id, requests, conc))
        finally:
            _stop(worker)
            _stop(api)
            engine.dispose()
    shutil.rmtree(tmp, ignore_errors=True)
    broker = "sqla-broker" if kind == "sqlite" else "redis"
    return (f"{kind}+{broker}: submit->running p50={statistics.median(lat):.0f} "
            f"p99={_pct(lat, 0.99):.0f} ms, GET c={conc} p50={_pct(get_lat, 0.5):.1f} "
            f"p99={_pct(get_lat, 0.99):.1f} ms ({len(get_lat)} req), api_rss={rss_mb:.0f} MB")


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the result line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--requests", type=int, default=1600)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args(argv)
    parts = []
    for kind in args.backends:
        if kind == "postgresql" and not (_pg_ok() and shutil.which("redis-server")):
            parts.append("postgresql: skipped (PostgreSQL or redis-server missing)")
            continue
        parts.append(run_backend(kind, args.jobs, args.requests, args.concurrency))
    print("service_latency " + " | ".join(parts)
          + " (goals: submit->running p50<300 ms, GET p99<20 ms, api_rss<150 MB)", flush=True)


if __name__ == "__main__":
    main()
