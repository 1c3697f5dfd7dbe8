"""The job store: every read and status change of a job row that the API, the pages, the
worker and the reaper share, as keyword-only functions taking a session.

Status changes are the named transitions of :mod:`service.lifecycle`, made through
:func:`service.ops.transition`. The callers commit (one commit per unit of work), except
:func:`claim`, which commits its claim (see :func:`service.scheduler.claim`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Row, delete, insert, select, update
from sqlalchemy.orm import Session

from service.db.models import Artifact, Job, JobNode, User, new_id, utcnow
from service.ends import INFRASTRUCTURE, USER, retry_note
from service.gang import Claim, NodeAddress
from service.lifecycle import (
    ACTIVE,
    CANCEL_EXPIRED,
    CANCEL_QUEUED,
    FAIL_EXPIRED,
    FINISH,
    HAND_BACK,
    NODE_LOST,
    REQUEST_CANCEL,
    REQUEUE_EXPIRED,
    REQUEUE_INFRA,
    JobStatus,
)
from service.ops import append_events, transition
from service.scheduler import claim as scheduler_claim
from service.settings import Settings
from service.storage import ArtifactStore
from service.users import owns, visible_to

__all__ = ["create_job", "get_owned", "list_jobs", "claim", "held_by", "renew_lease", "finish", "hand_back",
           "node_lost", "requeue_infra", "set_cluster", "cluster_restarted", "request_cancel", "expired_leases", "expire",
           "DEFAULT_MAX_INFRA_RETRIES"]

#: ``Settings.max_infra_retries``'s default (callers pass the setting)
DEFAULT_MAX_INFRA_RETRIES = 10


def create_job(*, session: Session, owner_id: str, kind: str, model: str, data: str,
               params: dict[str, Any], gpus: int, procs: int, nodes: int, priority: int,
               queue: str, max_attempts: int, time_budget_s: float | None,
               options: dict[str, Any] | None = None, request_sha256: str | None = None,
               idempotency_key: str | None = None, job_id: str | None = None,
               reason: str | None = None) -> Job:
    """Add a new ``queued`` job row (attempt 0, no events, created, enqueued and sent now)
    and its first event, ``status: queued`` (with ``reason`` when given). The caller
    commits, then sends the job to its queue.

    Args:
        model, data: as the job stores them (resolved paths or names).
        gpus, procs, nodes: the job's devices (``procs`` equals ``gpus`` for a GPU job).
        queue: the queue of its GPU count (:func:`service.queue.queue_for`).
        time_budget_s: seconds of running at most (None: no budget).
        request_sha256, idempotency_key: the submit's body hash and its
            ``Idempotency-Key`` (unique per owner).
        job_id: the new row's id (None: a fresh one).

    Raises:
        IntegrityError: from the flush: an ``idempotency_key`` the owner used before (the
            caller rolls back and reads the existing job).
    """
    now = utcnow()
    job = Job(id=job_id or new_id("j"), owner_id=owner_id, kind=kind, model=model, data=data, params=params,
              options=options, gpus=gpus, procs=procs, nodes=nodes, priority=priority,
              queue=queue, status=JobStatus.QUEUED, attempt=0, max_attempts=max_attempts,
              time_budget_s=time_budget_s, idempotency_key=idempotency_key,
              request_sha256=request_sha256, cancel_requested=False, event_seq=0,
              events_offset=0, log_offset=0, created_at=now, enqueued_at=now, sent_at=now)
    session.add(job)
    session.flush()
    payload: dict[str, Any] = {"event": "status", "status": JobStatus.QUEUED}
    if reason is not None:
        payload["reason"] = reason
    append_events(session, job.id, [("status", time.time(), payload)])
    return job


def get_owned(*, session: Session, job_id: str, user: User) -> Job | None:
    """The job ``job_id`` when ``user`` owns it (or is an admin, :func:`service.users.owns`);
    None for no such job and for another user's job alike."""
    job = session.get(Job, job_id)
    return job if job is not None and owns(user, job.owner_id) else None


def list_jobs(*, session: Session, user: User, statuses: Iterable[str] = (),
              kind: str | None = None, before: str | None = None,
              limit: int) -> tuple[list[Job], bool]:
    """The user's jobs (an admin's: everyone's), newest first.

    Args:
        statuses: only these statuses (empty: all).
        kind: only this kind (None: all).
        before: only jobs older than this job id (ids sort by creation).
        limit: at most this many rows.

    Returns:
        ``(rows, more)``: ``more`` when older jobs follow the last row.
    """
    stmt = visible_to(select(Job).order_by(Job.id.desc()).limit(limit + 1), Job.owner_id, user)
    statuses = set(statuses)
    if statuses:
        stmt = stmt.where(Job.status.in_(statuses))
    if kind:
        stmt = stmt.where(Job.kind == kind)
    if before:
        stmt = stmt.where(Job.id < before)
    rows = list(session.scalars(stmt))
    return rows[:limit], len(rows) > limit


def claim(*, session: Session, settings: Settings, worker_id: str, queue: str | None = None,
          job_id: str | None = None, where: NodeAddress | None = None,
          whole: bool = False) -> Claim | None:
    """Claim (``queued -> running``, the transition ``claim``) the best eligible job of
    ``queue``, or only ``job_id`` (its own queue when ``queue`` is None), for
    ``worker_id``: :func:`service.scheduler.claim`, which commits. With ``where`` (the
    worker's address) a multi-node job may be claimed: one node slot of its gang; with
    ``whole`` (a cluster launcher) the whole job, in one claim.

    Returns:
        The claim, or None (no such job, or none of the queue may start now).
    """
    if queue is None:
        queue = session.scalar(select(Job.queue).where(Job.id == job_id))
        if queue is None:
            return None
    return scheduler_claim(session, queue, worker_id, settings, job_id=job_id, where=where,
                           whole=whole)


def held_by(worker_id: str) -> list[Any]:
    """``WHERE`` clauses of a job whose lease ``worker_id`` holds (running or cancelling)."""
    return [Job.lease_owner == worker_id, Job.status.in_(ACTIVE)]


def renew_lease(*, session: Session, job_id: str, worker_id: str,
                lease_s: float) -> tuple[str, bool] | None:
    """Extend ``worker_id``'s lease on ``job_id`` to ``lease_s`` seconds from now.

    Returns:
        ``(status, cancel_requested)`` of the job, or None when the lease is lost (the
        reaper took the job, or it is no longer running or cancelling).
    """
    row = session.execute(
        update(Job).where(Job.id == job_id, *held_by(worker_id))
        .values(lease_expires_at=utcnow() + timedelta(seconds=lease_s))
        .returning(Job.status, Job.cancel_requested)).first()
    return None if row is None else (row[0], bool(row[1]))


def finish(*, session: Session, job_id: str, worker_id: str, status: JobStatus,
           result: dict[str, Any] | None, error: dict[str, Any] | None,
           event: dict[str, Any], progress: dict[str, Any] | None,
           artifacts: list[dict[str, Any]], end_class: str | None = None,
           why: str | None = None) -> bool:
    """End ``worker_id``'s attempt (the transition ``finish``: running or cancelling ->
    ``status``) and replace the job's artifact rows with ``artifacts`` (``artifacts``
    table columns). Only while ``worker_id`` holds the lease.

    ``end_class`` and ``why`` (:mod:`service.ends`; None for a success) go on the row
    and into the status event.

    Returns:
        True if this call ended the job; False (nothing written) when the lease is lost.

    Raises:
        TransitionError: ``status`` is not succeeded, failed or cancelled.
    """
    if end_class:
        event = {**event, "end_class": end_class, "why": why}
    ok = transition(session, job_id, FINISH, status,
                    extra_where=[Job.lease_owner == worker_id], event=event,
                    finished_at=utcnow(), lease_owner=None, lease_expires_at=None,
                    result=result, error=error, progress=progress, end_class=end_class,
                    end_reason=why)
    if ok:
        session.execute(delete(Artifact).where(Artifact.job_id == job_id))
        if artifacts:
            session.execute(insert(Artifact), artifacts)
    return ok


def hand_back(*, session: Session, job_id: str, worker_id: str, reason: str,
              progress: dict[str, Any] | None) -> bool:
    """Give a running job back to the queue (the transition ``hand_back``: worker shutdown);
    the next attempt resumes from ``last.pt``.

    A graceful hand-back is not a failed attempt: the attempt count goes back down, so
    restarting the service any number of times never uses up ``max_attempts``. The node
    slots of a multi-node job's handed-back attempt are deleted (the next attempt takes
    the same number and gathers its nodes afresh).

    Returns:
        True if the job was handed back; False when ``worker_id`` no longer holds it or it
        is not ``running`` (a cancel came first).
    """
    now = utcnow()
    ok = transition(session, job_id, HAND_BACK, extra_where=[Job.lease_owner == worker_id],
                    event={"reason": reason, "end_class": INFRASTRUCTURE, "why": reason},
                    lease_owner=None, lease_expires_at=None,
                    enqueued_at=now, sent_at=now, progress=progress,
                    attempt=Job.attempt - 1, end_class=INFRASTRUCTURE, end_reason=reason)
    if ok:  # the next attempt reuses the number: a multi-node job's old node slots go
        session.execute(delete(JobNode).where(
            JobNode.job_id == job_id,
            JobNode.attempt > select(Job.attempt).where(Job.id == job_id).scalar_subquery()))
    return ok


def node_lost(*, session: Session, job_id: str, worker_id: str, reason: str,
              progress: dict[str, Any] | None, store: ArtifactStore,
              max_infra_retries: int = DEFAULT_MAX_INFRA_RETRIES) -> JobStatus | None:
    """End the attempt of a multi-node job one of whose nodes was lost (the transition
    ``node_lost``, made by node 0's worker, ``worker_id``, once its own engine has
    stopped), an infrastructure end: back to ``queued`` to resume from ``last.pt`` as one
    whole attempt while ``infra_retries < max_infra_retries``, else ``failed`` with ``reason``.

    Returns:
        The new status, or None when ``worker_id`` no longer holds the job (nothing written).
    """
    row = session.execute(select(Job.attempt, Job.infra_retries)
                          .where(Job.id == job_id, *held_by(worker_id))).first()
    if row is None:
        return None
    attempt, retries = row
    now = utcnow()
    mine = [Job.lease_owner == worker_id, Job.attempt == attempt]
    lost = {"lease_owner": None, "lease_expires_at": None, "progress": progress,
            "end_class": INFRASTRUCTURE, "end_reason": reason}
    end = {"end_class": INFRASTRUCTURE, "why": reason}
    if retries < max_infra_retries:
        why = f"{reason}; {retry_note(attempt, retries + 1, max_infra_retries)} on every " \
              f"node, {store.resume_note(job_id)}"
        done = transition(session, job_id, NODE_LOST, JobStatus.QUEUED, extra_where=mine,
                          enqueued_at=now, sent_at=now, event={"reason": why, **end},
                          infra_retries=Job.infra_retries + 1, **lost)
        return JobStatus.QUEUED if done else None
    why = f"{reason} on attempt {attempt}, after {retries} infrastructure retries"
    done = transition(session, job_id, NODE_LOST, JobStatus.FAILED, extra_where=mine,
                      finished_at=now, error={"reason": why, "exit_code": None},
                      event={"reason": why, **end}, **lost)
    return JobStatus.FAILED if done else None

def set_cluster(*, session: Session, job_id: str, worker_id: str,
                cluster: dict[str, Any]) -> bool:
    """Store the cluster manager's view of ``worker_id``'s attempt (``jobs.cluster``: the
    cluster's job id, nodes, state, waiting reason; :mod:`worker.slurm`). Only while
    ``worker_id`` holds the lease; returns whether it did."""
    done = session.execute(update(Job).where(Job.id == job_id, *held_by(worker_id))
                           .values(cluster=cluster).returning(Job.id)).first()
    return done is not None


def cluster_restarted(*, session: Session, job_id: str, worker_id: str, why: str,
                      cluster: dict[str, Any], store: ArtifactStore) -> int | None:
    """The cluster re-queued the job's allocation itself (a preemption, a node failure,
    ``scontrol requeue``): an infrastructure end of the attempt, and the same cluster job
    runs the next one, attempt N+1, which resumes from ``last.pt``. The job stays held by
    ``worker_id`` (it keeps watching); a ``status`` event says why.

    Returns:
        The new attempt number, or None when ``worker_id`` no longer holds the job.
    """
    row = session.execute(select(Job.attempt, Job.status)
                          .where(Job.id == job_id, *held_by(worker_id))).first()
    if row is None:
        return None
    attempt, status = row
    reason = f"infrastructure: {why}; attempt {attempt + 1} resumes in the same cluster job, " \
             f"{store.resume_note(job_id)}"
    event = ("status", time.time(),
             {"event": "status", "status": status, "reason": reason, "end_class": INFRASTRUCTURE, "why": why,
              "attempt": attempt + 1})
    last = append_events(session, job_id, [event], where=held_by(worker_id),
                         attempt=attempt + 1, infra_retries=Job.infra_retries + 1,
                         end_class=INFRASTRUCTURE, end_reason=why, cluster=cluster)
    return None if last is None else attempt + 1



def requeue_infra(*, session: Session, job_id: str, worker_id: str, why: str,
                  error: dict[str, Any], progress: dict[str, Any] | None,
                  store: ArtifactStore, max_infra_retries: int) -> JobStatus | None:
    """End ``worker_id``'s attempt whose engine ended for a reason of the infrastructure
    (a hang, the host's OOM killer, a full disk; the transition ``requeue_infra``): back
    to ``queued`` to resume from ``last.pt`` while ``infra_retries < max_infra_retries``
    (no attempt of ``max_attempts`` used), else ``failed`` with ``error``.

    Returns:
        The new status, or None when ``worker_id`` no longer holds the job (nothing written).
    """
    row = session.execute(select(Job.attempt, Job.infra_retries)
                          .where(Job.id == job_id, *held_by(worker_id))).first()
    if row is None:
        return None
    attempt, retries = row
    now = utcnow()
    mine = [Job.lease_owner == worker_id, Job.attempt == attempt]
    ended = {"lease_owner": None, "lease_expires_at": None, "progress": progress,
             "end_class": INFRASTRUCTURE, "end_reason": why}
    end = {"end_class": INFRASTRUCTURE, "why": why, "exit_code": error.get("exit_code")}
    if retries < max_infra_retries:
        reason = f"infrastructure: {why}; {retry_note(attempt, retries + 1, max_infra_retries)}" \
                 f", {store.resume_note(job_id)}"
        done = transition(session, job_id, REQUEUE_INFRA, JobStatus.QUEUED, extra_where=mine,
                          enqueued_at=now, sent_at=now, event={"reason": reason, **end},
                          infra_retries=Job.infra_retries + 1, **ended)
        return JobStatus.QUEUED if done else None
    reason = f"infrastructure: {why}, after {retries} infrastructure retries"
    done = transition(session, job_id, REQUEUE_INFRA, JobStatus.FAILED, extra_where=mine,
                      finished_at=now, error={**error, "reason": reason},
                      event={"reason": reason, **end}, **ended)
    return JobStatus.FAILED if done else None


def request_cancel(*, session: Session, job_id: str) -> bool:
    """Cancel a job: a queued one is ``cancelled`` at once (``cancel_queued``), a running one
    becomes ``cancelling`` (``request_cancel``; its worker stops the engine). Any other
    status is left as it is (the caller reads it back).

    Returns:
        True when the job was cancelled while queued.
    """
    if transition(session, job_id, CANCEL_QUEUED, cancel_requested=True,
                  finished_at=utcnow(), lease_owner=None, lease_expires_at=None,
                  end_class=USER, end_reason="cancelled while queued",
                  event={"reason": "cancelled while queued", "end_class": USER,
                         "why": "cancelled while queued"}):
        return True
    transition(session, job_id, REQUEST_CANCEL, cancel_requested=True)
    return False


def expired_leases(*, session: Session, now: datetime) -> list[Row]:
    """Running and cancelling jobs whose lease expired before ``now`` (their worker died):
    rows of ``id, status, attempt, max_attempts, queue, priority, lease_expires_at,
    owner_id, nodes, lease_owner, infra_retries``. (A multi-node job's lease is node 0's; node 0's worker
    watches the other nodes' leases itself, :func:`service.gang.lost_nodes`.)"""
    return list(session.execute(
        select(Job.id, Job.status, Job.attempt, Job.max_attempts, Job.queue, Job.priority,
               Job.lease_expires_at, Job.owner_id, Job.nodes, Job.lease_owner,
               Job.infra_retries)
        .where(Job.status.in_(ACTIVE), Job.lease_expires_at < now)
    ).all())


def expire(*, session: Session, lease: Row, now: datetime, store: ArtifactStore,
           max_infra_retries: int = DEFAULT_MAX_INFRA_RETRIES) -> JobStatus | None:
    """Recover one job of :func:`expired_leases`: a cancelling one becomes ``cancelled``
    (``cancel_expired``, a ``user`` end); a running one (an ``infrastructure`` end: its
    worker was lost, stopped or cut off) goes back to ``queued`` (``requeue_expired``; its
    event says whether the next run resumes from ``last.pt``, ``store.resume_note``) while
    ``infra_retries < max_infra_retries`` (no attempt of ``max_attempts`` used), else
    ``failed`` with the reason (``fail_expired``). Only if the lease is still the one read
    (no worker renewed it meanwhile).

    Returns:
        The job's new status, or None when it changed meanwhile (nothing written).
    """
    same_lease = [Job.lease_expires_at == lease.lease_expires_at]
    lost: dict[str, Any] = {"lease_owner": None, "lease_expires_at": None}  # pid kept: see the runner
    attempt, retries = lease.attempt, lease.infra_retries or 0
    lost_what = "lease expired (worker lost)"
    if (lease.nodes or 1) > 1:  # the job's lease is node 0's
        lost_what = f"node 0 (worker {lease.lease_owner}) lost: its lease expired"
    if lease.status == JobStatus.CANCELLING:
        why = "worker lost while cancelling"
        done = transition(session, lease.id, CANCEL_EXPIRED, extra_where=same_lease,
                          finished_at=now, end_class=USER, end_reason=why,
                          event={"reason": why, "end_class": USER, "why": why}, **lost)
        return JobStatus.CANCELLED if done else None
    end = {"end_class": INFRASTRUCTURE, "why": lost_what}
    lost.update(end_class=INFRASTRUCTURE, end_reason=lost_what)
    if retries < max_infra_retries:
        reason = f"{lost_what}; {retry_note(attempt, retries + 1, max_infra_retries)}" \
                 f"{' on every node' if (lease.nodes or 1) > 1 else ''}, " \
                 f"{store.resume_note(lease.id)}"
        done = transition(session, lease.id, REQUEUE_EXPIRED, extra_where=same_lease,
                          enqueued_at=now, sent_at=now, event={"reason": reason, **end},
                          infra_retries=Job.infra_retries + 1, **lost)
        return JobStatus.QUEUED if done else None
    reason = f"{lost_what} on attempt {attempt}, after {retries} infrastructure retries"
    done = transition(session, lease.id, FAIL_EXPIRED, extra_where=same_lease,
                      finished_at=now, error={"reason": reason, "exit_code": None},
                      event={"reason": reason, **end}, **lost)
    return JobStatus.FAILED if done else None
