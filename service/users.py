"""Users and their API tokens: create, look up by token, per-user cap, and who may see what.

Tokens are stored as their sha256 hex (:func:`hash_token`), never in clear. Callers commit.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
import unicodedata
from collections import OrderedDict
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import Select, or_, select
from sqlalchemy.orm import Session

from service.db.models import Token, User, utcnow

__all__ = ["hash_token", "check_user_name", "create_user_token", "user_for_token", "set_user_cap", "owns",
           "visible_to", "TokenCache", "TOKEN_CACHE_S", "list_tokens", "revoke_token"]

#: how long an API process trusts a token it has looked up (seconds): a revoked token (or
#: a changed ``is_admin``/``max_running``) takes effect within this on every process. One
#: second costs each process one indexed statement per active token per second.
TOKEN_CACHE_S = 1.0


def owns(user: User, owner_id: str) -> bool:
    """The ownership rule: ``user`` may see and change a row of ``owner_id`` (a job, a
    dataset, a model) when it is theirs or when they are an admin."""
    return owner_id == user.id or user.is_admin


def visible_to(stmt: Select, owner_id: Any, user: User) -> Select:
    """``stmt`` limited to the rows :func:`owns` lets ``user`` see: those whose
    ``owner_id`` column is the user's (an admin's statement is left as it is)."""
    return stmt if user.is_admin else stmt.where(owner_id == user.id)


def check_user_name(name: str) -> str:
    """``name`` when it can name a user; the one rule for the CLI, the API and
    :func:`create_user_token`.

    Raises:
        ValueError: ``name`` is empty or shows nothing (only whitespace, control or format
            characters such as a zero-width space), or starts or ends with whitespace (it
            would look like another user's name).
    """
    if not any(unicodedata.category(c)[0] not in "CZ" for c in name):
        raise ValueError(f"user name {name!r} is empty or blank: give the user a name")
    if name != name.strip():
        raise ValueError(f"user name {name!r} starts or ends with whitespace: give it as {name.strip()!r}")
    return name


def hash_token(token: str) -> str:
    """sha256 hex of a bearer token (what the database stores)."""
    return hashlib.sha256(token.encode()).hexdigest()


def create_user_token(session: Session, *, name: str, admin: bool = False,
                      token_name: str = "", expires_in_s: float | None = None
                      ) -> tuple[User, str]:
    """Create (or reuse) the user ``name`` and a new token for it, valid for
    ``expires_in_s`` seconds (None: until revoked).

    Returns:
        The user and the token in clear (shown once; only its sha256 is stored).

    Raises:
        ValueError: ``name`` is empty or blank, or ``expires_in_s`` is not a positive finite
            number of seconds.
    """
    check_user_name(name)
    if expires_in_s is not None and not 0 < expires_in_s < 100 * 365 * 86400:
        raise ValueError(f"expiry: {expires_in_s!r} s is not between 0 and 100 years")
    user = session.scalar(select(User).where(User.name == name))
    if user is None:
        user = User(name=name, is_admin=admin)
        session.add(user)
        session.flush()
    elif admin and not user.is_admin:
        user.is_admin = True
    token = "lyt_" + secrets.token_urlsafe(32)
    expires = None if expires_in_s is None else utcnow() + timedelta(seconds=expires_in_s)
    session.add(Token(user_id=user.id, name=token_name or name, token_sha256=hash_token(token),
                      expires_at=expires))
    session.flush()
    return user, token


def user_for_token(session: Session, token: str) -> User | None:
    """The user owning ``token``, or None if unknown, revoked or expired."""
    row = session.execute(
        select(User).join(Token, Token.user_id == User.id)
        .where(Token.token_sha256 == hash_token(token), Token.revoked.is_(False),
               or_(Token.expires_at.is_(None), Token.expires_at > utcnow()))
    ).scalar_one_or_none()
    return row


def list_tokens(session: Session, user_name: str | None = None) -> list[dict[str, Any]]:
    """Every token (of user ``user_name`` when given), oldest first, as
    ``{id, user, name, created_at, expires_at, revoked, revoked_at, state}`` (``state``:
    ``active``, ``expired`` or ``revoked``); never the token itself (only its hash is kept).

    Raises:
        LookupError: no user ``user_name``.
    """
    stmt = select(Token, User.name).join(User, User.id == Token.user_id)
    if user_name is not None:
        if session.scalar(select(User.id).where(User.name == user_name)) is None:
            raise LookupError(f"no user named {user_name!r}")
        stmt = stmt.where(User.name == user_name)
    now = utcnow()
    out = []
    for tok, owner in session.execute(stmt.order_by(Token.created_at, Token.id)):
        state = "revoked" if tok.revoked else \
            "expired" if tok.expires_at is not None and tok.expires_at <= now else "active"
        out.append({"id": tok.id, "user": owner, "name": tok.name, "created_at": tok.created_at,
                    "expires_at": tok.expires_at, "revoked": tok.revoked,
                    "revoked_at": tok.revoked_at, "state": state})
    return out


def revoke_token(session: Session, token_id: str) -> bool:
    """Revoke the token ``token_id`` (every API process refuses it within
    :data:`TOKEN_CACHE_S`). Returns False when it was revoked already.

    Raises:
        LookupError: no token ``token_id``.
    """
    tok = session.get(Token, token_id)
    if tok is None:
        raise LookupError(f"no token {token_id!r}")
    if tok.revoked:
        return False
    tok.revoked, tok.revoked_at = True, utcnow()
    session.flush()
    return True


class TokenCache:
    """The users of recently seen tokens, so a request needs no token statement.

    One per API process (``app.state.tokens``). Only tokens that were found are kept (an
    unknown token is looked up every time, so a token created a moment ago works at once
    and random tokens cannot fill the memory), keyed by their sha256, each for at most
    ``ttl_s`` seconds from its lookup: a token revoked in the database (or its user's row
    changed) is refused by every process at most ``ttl_s`` seconds later. The users are
    detached rows (every column loaded), shared between requests: read them, never add
    them to a session.

    Args:
        ttl_s: seconds an entry is trusted (0: no caching).
        max_entries: beyond this, the oldest entry is dropped.
        clock: monotonic seconds (tests pass a fake one).

    Attributes:
        lookups: how many times the database was asked (tests read it).
    """

    def __init__(self, ttl_s: float = TOKEN_CACHE_S, max_entries: int = 4096,
                 clock: Callable[[], float] = time.monotonic):
        self.ttl_s, self.max_entries, self._clock = ttl_s, max_entries, clock
        self._lock = threading.Lock()
        self._users: OrderedDict[str, tuple[float, User]] = OrderedDict()
        self.lookups = 0

    def get(self, token: str) -> User | None:
        """The cached user of ``token``, or None when not cached or older than ``ttl_s``."""
        key = hash_token(token)
        with self._lock:
            hit = self._users.get(key)
            if hit is None:
                return None
            if self._clock() - hit[0] >= self.ttl_s:
                del self._users[key]
                return None
            return hit[1]

    def drop(self, token_sha256: str) -> None:
        """Forget the token with this sha256 (revoked here: refused at once)."""
        with self._lock:
            self._users.pop(token_sha256, None)

    def lookup(self, session: Session, token: str) -> User | None:
        """:meth:`get`, else :func:`user_for_token` (one statement), caching a found user.

        The user row is expunged from ``session`` (it stays readable, detached)."""
        user = self.get(token)
        if user is not None:
            return user
        at = self._clock()
        user = user_for_token(session, token)
        with self._lock:
            self.lookups += 1
        if user is None or self.ttl_s <= 0:
            return user
        session.expunge(user)
        key = hash_token(token)
        with self._lock:
            self._users[key] = (at, user)
            self._users.move_to_end(key)
            while len(self._users) > self.max_entries:
                self._users.popitem(last=False)
        return user


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

