"""Fixtures: a migrated database per backend (SQLite file, fresh PostgreSQL database) and
a real uvicorn server on it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from testkit import ServerThread, fresh_database, pg_available  # noqa: E402

BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.skipif(
    not pg_available(), reason="PostgreSQL at 127.0.0.1:5432 not reachable"))]


@pytest.fixture(scope="session", params=BACKENDS)
def db_url(request, tmp_path_factory):
    """URL of a migrated database (each backend once per test session)."""
    with fresh_database(request.param, tmp_path_factory.mktemp(f"db-{request.param}")) as url:
        yield url


@pytest.fixture(scope="session")
def api_settings(db_url, tmp_path_factory):
    from service.settings import Settings

    home = tmp_path_factory.mktemp("home")
    return Settings(home=home, database_url=db_url, broker_url="memory://",
                    reaper_enabled=False, sse_poll_s=0.05, sse_ping_s=5)


@pytest.fixture(scope="session")
def server(api_settings):
    """A real API server (uvicorn thread) on the backend's database."""
    from service.app import create_app

    app = create_app(api_settings)
    srv = ServerThread(app).start()
    srv.app = app
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def sessions(server):
    return server.app.state.sessions


@pytest.fixture
def data_yaml(tmp_path):
    from testkit import write_data_yaml

    return str(write_data_yaml(tmp_path / "ds"))
