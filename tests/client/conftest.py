"""Fixtures: a real API server (uvicorn thread, SQLite) and a worker thread that runs jobs
with the fake engine of tests/service/testkit.py (or the real engine, for slow tests)."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))

from testkit import ServerThread, fake_engine, fresh_database, make_user  # noqa: E402


class Stack:
    """The API on a port, its settings and sessions, and helpers to run and restart."""

    def __init__(self, settings, app, srv):
        self.settings, self.srv = settings, srv
        self.url, self.port = srv.url, srv.port
        self.sessions = app.state.sessions
        self.threads: list[threading.Thread] = []

    def token(self, admin: bool = False) -> str:
        return make_user(self.sessions, admin=admin)[1]

    def run_in_background(self, job_id: str, settings=None, **env: str) -> threading.Thread:
        """Play the worker: ``worker.runner.run_job`` in a thread. ``env`` sets the fake
        engine's knobs (``FAKE_EPOCH_S="0.5"``, ``FAKE_EXIT="3"``...)."""
        from worker.runner import run_job

        settings = settings or self.settings
        if env and settings.engine_command:
            cmd = ["env", *(f"{k}={v}" for k, v in env.items()), *settings.engine_command]
            settings = settings.model_copy(update={"engine_command": cmd})
        t = threading.Thread(target=run_job, args=(job_id,), daemon=True,
                             kwargs={"settings": settings, "sessions": self.sessions})
        t.start()
        self.threads.append(t)
        return t

    def restart(self, down_s: float = 0.5) -> None:
        """Stop the API (open streams are cut) and start a new one on the same port."""
        import time

        from service.app import create_app

        self.srv.stop()
        time.sleep(down_s)
        self.srv = ServerThread(create_app(self.settings), port=self.port).start()


@contextlib.contextmanager
def _stack(kind: str, tmp: Path) -> Iterator[Stack]:
    """The API on a fresh ``kind`` database (``sqlite`` or ``postgresql``), workers played
    by :meth:`Stack.run_in_background` with the fake engine."""
    from service.app import create_app
    from service.settings import Settings

    with fresh_database(kind, tmp) as url:
        settings = Settings(home=tmp / "home", database_url=url, broker_url="memory://",
                            engine_command=fake_engine(tmp), reaper_enabled=False,
                            sse_poll_s=0.05, sse_ping_s=5, lease_s=10, heartbeat_s=0.5,
                            poll_interval_s=0.05, grace_s=5,
                            credentials_path=tmp / "unused-credentials")
        app = create_app(settings)
        st = Stack(settings, app, ServerThread(app).start())
        try:
            yield st
        finally:
            for t in st.threads:
                t.join(30)
            st.srv.stop()


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    with _stack("sqlite", tmp_path_factory.mktemp("client")) as st:
        yield st


@pytest.fixture(scope="module")
def pg_stack(tmp_path_factory):
    """:func:`stack` on PostgreSQL (127.0.0.1:5432, a database of its own)."""
    with _stack("postgresql", tmp_path_factory.mktemp("client-pg")) as st:
        yield st


@pytest.fixture
def token(stack):
    return stack.token()


@pytest.fixture
def client(stack, token):
    from libreyolo_client import Client

    with Client(stack.url, token, backoff_s=0.1) as c:
        yield c


@pytest.fixture
def data_yaml(tmp_path):
    from testkit import write_data_yaml

    return str(write_data_yaml(tmp_path / "ds"))


@pytest.fixture
def real_stack(tmp_path):
    """API server on SQLite whose runner starts the real engine (``engine_command=None``);
    ``srv.settings`` and ``srv.sessions`` for :func:`worker.runner.run_job`."""
    from service.app import create_app
    from service.settings import Settings

    with fresh_database("sqlite", tmp_path) as url:
        settings = Settings(home=tmp_path / "home", database_url=url, broker_url="memory://",
                            reaper_enabled=False, sse_poll_s=0.1, lease_s=120, heartbeat_s=2,
                            poll_interval_s=0.2, engine_python=sys.executable)
        app = create_app(settings)
        srv = ServerThread(app).start()
        srv.settings, srv.sessions = settings, app.state.sessions
        yield srv
        srv.stop()
