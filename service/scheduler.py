"""Fair-share scheduling: which queued job a woken worker claims, and where a job stands.

A ``run_job`` message only wakes a worker of the message's queue; :func:`claim` lets the
database choose. Among the queue's ``queued`` jobs whose owner is under their cap, the
order is:

1. the highest **effective priority**: ``min(9, priority + floor(wait / aging))`` where
   ``wait`` is the time since the job entered the queue (``enqueued_at``: submit or its
   last re-queue) and ``aging`` the setting ``aging_minutes``. A job waits at most
   ``9 * aging_minutes`` before it ties with the highest priority anyone can give, so no
   job starves behind a stream of newer higher-priority ones;
2. then the owner with the **fewest running jobs** (``running`` + ``cancelling``, every
   queue);
3. then the owner whose last job started **longest ago** (never first): users take turns.
   Without this tier a single worker would serve each priority first come, first served,
   since whenever it picks, it has just finished its job and every running count is 0;
4. then the **oldest** (``enqueued_at``, then the id, which sorts by creation).

**Cap**: an owner with ``cap`` running jobs gets no other until one ends. The cap is
``users.max_running`` when set, else the setting ``max_running_per_user``; 0 means none.

The claim is one conditional ``UPDATE`` per candidate through :func:`service.ops.transition`
(``status = 'queued'``, the attempt read, and the owner's running count below the cap, as a
subquery of the same statement) with a check of what it returned: on SQLite the statement
runs under the database's single write lock, so the count and the update are one step; on
PostgreSQL the owner's ``users`` row is locked first (``SELECT ... FOR NO KEY UPDATE``), so
two workers claiming for one owner run one after the other and the second counts the
first's job (a claimer passes over an owner whose row another claimer holds, ``SKIP
LOCKED``, and waits for one only when all were busy). Losing a race (another worker took
the job) moves on to the next candidate.

**Multi-node jobs** (``nodes > 1``) gather a gang: each woken worker takes one node slot
(:mod:`service.gang`) and the job starts when the last slot is taken. A job whose gang has
started gathering comes before every other (its held workers wait idle until it starts),
then the order above. Ties between two partly gathered jobs go to the one with more nodes
held. A job with more nodes than the queue has live workers (``workers`` heartbeats) is
passed over until enough workers are online, so it never holds the queue's workers; a
worker coming online sends wake-ups for its queues' multi-node jobs
(:func:`wake_gangs`), since the messages of a job passed over are used up.

The order is computed in Python from one read of the queue (a queue holds hundreds of jobs,
not millions), so the claim, the queue position and the estimated start share one
definition (:func:`rank_key`).
"""

from __future__ import annotations

import heapq
import logging
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session, aliased

from service.db.models import Job, JobNode, User, utcnow
from service.gang import Claim, NodeAddress, take_slot
from service.lifecycle import ACTIVE, CLAIM, JobStatus
from service.ops import transition
from service.settings import Settings
from service.workers import live_queues

__all__ = ["MAX_PRIORITY", "Waiting", "QueueSnapshot", "Outlook", "effective_priority",
           "rank_key", "read_queue", "owner_cap", "claim_order", "predicted_order", "claim",
           "wake_targets", "wake_gangs", "outlook"]

log = logging.getLogger(__name__)

#: the highest priority a job can be submitted with, and the ceiling of aging.
MAX_PRIORITY = 9
#: recent succeeded jobs of a queue whose durations give the typical job length.
ETA_HISTORY = 20
#: claim rounds (a fresh read of the queue each) at most. Each lost try means another
#: worker claimed a job or an owner reached their cap, so in practice the rounds end when
#: a claim wins or nothing eligible is left; the bound only guards against a livelock.
CLAIM_ROUNDS = 50
#: queued multi-node jobs per queue that a worker coming online wakes (:func:`wake_gangs`)
WAKE_GANGS = 8


@dataclass(frozen=True)
class Waiting:
    """A queued job as the scheduler sees it (``enqueued_at`` UTC-aware); ``nodes`` its
    node count and ``gathered`` the node slots its gang holds now (multi-node jobs)."""

    id: str
    owner_id: str
    priority: int
    enqueued_at: datetime
    attempt: int
    nodes: int = 1
    gathered: int = 0


@dataclass
class QueueSnapshot:
    """One read of a queue: its queued jobs, their owners' running counts and caps."""

    queue: str
    now: datetime
    waiting: list[Waiting]
    running: dict[str, int] = field(default_factory=dict)  # owner -> running jobs, all queues
    caps: dict[str, int] = field(default_factory=dict)  # owner -> cap (0: none)
    served: dict[str, float] = field(default_factory=dict)  # owner -> last start, unix s

    def served_at(self, owner_id: str) -> float:
        """Unix seconds of the owner's latest job start (``-inf``: never started one)."""
        return self.served.get(owner_id, -math.inf)

    def at_cap(self, owner_id: str, running: dict[str, int] | None = None) -> bool:
        """True when ``owner_id`` may not start another job (with ``running`` counts)."""
        cap = self.caps.get(owner_id, 0)
        return cap > 0 and (running if running is not None else self.running).get(owner_id, 0) >= cap


@dataclass(frozen=True)
class Outlook:
    """Where a queued job stands: its 1-based ``position`` in its queue's predicted start
    order, its ``effective_priority`` now, and ``estimated_start`` (None when unknown)."""

    position: int
    effective_priority: int
    estimated_start: datetime | None


def effective_priority(priority: int, enqueued_at: datetime, now: datetime,
                       aging_minutes: float) -> int:
    """``min(9, priority + floor(wait_minutes / aging_minutes))``; a priority above 9 (not
    accepted by the API) is kept as it is."""
    wait_min = max(0.0, (now - enqueued_at).total_seconds() / 60.0)
    return max(priority, min(MAX_PRIORITY, priority + math.floor(wait_min / aging_minutes)))


def rank_key(job: Waiting, running: int, served_at: float, now: datetime,
             aging_minutes: float) -> tuple:
    """Sort key of the claim order (smallest first): node slots its gang holds (many
    first: a gathering multi-node job before any other), effective priority (high first),
    the owner's running jobs (few first), the owner's latest start (``served_at``, unix
    seconds; long ago first), ``enqueued_at`` (old first), id."""
    return (-job.gathered, -effective_priority(job.priority, job.enqueued_at, now, aging_minutes),
            running, served_at, job.enqueued_at, job.id)


def _cap_of(user_cap: int | None, settings: Settings) -> int:
    return settings.max_running_per_user if user_cap is None else max(0, user_cap)


def owner_cap(session: Session, owner_id: str, settings: Settings) -> int:
    """The running-job cap of user ``owner_id`` (0: none): their own, else the setting."""
    return _cap_of(session.scalar(select(User.max_running).where(User.id == owner_id)), settings)


def read_queue(session: Session, queue: str, settings: Settings, *, now: datetime | None = None,
               job_id: str | None = None) -> QueueSnapshot:
    """The queued jobs of ``queue`` (only ``job_id`` when given) with their owners' running
    counts (every queue) and caps."""
    now = now or utcnow()
    stmt = (select(Job.id, Job.owner_id, Job.priority, Job.enqueued_at, Job.created_at,
                   Job.attempt, Job.nodes).where(Job.queue == queue, Job.status == JobStatus.QUEUED))
    if job_id is not None:
        stmt = stmt.where(Job.id == job_id)
    rows = session.execute(stmt).all()
    gathered: dict[str, int] = {}
    if any((r.nodes or 1) > 1 for r in rows):
        gathered = {j: n for j, n in session.execute(
            select(JobNode.job_id, func.count()).join(Job, Job.id == JobNode.job_id)
            .where(Job.queue == queue, Job.status == JobStatus.QUEUED,
                   JobNode.attempt == Job.attempt + 1, JobNode.lease_expires_at >= now)
            .group_by(JobNode.job_id))}
    waiting = [Waiting(r.id, r.owner_id, r.priority, r.enqueued_at or r.created_at, r.attempt,
                       r.nodes or 1, gathered.get(r.id, 0)) for r in rows]
    snap = QueueSnapshot(queue, now, waiting)
    owners = {w.owner_id for w in waiting}
    if owners:
        snap.running = {o: n for o, n in session.execute(
            select(Job.owner_id, func.count()).where(Job.status.in_(ACTIVE),
                                                     Job.owner_id.in_(owners))
            .group_by(Job.owner_id))}
        snap.caps = {u: _cap_of(cap, settings) for u, cap in session.execute(
            select(User.id, User.max_running).where(User.id.in_(owners)))}
        snap.served = {o: at.timestamp() for o, at in session.execute(
            select(Job.owner_id, func.max(Job.started_at))
            .where(Job.owner_id.in_(owners), Job.started_at.is_not(None))
            .group_by(Job.owner_id)) if at is not None}
    return snap


def claim_order(snap: QueueSnapshot, aging_minutes: float) -> list[Waiting]:
    """The jobs a worker may claim now (owner under the cap), best first."""
    ok = [w for w in snap.waiting if not snap.at_cap(w.owner_id)]
    return sorted(ok, key=lambda w: rank_key(w, snap.running.get(w.owner_id, 0),
                                             snap.served_at(w.owner_id), snap.now,
                                             aging_minutes))


def predicted_order(snap: QueueSnapshot, aging_minutes: float) -> list[tuple[Waiting, bool]]:
    """Every queued job in the order the queue would start them if nothing ended and nothing
    new came: claims are replayed one at a time, each adding one to its owner's running
    count and making it the owner served last (so users take turns). When every waiting
    owner is at their cap, the best of them comes next as if one of that owner's jobs had
    ended. Returns ``(job, capped)`` pairs, ``capped`` when the job can only start after
    one of its owner's jobs ends."""
    by_owner: dict[str, list[Waiting]] = {}
    for w in sorted(snap.waiting, key=lambda w: rank_key(w, 0, 0.0, snap.now, aging_minutes)):
        by_owner.setdefault(w.owner_id, []).append(w)
    heads = {o: 0 for o in by_owner}
    running = dict(snap.running)
    served = {o: snap.served_at(o) for o in by_owner}
    turn = max([snap.now.timestamp(), *served.values()])  # later than any real start
    out: list[tuple[Waiting, bool]] = []
    while heads:
        free = [o for o in heads if not snap.at_cap(o, running)]
        pool = free or list(heads)
        owner = min(pool, key=lambda o: rank_key(by_owner[o][heads[o]], running.get(o, 0),
                                                 served[o], snap.now, aging_minutes))
        out.append((by_owner[owner][heads[owner]], not free))
        if free:
            running[owner] = running.get(owner, 0) + 1
        turn += 1.0
        served[owner] = turn
        heads[owner] += 1
        if heads[owner] == len(by_owner[owner]):
            del heads[owner]
    return out


def _running_of(owner_id: str):
    other = aliased(Job)
    return (select(func.count()).select_from(other)
            .where(other.owner_id == owner_id, other.status.in_(ACTIVE)).scalar_subquery())


def _lock_owner(session: Session, owner_id: str, *, skip_locked: bool) -> bool:
    """Lock the owner's ``users`` row for this claim (PostgreSQL ``FOR NO KEY UPDATE``:
    claims for one owner take turns, while a submit, whose foreign key takes ``FOR KEY
    SHARE`` on the row, never waits for one; SQLite ignores it, its write lock does the
    same). With ``skip_locked`` a row another claimer holds is not waited for.

    Returns:
        False when ``skip_locked`` and another claimer holds the row.
    """
    row = session.execute(select(User.id).where(User.id == owner_id)
                          .with_for_update(key_share=True, skip_locked=skip_locked)).first()
    return row is not None


def _take(session: Session, job: Waiting, queue: str, cap: int, worker_id: str,
          lease_s: float) -> bool:
    """One atomic attempt: ``queued -> running`` if still queued at the attempt read and
    the owner is under ``cap`` (the caller holds the owner's row, :func:`_lock_owner`)."""
    where = [Job.queue == queue, Job.attempt == job.attempt]
    if cap > 0:
        where.append(_running_of(job.owner_id) < cap)
    now = utcnow()
    return transition(
        session, job.id, CLAIM, extra_where=where,
        event={"attempt": job.attempt + 1, "worker": worker_id},
        attempt=Job.attempt + 1, lease_owner=worker_id,
        lease_expires_at=now + timedelta(seconds=lease_s),
        started_at=func.coalesce(Job.started_at, now), cancel_requested=False,
        waiting_note=None,
    )


def _try(session: Session, job: Waiting, queue: str, snap: QueueSnapshot, worker_id: str,
         settings: Settings, where: NodeAddress | None, whole: bool = False) -> Claim | None:
    """Claim ``job`` (a node slot of a multi-node one, unless ``whole``) with its owner's
    row locked; commits a claim, rolls back otherwise."""
    cap = snap.caps.get(job.owner_id, 0)
    got: Claim | None = None
    if whole:
        if _take(session, job, queue, cap, worker_id, settings.lease_s):
            got = Claim(job.id, 0, job.attempt + 1, job.nodes, True, whole=True)
    elif job.nodes > 1 and where is not None:
        got = take_slot(session, job_id=job.id, attempt=job.attempt + 1, nodes=job.nodes,
                        worker_id=worker_id, where=where, lease_s=settings.lease_s, cap=cap)
    elif _take(session, job, queue, cap, worker_id, settings.lease_s):
        got = Claim(job.id, 0, job.attempt + 1, 1, True)
    if got is not None:
        session.commit()
    else:
        session.rollback()
    return got


def claim(session: Session, queue: str, worker_id: str, settings: Settings, *,
          job_id: str | None = None, now: datetime | None = None,
          where: NodeAddress | None = None, whole: bool = False) -> Claim | None:
    """Claim the best eligible queued job of ``queue`` for ``worker_id`` (or only
    ``job_id``, when given): ``running``, ``attempt += 1``, a lease of
    ``settings.lease_s``, and its ``status`` event, committed. For a multi-node job the
    claim is one node slot (:func:`service.gang.take_slot`; the job starts when its last
    slot is taken), which needs ``where`` (the worker's address and a free port); without
    it multi-node jobs are passed over. With ``whole`` (a cluster launcher, which runs
    every node of a job itself: :mod:`worker.slurm`) a multi-node job is claimed as one.

    Candidates are tried in :func:`claim_order`; a candidate taken by another worker in the
    meantime (or whose owner reached the cap meanwhile) is skipped, with at most one try
    per owner per read, and the queue is read again until a claim wins or no candidate is
    left (at most :data:`CLAIM_ROUNDS` reads), so a woken worker does not give up while a
    job it may start waits. On PostgreSQL a candidate whose owner another claimer is
    serving right now (its ``users`` row locked) is passed over at first
    (``SKIP LOCKED``), so claimers woken together spread over the owners instead of
    queueing behind the first one; when every candidate of a read was passed over that
    way, the best of them is waited for.

    Args:
        now: the clock of the aging (tests pass one); default the current time.

    Returns:
        The claim (:class:`service.gang.Claim`; ``started`` False while a multi-node job's
        gang still gathers); None when no job of the queue may start (none queued, or all
        their owners at their cap). This function commits a claim and rolls back
        everything else.
    """
    # a gang larger than the queue's live workers cannot gather: passed over, so it does not
    # hold the queue's only workers (without heartbeat rows, e.g. direct runs, no limit)
    live = live_queues(session, settings.worker_ttl_s).get(queue, 0)
    for _ in range(CLAIM_ROUNDS):
        snap, order = _candidates(session, queue, settings, now=now, job_id=job_id,
                                  where=where, whole=whole, live=live)
        if not order:
            return None
        got = _claim_first(session, order, queue, snap, worker_id, settings, where, whole)
        if got is not None:
            return got
    log.warning("claim in queue %s: %d rounds lost to other workers; giving up (the next "
                "wake-up or the reaper's re-send tries again)", queue, CLAIM_ROUNDS)
    return None


def _candidates(session: Session, queue: str, settings: Settings, *, now: datetime | None,
                job_id: str | None, where: NodeAddress | None, whole: bool,
                live: int) -> tuple[QueueSnapshot, list[Waiting]]:
    """One read of :func:`claim`: the queue's snapshot and the jobs this claimer may take,
    in :func:`claim_order` (the read's transaction is ended).

    ``live``: the queue's live workers (0: unknown, no limit on a gang's size)."""
    snap = read_queue(session, queue, settings, now=now, job_id=job_id)
    if whole and settings.slurm_fair_share == "slurm":
        snap.caps = {}  # Slurm's fair share and QoS decide: no per-user cap of ours
    # without an address a worker may not take a node slot: multi-node jobs are no
    # candidates (skipping them in the loop below would re-read the queue every round)
    # (nor is a gang whose every slot is held: it waits for its owner's cap)
    order = [w for w in claim_order(snap, settings.aging_minutes)
             if w.nodes == 1 or whole or (where is not None and w.gathered < w.nodes
                                 and (live == 0 or w.nodes <= live))]
    session.rollback()  # end the read; each try is its own transaction
    return snap, order


def _claim_first(session: Session, order: list[Waiting], queue: str, snap: QueueSnapshot,
                 worker_id: str, settings: Settings, where: NodeAddress | None,
                 whole: bool) -> Claim | None:
    """One round of :func:`claim`: try the candidates of ``order``, at most one per owner,
    passing over an owner another claimer is serving (its row locked); when none was
    free, wait for the best of those passed over.

    Returns:
        The claim, or None when this round won nothing.
    """
    tried: set[str] = set()
    busy: list[Waiting] = []  # owners another claimer was serving
    for job in order:
        if job.owner_id in tried:
            continue
        tried.add(job.owner_id)
        if not _lock_owner(session, job.owner_id, skip_locked=True):
            session.rollback()
            busy.append(job)
            continue
        got = _try(session, job, queue, snap, worker_id, settings, where, whole)
        if got is not None:
            return got
    for job in busy[:1]:  # nothing else was free: wait for the best one
        _lock_owner(session, job.owner_id, skip_locked=False)
        got = _try(session, job, queue, snap, worker_id, settings, where, whole)
        if got is not None:
            return got
    return None


def wake_targets(session: Session, owner_id: str) -> list[tuple[str, str, int]]:
    """``(job id, queue, priority)``, one per queue where ``owner_id`` has queued jobs: the
    wake-up messages to send when one of the owner's running jobs ends (their cap may have
    held those jobs back while the messages that woke workers for them were used up)."""
    rows = session.execute(
        select(Job.queue, func.min(Job.id), func.max(Job.priority))
        .where(Job.owner_id == owner_id, Job.status == JobStatus.QUEUED).group_by(Job.queue)).all()
    return [(job_id, queue, int(priority or 0)) for queue, job_id, priority in rows]


def wake_gangs(session: Session, queues: Sequence[str],
               limit: int = WAKE_GANGS) -> list[tuple[str, str, int]]:
    """``(job id, queue, priority)``, one per node of each queued multi-node job of
    ``queues`` (at most ``limit`` jobs per queue, best priority first): the wake-ups a worker
    sends when it comes online (a claim passes over a gang larger than the queue's live
    workers, which uses up that gang's messages; a worker joining may make it gatherable),
    and, the first one only, when a node of a multi-node job ends."""
    out: list[tuple[str, str, int]] = []
    for queue in queues:
        rows = session.execute(
            select(Job.id, Job.priority, Job.nodes)
            .where(Job.queue == queue, Job.status == JobStatus.QUEUED, Job.nodes > 1)
            .order_by(Job.priority.desc(), Job.id).limit(limit)).all()
        for job_id, priority, nodes in rows:
            out.extend([(job_id, queue, int(priority or 0))] * int(nodes))
    return out


def _typical_duration(session: Session, queue: str) -> float | None:
    """Median seconds (started -> finished) of the last :data:`ETA_HISTORY` succeeded jobs of
    ``queue``; None without any."""
    rows = session.execute(
        select(Job.started_at, Job.finished_at)
        .where(Job.queue == queue, Job.status == JobStatus.SUCCEEDED, Job.started_at.is_not(None),
               Job.finished_at.is_not(None))
        .order_by(Job.finished_at.desc()).limit(ETA_HISTORY)).all()
    spans = [(f - s).total_seconds() for s, f in rows if s is not None and f is not None and f >= s]
    return statistics.median(spans) if spans else None


def _remaining(progress: dict | None, started_at: datetime | None, now: datetime,
               typical: float | None) -> float:
    """Seconds a running job still needs: the engine's latest ``eta_s`` (its progress
    event: the rest of this epoch and the epochs after it), else the typical duration minus
    the time it has run; ``inf`` when neither is known."""
    eta = (progress or {}).get("eta_s")
    if isinstance(eta, int | float) and not isinstance(eta, bool) and eta >= 0:
        return float(eta)
    if typical is not None and started_at is not None:
        return max(0.0, typical - (now - started_at).total_seconds())
    return math.inf


def _estimate_starts(session: Session, queue: str, order: Sequence[tuple[Waiting, bool]],
                     workers: int, now: datetime) -> list[datetime | None]:
    """Start estimates of ``order`` (see :func:`outlook`)."""
    if workers <= 0 or not order:
        return [None] * len(order)
    running = session.execute(select(Job.progress, Job.started_at)
                              .where(Job.queue == queue, Job.status.in_(ACTIVE))).all()
    slots = max(workers, len(running))
    typical = _typical_duration(session, queue)
    free = [_remaining(p, s, now, typical) for p, s in running]
    free += [0.0] * (slots - len(running))
    heapq.heapify(free)
    out: list[datetime | None] = []
    for job, capped in order:
        # a multi-node job starts once it holds as many slots as it has nodes
        taken = [heapq.heappop(free) for _ in range(min(job.nodes, len(free)))]
        start = max(taken)
        known = math.isfinite(start) and not capped and job.nodes <= slots
        out.append(now + timedelta(seconds=start) if known else None)
        for _ in taken:
            heapq.heappush(free, start + typical if typical is not None else math.inf)
    return out


def outlook(session: Session, settings: Settings, queues: Iterable[str],
            live: dict[str, int], *, now: datetime | None = None) -> dict[str, Outlook]:
    """Queue position, effective priority and estimated start of every queued job of
    ``queues`` (``live``: workers serving each queue, :func:`service.workers.live_queues`).

    Position: 1 + the jobs :func:`predicted_order` starts before it in its queue (1: the
    next one to start). Estimated start: the queue's live workers (at least its running
    jobs) are slots; a running job's slot frees after the engine's latest ``eta_s`` (its
    progress event), or else after the typical duration (median of the queue's last 20
    succeeded jobs) minus the time it has run; each job ahead holds a slot (a multi-node
    job one per node, from when the last of them frees) for the typical duration. The estimate is None when no live worker serves the queue, when a time it
    needs is unknown (no ``eta_s`` and no finished job to learn a duration from), and for a
    job that waits for its owner's cap (that depends on the owner's other jobs). It takes
    the order as it stands now: later submits with a higher priority, and aging, can move
    it.
    """
    now = now or utcnow()
    out: dict[str, Outlook] = {}
    for queue in sorted(set(queues)):
        snap = read_queue(session, queue, settings, now=now)
        order = predicted_order(snap, settings.aging_minutes)
        starts = _estimate_starts(session, queue, order, live.get(queue, 0), now)
        for i, ((job, _capped), start) in enumerate(zip(order, starts, strict=True)):
            out[job.id] = Outlook(i + 1, effective_priority(job.priority, job.enqueued_at, now,
                                                            settings.aging_minutes), start)
    return out
