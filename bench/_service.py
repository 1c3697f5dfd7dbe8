"""Shared helpers of the service benchmarks (service_latency.py, scheduler_sim.py): free
ports, percentiles, waiting, a scratch database, stopping a process."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["PG_ADMIN", "free_port", "pct", "wait_until", "pg_ok", "scratch_database",
           "stop_process"]

PG_ADMIN = os.environ.get("LIBREYOLO_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of values, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def wait_until(pred, timeout: float, what: str, interval: float = 0.05):
    """``pred()``'s first truthy value, polled every ``interval`` s; SystemExit naming
    ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(interval)


def pg_ok() -> bool:
    """True when PostgreSQL at ``PG_ADMIN`` ($LIBREYOLO_TEST_PG) answers."""
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN, connect_timeout=3):
            return True
    except Exception:
        return False


@contextlib.contextmanager
def scratch_database(kind: str, tmp: Path) -> Iterator[str]:
    """URL of a new empty database: a SQLite file under ``tmp``, or a PostgreSQL database
    dropped on exit (``kind`` ``sqlite`` or ``postgresql``)."""
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


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 20 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


