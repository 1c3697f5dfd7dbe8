"""Run the Alembic migrations programmatically (`libreyolo-service db upgrade`)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

__all__ = ["alembic_config", "upgrade", "schema_problem"]

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(url: str) -> Config:
    """Alembic config pointing at our migrations folder and ``url`` (no alembic.ini)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Upgrade the database at ``url`` to ``revision`` (creates tables on a new database)."""
    if url.startswith("sqlite:///"):
        Path(url.split("sqlite:///", 1)[1]).parent.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(url), revision)


def schema_problem(url: str) -> str | None:
    """Why the database at ``url`` cannot serve the service as it is, or None when it is
    at the latest migration: it has no tables (never set up), or an older or unknown
    revision. Never creates anything (a missing SQLite file stays missing).

    Raises:
        sqlalchemy.exc.OperationalError: the database cannot be reached.
    """
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from sqlalchemy import create_engine

    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    if url.startswith("sqlite:///") and not Path(url.split("sqlite:///", 1)[1]).is_file():
        return "the file does not exist (never set up)"
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            current = MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
    if current == head:
        return None
    if current is None:
        return "it has no LibreYOLO tables (never set up)"
    return f"its schema is at migration {current}, not {head}: run `libreyolo-service db upgrade`"
