"""Engine and session factory: SQLite in WAL mode with a busy timeout, or PostgreSQL."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

__all__ = ["make_engine", "make_session_factory"]


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine for ``url``.

    SQLite gets ``journal_mode=WAL`` (readers never block the writer), a 30 s busy timeout
    (the API, workers and reaper all write), ``synchronous=NORMAL`` and foreign keys on.
    PostgreSQL URLs use psycopg 3 (``postgresql+psycopg://``) with pre-ping.
    """
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False},
                               **kwargs)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(url, **kwargs)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Session factory; ``expire_on_commit=False`` so rows stay readable after commit."""
    return sessionmaker(bind=engine, expire_on_commit=False)
