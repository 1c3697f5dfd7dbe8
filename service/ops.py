"""Unit-of-work helpers shared by the job store, the runner and the reaper.

Every state change of a job is one conditional ``UPDATE`` (``WHERE status IN (...)``) that
also reserves event sequence numbers, so a transition and its ``status`` event commit
together and two actors can never both win. The edges are the named transitions of
:mod:`service.lifecycle`; :func:`transition` makes no other. Callers commit.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import insert, update
from sqlalchemy.orm import Session

from service.db.models import Job, JobEvent
from service.lifecycle import JobStatus, Transition

__all__ = ["append_events", "transition", "EventIn"]

#: (kind, time unix seconds, payload) of one event to append.
EventIn = tuple[str, float, dict[str, Any]]


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


def transition(session: Session, job_id: str, move: Transition, to: JobStatus | None = None,
               *, extra_where: Iterable[Any] = (), event: dict[str, Any] | None = None,
               **values: Any) -> bool:
    """Make the named transition ``move`` (:mod:`service.lifecycle`) with a ``status`` event:
    the job goes from one of ``move.sources`` to ``to`` (default: the move's only target).

    Args:
        extra_where: more conditions of the conditional ``UPDATE`` (the lease, the attempt).
        event: extra fields of the ``status`` event's payload.
        values: other columns to set in the same ``UPDATE``.

    Returns:
        True if this call made the change; False if the job was not in ``move.sources``
        (or ``extra_where`` did not hold).

    Raises:
        TypeError: ``move`` is not a :class:`~service.lifecycle.Transition`.
        TransitionError: ``to`` is not one of ``move.targets``.
    """
    if not isinstance(move, Transition):
        raise TypeError(f"transition: {move!r} is not a named Transition of service.lifecycle")
    to_status = move.target(to)
    payload = {"event": "status", "status": to_status, **(event or {})}
    last = append_events(
        session, job_id, [("status", time.time(), payload)],
        where=[Job.status.in_(move.sources), *extra_where], status=to_status, **values,
    )
    return last is not None
