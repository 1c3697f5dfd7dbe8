"""The database an admin command (``token create``, ``users list|cap``) works on.

An admin command never creates a service database as a side effect: it opens the one
the settings name, says which (on stderr, so that a printed token stays alone on
stdout), and when there is none it says where it looked and how to point it at the
service's state (``--home``, ``LIBREYOLO_HOME``, ``LIBREYOLO_DATABASE_URL``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from service.settings import Settings

__all__ = ["HomeOption", "admin_settings", "require_database", "where_from"]

#: ``--home PATH`` of the admin commands: the service's state folder (LIBREYOLO_HOME).
HomeOption = Annotated[Path | None, typer.Option(
    "--home", help="the service's state folder (default: LIBREYOLO_HOME, else ./.libreyolo)",
    show_default=False)]


def admin_settings(home: Path | None) -> Settings:
    """The settings of an admin command; ``home`` (``--home``) wins over ``LIBREYOLO_HOME``.
    Creates no folder."""
    return Settings(home=home) if home is not None else Settings()


def where_from(home: Path | None) -> str:
    """Which setting chose the database, in words (for the ``database:`` line)."""
    if os.environ.get("LIBREYOLO_DATABASE_URL"):
        return "LIBREYOLO_DATABASE_URL"
    if home is not None:
        return f"--home {home}"
    if os.environ.get("LIBREYOLO_HOME"):
        return f"LIBREYOLO_HOME={os.environ['LIBREYOLO_HOME']}"
    return f"the default ./.libreyolo of the current folder {Path.cwd()}"


def _redact(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


def require_database(settings: Settings, home: Path | None) -> None:
    """Exit 1 with where it looked unless the service database exists and is set up;
    upgrade an existing one at an older migration; print ``database: <url> (<from>)``.

    Raises:
        typer.Exit: code 1 when there is no database (nothing is created) or it cannot
            be reached.
    """
    from sqlalchemy.exc import OperationalError

    from service.db.migrate import schema_problem, upgrade

    url = settings.database_url
    try:
        problem = schema_problem(url)
    except OperationalError as exc:
        typer.secho(f"error: cannot reach the database {_redact(url)} (from {where_from(home)}): "
                    f"{str(exc.orig).strip().splitlines()[0] if exc.orig else exc}", fg="red", err=True)
        raise typer.Exit(1) from None
    if problem is not None and "never set up" in problem:
        typer.secho(
            f"error: no service database at {_redact(url)}: {problem}. It was looked for from "
            f"{where_from(home)}; an admin command creates none. Point it at the service's "
            "state: --home PATH or LIBREYOLO_HOME=PATH (the .libreyolo folder of the place "
            "where `libreyolo-service up` runs), or LIBREYOLO_DATABASE_URL=URL as the API "
            "has it. A new service sets up its database with `libreyolo-service up` or "
            "`libreyolo-service db upgrade`.", fg="red", err=True)
        raise typer.Exit(1)
    if problem is not None:
        upgrade(url)
    typer.echo(f"database: {_redact(url)}  (from {where_from(home)})", err=True)
