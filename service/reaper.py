"""The reaper: recovers jobs whose worker died and re-sends lost queue messages.

Runs on a timer in the API process (:func:`reaper_loop`); :func:`reap_once` is one pass
and is what tests call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import anyio
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from service.db.models import Job, utcnow
from service.job_store import expire, expired_leases
from service.lifecycle import JobStatus
from service.scheduler import wake_targets
from service.settings import Settings
from service.storage import ArtifactStore

__all__ = ["reap_once", "reaper_loop"]

log = logging.getLogger(__name__)

#: send(job_id, queue, priority): puts run_job on the queue.
Sender = Callable[[str, str, int], None]


def reap_once(sessions: sessionmaker[Session], settings: Settings, send: Sender,
              broker_restarted: bool = False) -> dict[str, int]:
    """One reaper pass.

    1. ``running``/``cancelling`` jobs whose lease expired (their worker died):
       :func:`service.job_store.expire` (a cancelling one becomes ``cancelled``; a running
       one goes back to ``queued``, resuming from ``run/weights/last.pt`` when there is one,
       while ``attempt < max_attempts``, else ``failed`` with the reason).
    2. When a job of step 1 failed or was cancelled, its owner's running count went down:
       a wake-up is sent for each queue holding the owner's queued jobs (their cap may have
       held them back; :func:`service.scheduler.wake_targets`). A re-queued job's own
       message is that wake-up.
    3. ``queued`` jobs whose message was sent (``sent_at``, else ``enqueued_at``) more than
       ``resend_after_s`` ago are sent again (a broker restarted empty loses messages; a
       duplicate is harmless: a message only wakes a worker, and the claim is atomic).
       With ``broker_restarted`` (the broker's epoch changed, :func:`service.queue.broker_epoch`:
       a Redis restarted empty) every queued job whose message was sent before this pass
       is sent again now.

    Returns:
        Counts ``{"requeued", "failed", "cancelled", "resent", "woken"}``.
    """
    counts = {"requeued": 0, "failed": 0, "cancelled": 0, "resent": 0, "woken": 0}
    now = utcnow()
    to_send: list[tuple[str, str, int]] = []
    with sessions() as session:
        freed = _expire_leases(session, settings, now, counts, to_send)
        resend_after = 0.0 if broker_restarted else settings.resend_after_s
        _resend_stale(session, now - timedelta(seconds=resend_after), now, counts, to_send)
        session.commit()
        for owner in sorted(freed):
            woken = wake_targets(session, owner)
            to_send.extend(woken)
            counts["woken"] += len(woken)
    for job_id, queue, priority in to_send:  # after commit: the row is queued when it arrives
        try:
            send(job_id, queue, priority)
        except Exception:
            log.exception("reaper: could not send job %s (will retry)", job_id)
    if any(counts.values()):
        log.info("reaper: %s", counts)
    return counts


def _expire_leases(session: Session, settings: Settings, now: datetime, counts: dict[str, int],
                   to_send: list[tuple[str, str, int]]) -> set[str]:
    """Step 1 of :func:`reap_once`: recover every job whose lease expired, counting them
    in ``counts`` and adding a re-queued job's messages (one per node slot) to ``to_send``.

    Returns:
        The owners of the jobs that failed or were cancelled (one running job less each).
    """
    store = ArtifactStore(settings.artifact_root)
    freed: set[str] = set()
    for lease in expired_leases(session=session, now=now):
        status = expire(session=session, lease=lease, now=now, store=store,
                        max_infra_retries=settings.max_infra_retries)
        if status == JobStatus.QUEUED:
            counts["requeued"] += 1
            to_send.extend([(lease.id, lease.queue, lease.priority)] * max(1, lease.nodes))
        elif status is not None:
            counts[status] += 1  # failed or cancelled: the owner runs one job less
            freed.add(lease.owner_id)
    return freed


def _resend_stale(session: Session, sent_before: datetime, now: datetime,
                  counts: dict[str, int], to_send: list[tuple[str, str, int]]) -> None:
    """Step 3 of :func:`reap_once`: every ``queued`` job whose message was sent (``sent_at``,
    else ``enqueued_at``) before ``sent_before`` is marked sent ``now`` and its messages
    (one per node slot) go to ``to_send``; ``counts["resent"]`` counts the jobs."""
    stale = session.execute(
        select(Job.id, Job.queue, Job.priority, Job.nodes).where(
            Job.status == JobStatus.QUEUED,
            func.coalesce(Job.sent_at, Job.enqueued_at) < sent_before)
    ).all()
    for job_id, queue, priority, nodes in stale:
        session.execute(update(Job).where(Job.id == job_id, Job.status == JobStatus.QUEUED)
                        .values(sent_at=now))
        to_send.extend([(job_id, queue, priority)] * max(1, nodes))  # one per node slot
        counts["resent"] += 1


async def reaper_loop(sessions: sessionmaker[Session], settings: Settings, send: Sender,
                      stop: Any = None, epoch: Callable[[], str | None] | None = None) -> None:
    """Call :func:`reap_once` every ``reaper_interval_s`` (in a thread) until cancelled.

    ``epoch`` (:func:`service.queue.broker_epoch`) is asked at each pass: when it differs
    from the last value seen, the broker restarted (and may have lost its messages), and
    that pass re-sends every queued job's message at once."""
    last: str | None = None
    while True:
        t0 = time.monotonic()
        try:
            now_epoch = await anyio.to_thread.run_sync(epoch) if epoch is not None else None
            restarted = now_epoch is not None and last is not None and now_epoch != last
            if restarted:
                log.warning("reaper: the broker restarted (epoch %s -> %s); re-sending the "
                            "messages of every queued job", last, now_epoch)
            await anyio.to_thread.run_sync(reap_once, sessions, settings, send, restarted)
            if now_epoch is not None:
                last = now_epoch
        except Exception:
            log.exception("reaper pass failed")
        await anyio.sleep(max(0.0, settings.reaper_interval_s - (time.monotonic() - t0)))
