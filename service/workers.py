"""Which queues live workers serve (the ``workers`` table their heartbeats write).

The API reads it to warn at submit (or refuse, with ``refuse_unserved``) when no live
worker serves a job's queue, and to say why a queued job waits. Only the worker writes
the table (``worker/heartbeat.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import WorkerRow, utcnow
from service.lifecycle import JobStatus

__all__ = ["live_queues", "waiting_reason", "unserved_warning"]


def live_queues(session: Session, ttl_s: float) -> dict[str, int]:
    """``{queue: live workers serving it}`` from the heartbeats newer than ``ttl_s`` seconds."""
    since = utcnow() - timedelta(seconds=ttl_s)
    served: dict[str, int] = {}
    for queues in session.scalars(select(WorkerRow.queues).where(WorkerRow.last_seen_at >= since)):
        for q in queues or []:
            served[q] = served.get(q, 0) + 1
    return served


def waiting_reason(status: str, queue: str, live: dict[str, int], nodes: int = 1) -> str | None:
    """Why a job waits: ``"waiting for a gpu-1 worker (none online)"`` for a queued job
    whose queue no live worker serves, ``"waiting for 2 cpu workers (1 online)"`` for a
    multi-node job with fewer live workers than ``nodes``; None otherwise (not queued, or
    served)."""
    have = live.get(queue, 0)
    if status != JobStatus.QUEUED or have >= max(1, nodes):
        return None
    if nodes > 1:
        return f"waiting for {nodes} {queue} workers ({have or 'none'} online)"
    return f"waiting for a {queue} worker (none online)"


def unserved_warning(queue: str, gpus: int, live: Iterable[str]) -> str:
    """The submit warning (or 409 detail) for a job no live worker serves."""
    served = sorted(set(live))
    now = f"online workers serve {', '.join(served)}" if served else "no worker is online"
    if gpus:
        hint = (f"start a worker with at least {gpus} GPU(s) "
                f"(`libreyolo-service worker --gpus 0{''.join(f',{i}' for i in range(1, gpus))}`)")
        if "cpu" in served:
            hint += ", or submit with gpus=0 to train on the CPU worker"
    else:
        hint = "start one with `libreyolo-service worker --cpu`"
    return f"no live worker serves queue {queue!r} ({now}): the job waits until one starts; {hint}"
