"""Users and their API tokens: create, look up by token, per-user cap, and who may see what.

Tokens are stored as their sha256 hex (:func:`hash_token`), never in clear. Callers commit.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from service.db.models import Token, User

__all__ = ["hash_token", "create_user_token", "user_for_token", "set_user_cap", "owns",
           "visible_to"]


def owns(user: User, owner_id: str) -> bool:
    """The ownership rule: ``user`` may see and change a row of ``owner_id`` (a job, a
    dataset, a model) when it is theirs or when they are an admin."""
    return owner_id == user.id or user.is_admin


def visible_to(stmt: Select, owner_id: Any, user: User) -> Select:
    """``stmt`` limited to the rows :func:`owns` lets ``user`` see: those whose
    ``owner_id`` column is the user's (an admin's statement is left as it is)."""
    return stmt if user.is_admin else stmt.where(owner_id == user.id)


def hash_token(token: str) -> str:
    """sha256 hex of a bearer token (what the database stores)."""
    return hashlib.sha256(token.encode()).hexdigest()


def create_user_token(session: Session, *, name: str, admin: bool = False,
                      token_name: str = "") -> tuple[User, str]:
    """Create (or reuse) the user ``name`` and a new token for it.

    Returns:
        The user and the token in clear (shown once; only its sha256 is stored).
    """
    user = session.scalar(select(User).where(User.name == name))
    if user is None:
        user = User(name=name, is_admin=admin)
        session.add(user)
        session.flush()
    elif admin and not user.is_admin:
        user.is_admin = True
    token = "lyt_" + secrets.token_urlsafe(32)
    session.add(Token(user_id=user.id, name=token_name or name, token_sha256=hash_token(token)))
    session.flush()
    return user, token


def user_for_token(session: Session, token: str) -> User | None:
    """The user owning ``token``, or None if unknown or revoked."""
    row = session.execute(
        select(User).join(Token, Token.user_id == User.id)
        .where(Token.token_sha256 == hash_token(token), Token.revoked.is_(False))
    ).scalar_one_or_none()
    return row


def set_user_cap(session: Session, name: str, max_running: int | None) -> User:
    """Set how many running jobs user ``name`` may have at once (``users.max_running``):
    ``None`` goes back to the setting ``max_running_per_user``, 0 means no cap.

    Raises:
        LookupError: no user ``name``.
        ValueError: ``max_running`` is negative.
    """
    if max_running is not None and max_running < 0:
        raise ValueError(f"max_running: {max_running} is negative (0 means no cap)")
    user = session.scalar(select(User).where(User.name == name))
    if user is None:
        raise LookupError(f"no user named {name!r}")
    user.max_running = max_running
    session.flush()
    return user

