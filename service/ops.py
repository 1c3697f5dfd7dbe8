"""Unit-of-work helpers shared by the API, the runner and the reaper.

Every state change of a job is one conditional ``UPDATE`` (``WHERE status IN (...)``) that
also reserves event sequence numbers, so a transition and its ``status`` event commit
together and two actors can never both win. Callers commit.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from service.db.models import Job, JobEvent, Token, User

__all__ = [
    "hash_token", "create_user_token", "user_for_token", "set_user_cap", "append_events",
    "transition", "EventIn",
]

#: (kind, time unix seconds, payload) of one event to append.
EventIn = tuple[str, float, dict[str, Any]]


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


def append_events(session: Session, job_id: str, events: Sequence[EventIn],
                  where: Iterable[Any] = (), **values: Any) -> int | None:
    """Append ``events`` with the next sequence numbers, optionally updating the job.

    One ``UPDATE jobs ... RETURNING event_seq`` reserves the numbers (and applies
    ``values`` when the extra ``where`` clauses hold), then the events are inserted.

    Returns:
        The last sequence number, or None when the job row did not match (nothing written).
    """
    n = len(events)
    stmt = (update(Job).where(Job.id == job_id, *where)
            .values(event_seq=Job.event_seq + n, **values).returning(Job.event_seq))
    last = session.execute(stmt).scalar_one_or_none()
    if last is None:
        return None
    if n:
        first = last - n + 1
        session.execute(insert(JobEvent), [
            {"job_id": job_id, "seq": first + i, "time": t, "kind": k, "payload": p}
            for i, (k, t, p) in enumerate(events)
        ])
    return last


def transition(session: Session, job_id: str, from_status: Sequence[str], to_status: str,
               *, extra_where: Iterable[Any] = (), event: dict[str, Any] | None = None,
               **values: Any) -> bool:
    """Move a job from one of ``from_status`` to ``to_status`` with a ``status`` event.

    Returns:
        True if this call made the change; False if the job was not in ``from_status``.
    """
    payload = {"event": "status", "status": to_status, **(event or {})}
    last = append_events(
        session, job_id, [("status", time.time(), payload)],
        where=[Job.status.in_(tuple(from_status)), *extra_where], status=to_status, **values,
    )
    return last is not None
