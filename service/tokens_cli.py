"""``libreyolo-service token list | revoke`` (and ``create --expires-in``): API tokens on
the database named by the settings, like ``users``. The same as ``/v1/admin/tokens``."""

from __future__ import annotations

import re
from typing import Annotated

import typer

from service.admin_db import HomeOption, admin_settings
from service.users_cli import _sessions

__all__ = ["add_token_commands", "parse_duration"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """``"90s"``, ``"30m"``, ``"12h"``, ``"30d"``, ``"2w"`` (or plain seconds) -> seconds.

    Raises:
        typer.BadParameter: anything else, or not positive.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if m is None or float(m[1]) <= 0:
        raise typer.BadParameter(f"{text!r} is not a duration like 90s, 30m, 12h, 30d or 2w")
    return float(m[1]) * _UNITS[m[2] or "s"]


def _when(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value is not None else "-"


def token_list(
    user: Annotated[str | None, typer.Option(help="only this user's tokens")] = None,
    home: HomeOption = None,
) -> None:
    """Every token: id, user, name, created, expires, state (never the token itself)."""
    from service.users import list_tokens

    engine, sessions = _sessions(admin_settings(home), home)
    try:
        with sessions() as s:
            rows = list_tokens(s, user)
    except LookupError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None
    finally:
        engine.dispose()
    w = max([len(r["user"]) for r in rows] + [4])
    typer.echo(f"{'id':<26}  {'user':<{w}}  {'state':<7}  {'created':<20}  {'expires':<20}  name")
    for r in rows:
        typer.echo(f"{r['id']:<26}  {r['user']:<{w}}  {r['state']:<7}  {_when(r['created_at']):<20}  "
                   f"{_when(r['expires_at']):<20}  {r['name']}")


def token_revoke(token_id: Annotated[str, typer.Argument(help="the token's id (token list)")],
                 home: HomeOption = None) -> None:
    """Revoke a token: every API process refuses it within a second."""
    from service.users import revoke_token

    engine, sessions = _sessions(admin_settings(home), home)
    try:
        with sessions() as s:
            changed = revoke_token(s, token_id)
            s.commit()
    except LookupError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None
    finally:
        engine.dispose()
    typer.echo(f"revoked {token_id}" if changed else f"{token_id} was revoked already")


def add_token_commands(token_app: typer.Typer) -> None:
    """Add ``list`` and ``revoke`` to the ``token`` command group."""
    token_app.command("list")(token_list)
    token_app.command("revoke")(token_revoke)
