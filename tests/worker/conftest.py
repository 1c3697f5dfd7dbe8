"""Fixtures for the runner, reaper and worker tests (fake engine; real databases)."""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))

from testkit import fake_engine, fresh_database, pg_available  # noqa: E402

BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.skipif(
    not pg_available(), reason="PostgreSQL at 127.0.0.1:5432 not reachable"))]


@pytest.fixture(scope="session", params=BACKENDS)
def db_url(request, tmp_path_factory):
    with fresh_database(request.param, tmp_path_factory.mktemp(f"wdb-{request.param}")) as url:
        yield url


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory):
    with fresh_database("sqlite", tmp_path_factory.mktemp("wdb-sqlite-only")) as url:
        yield url


@pytest.fixture
def make_settings(tmp_path):
    from service.settings import Settings

    cmd = fake_engine(tmp_path)

    def make(db_url: str, **over):
        base = dict(home=tmp_path / "home", database_url=db_url, broker_url="memory://",
                    engine_command=cmd, lease_s=5, heartbeat_s=0.5, poll_interval_s=0.05,
                    grace_s=5, reaper_enabled=False)
        return Settings(**(base | over))

    return make


@pytest.fixture
def settings(make_settings, db_url):
    return make_settings(db_url)


@pytest.fixture
def sessions(settings):
    from service.db.session import make_engine, make_session_factory

    engine = make_engine(settings.database_url)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture
def new_queue(sessions):
    """``new_queue()``: a queue name of this test's own; at the end every job left in it
    is cancelled, so no later test (or reaper pass) meets it and no running job's lease
    expires under a later test's reaper."""
    from sqlalchemy import update

    from service.db.models import Job
    from service.lifecycle import TERMINAL

    made: list[str] = []

    def make() -> str:
        made.append(f"q-{secrets.token_hex(4)}")
        return made[-1]

    yield make
    with sessions() as s:
        s.execute(update(Job).where(Job.queue.in_(made), Job.status.not_in(TERMINAL))
                  .values(status="cancelled", lease_owner=None, lease_expires_at=None))
        s.commit()
