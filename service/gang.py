"""Multi-node jobs: node slots, the gang start and the node leases (``job_nodes`` rows).

A job with ``nodes: N`` runs as one torchrun world across N workers. While it is
``queued`` the gang gathers: each worker the scheduler sends to it takes one free node
slot (:func:`take_slot`, node ranks 0..N-1, the lowest free first), and the claim that
takes the last slot starts the job (:func:`start_gang`: the ``claim`` transition,
``attempt += 1``, the job's lease to node 0's worker, and a ``status`` event naming every
node's worker and the world size). Node 0's worker publishes the rendezvous endpoint
(its ``addr:port``) in its slot; the others read it from there.

Every slot has a lease its worker renews: a short one while it waits
(:data:`GATHER_LEASE_S`, :func:`gather_step` renews it every second), so the gang never
starts with a worker that died while waiting, then ``lease_s`` while its engine runs
(:func:`renew_node`). A slot held longer
than ``gang_wait_s`` before the job starts is released by its worker
(:func:`release_slot`), and an expired one is free for the next claim, so two multi-node
jobs never hold each other's workers for ever. The scheduler serves partly gathered jobs
first (:func:`service.scheduler.rank_key`), which keeps a free worker from starting a
second gang while the first still waits for a node.

Once the job runs, node 0's worker watches the other nodes (:func:`lost_nodes`): a node
whose engine exited while the job still ran, or whose slot lease expired, stops the whole
attempt (:func:`service.job_store.node_lost`). The others follow the job row: once it is no
longer ``running`` at their attempt they stop their engine.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, aliased

from service.db.models import Job, JobNode, User, utcnow
from service.lifecycle import ACTIVE, CLAIM, JobStatus
from service.ops import append_events, transition

__all__ = ["GATHER_LEASE_S", "NodeAddress", "Claim", "NodeView", "free_port", "take_slot", "start_gang",
           "gather_step", "release_slot", "renew_node", "record_node_pid", "record_node_exit",
           "lost_nodes", "nodes_of", "world_size"]


#: seconds of a waiting slot's lease (its worker renews it every second): a slot whose
#: worker died is free again, and never starts the job, within this time.
GATHER_LEASE_S = 5.0


def world_size(nodes: int, gpus: int, procs: int) -> int:
    """Ranks of a job: ``nodes`` times its GPUs per node (or ``procs`` CPU ranks)."""
    return max(1, nodes) * (gpus if gpus > 0 else max(1, procs))


@dataclass(frozen=True)
class NodeAddress:
    """Where a worker is reached: ``host`` (its name, for people), ``addr`` (the setting
    ``worker_addr``) and ``port``, a free TCP port on ``addr`` (node 0's worker hosts
    torchrun's rendezvous store on it)."""

    host: str
    addr: str
    port: int


@dataclass(frozen=True)
class Claim:
    """What a woken worker claimed: ``job_id``, its ``node_rank`` (0 for a one-node job),
    the ``attempt`` it serves, the job's ``nodes``, and ``started`` when the job is
    running (a one-node job, or this claim completed the gang); ``whole`` when this one
    claim runs every node (a cluster launcher: Slurm allocates and starts the nodes)."""

    job_id: str
    node_rank: int
    attempt: int
    nodes: int
    started: bool
    whole: bool = False


@dataclass(frozen=True)
class NodeView:
    """One node slot as the API, the page and the runner show it."""

    node_rank: int
    worker: str
    host: str
    addr: str
    port: int | None
    exit_code: int | None
    stop: str | None
    detail: str | None
    lease_expires_at: datetime

    def public(self) -> dict[str, Any]:
        """``{node_rank, worker, host, addr, exit_code, stop}`` (the API's ``node_workers``)."""
        return {"node_rank": self.node_rank, "worker": self.worker, "host": self.host,
                "addr": self.addr, "exit_code": self.exit_code, "stop": self.stop}


def free_port(addr: str) -> int:
    """A TCP port free on ``addr`` now (the kernel's pick; another process may take it
    before the rendezvous binds it, which fails that attempt's start and re-queues it).

    Raises:
        OSError: ``addr`` is not an address of this host.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def _loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return addr == "localhost"


def _slot(job_id: str, attempt: int, node_rank: int | None = None,
          worker_id: str | None = None) -> list[Any]:
    where = [JobNode.job_id == job_id, JobNode.attempt == attempt]
    if node_rank is not None:
        where.append(JobNode.node_rank == node_rank)
    if worker_id is not None:
        where.append(JobNode.worker_id == worker_id)
    return where


def nodes_of(session: Session, job_id: str, attempt: int) -> list[NodeView]:
    """The node slots of ``job_id``'s ``attempt``, by node rank."""
    rows = session.scalars(select(JobNode).where(*_slot(job_id, attempt))
                           .order_by(JobNode.node_rank))
    return [NodeView(r.node_rank, r.worker_id, r.host, r.addr, r.port, r.exit_code, r.stop,
                     r.detail, r.lease_expires_at) for r in rows]


def take_slot(session: Session, *, job_id: str, attempt: int, nodes: int, worker_id: str,
              where: NodeAddress, lease_s: float, cap: int) -> Claim | None:
    """Take the lowest free node slot of queued job ``job_id`` for its next ``attempt``
    (the job's ``attempt`` + 1) and start the job when it was the last one. Slots whose
    lease expired (their worker died while waiting) are freed first. The caller commits
    a non-None result and rolls back otherwise.

    Returns:
        The claim, or None: no free slot, another worker took the same slot meanwhile,
        or the job is no longer queued at ``attempt - 1``.
    """
    now = utcnow()
    session.execute(delete(JobNode).where(*_slot(job_id, attempt),
                                          JobNode.lease_expires_at < now))
    held = set(session.scalars(select(JobNode.node_rank).where(*_slot(job_id, attempt))))
    free = [r for r in range(nodes) if r not in held]
    if not free:
        return None
    rank = free[0]
    session.add(JobNode(job_id=job_id, attempt=attempt, node_rank=rank, worker_id=worker_id,
                        host=where.host, addr=where.addr, port=where.port if rank == 0 else None,
                        claimed_at=now,
                        lease_expires_at=now + timedelta(seconds=min(lease_s, GATHER_LEASE_S))))
    try:
        session.flush()
    except IntegrityError:  # another worker took this slot between the read and the insert
        return None
    queued = session.scalar(select(Job.id).where(Job.id == job_id, Job.status == JobStatus.QUEUED,
                                                 Job.attempt == attempt - 1))
    if queued is None:
        return None
    started = start_gang(session, job_id=job_id, attempt=attempt, cap=cap, lease_s=lease_s)
    if not started:
        append_events(session, job_id, [("log", now.timestamp(), {
            "event": "gang", "lines": [f"node {rank} of {nodes} claimed by {worker_id}; "
            f"{len(held) + 1} of {nodes} nodes gathered"]})])
    return Claim(job_id, rank, attempt, nodes, started)


def start_gang(session: Session, *, job_id: str, attempt: int, cap: int, lease_s: float) -> bool:
    """Start queued job ``job_id`` (``claim``: ``attempt``, the job's lease to node 0's
    worker) when all its node slots of ``attempt`` are held and its owner is under
    ``cap`` running jobs (0: no cap). Does not commit.

    Returns:
        True when this call started the job.
    """
    job = session.get(Job, job_id)
    if job is None or job.status != JobStatus.QUEUED or job.attempt != attempt - 1:
        return False
    now = utcnow()
    # a waiting worker that died: its slot is free again, and the gang not complete
    session.execute(delete(JobNode).where(*_slot(job_id, attempt),
                                          JobNode.lease_expires_at < now))
    slots = nodes_of(session, job_id, attempt)
    if len(slots) < job.nodes:
        return False
    where: list[Any] = [Job.attempt == attempt - 1]
    if cap > 0:
        other = aliased(Job)
        running = (select(func.count()).select_from(other)
                   .where(other.owner_id == job.owner_id, other.status.in_(ACTIVE))
                   .scalar_subquery())
        session.execute(select(User.id).where(User.id == job.owner_id)
                        .with_for_update(key_share=True))
        where.append(running < cap)
    ws = world_size(job.nodes, job.gpus, job.procs)
    event = {"attempt": attempt, "worker": slots[0].worker, "world_size": ws,
             "nodes": [{"node_rank": n.node_rank, "worker": n.worker, "addr": n.addr}
                       for n in slots],
             "rendezvous": f"{slots[0].addr}:{slots[0].port}"}
    if not transition(session, job_id, CLAIM, extra_where=where, event=event,
                      attempt=attempt, lease_owner=slots[0].worker,
                      lease_expires_at=now + timedelta(seconds=lease_s),
                      started_at=func.coalesce(Job.started_at, now), cancel_requested=False):
        return False
    session.execute(update(JobNode).where(*_slot(job_id, attempt))  # the running lease
                    .values(lease_expires_at=now + timedelta(seconds=lease_s)))
    if len({n.host for n in slots}) > 1 and any(_loopback(n.addr) for n in slots):
        append_events(session, job_id, [("log", now.timestamp(), {
            "event": "gang", "lines": ["warning: the nodes run on different hosts but "
            f"{', '.join(sorted({n.addr for n in slots if _loopback(n.addr)}))} is a loopback "
            "address: set LIBREYOLO_WORKER_ADDR on each worker host to the address the "
            "others reach it at, or the rendezvous cannot join"]})])
    return True


def gather_step(session: Session, claim: Claim, *, worker_id: str, lease_s: float,
                cap: int) -> tuple[Literal["running", "waiting", "gone"], int]:
    """One poll of a worker waiting for its gang: renew its slot's lease, start the job if
    every slot is held (a start that a race left undone), and say where the job stands.
    Commits.

    Returns:
        ``("running", nodes)`` once the job runs at the claim's attempt; ``("waiting",
        held)`` with the slots held now; ``("gone", 0)`` when the slot is no longer this
        worker's (it expired and was taken) or the job left the queue otherwise (a cancel).
    """
    now = utcnow()
    mine = session.execute(update(JobNode)
                           .where(*_slot(claim.job_id, claim.attempt, claim.node_rank, worker_id))
                           .values(lease_expires_at=now + timedelta(
                               seconds=min(lease_s, GATHER_LEASE_S)))
                           .returning(JobNode.node_rank)).first() is not None
    job = session.get(Job, claim.job_id)
    if not mine or job is None:
        session.commit()
        return "gone", 0
    if job.status in ACTIVE and job.attempt == claim.attempt:
        session.commit()
        return "running", claim.nodes
    if job.status != JobStatus.QUEUED or job.attempt != claim.attempt - 1:
        session.commit()
        return "gone", 0
    if start_gang(session, job_id=claim.job_id, attempt=claim.attempt, cap=cap, lease_s=lease_s):
        session.commit()
        return "running", claim.nodes
    held = session.scalar(select(func.count()).select_from(JobNode)
                          .where(*_slot(claim.job_id, claim.attempt)))
    session.commit()
    return "waiting", int(held or 0)


def release_slot(session: Session, claim: Claim, *, worker_id: str, reason: str) -> bool:
    """Give back this worker's slot of a job that has not started, with a ``log`` event
    saying why (the job stays queued). Commits.

    Returns:
        True when the slot was this worker's and the job had not started with it.
    """
    job = session.get(Job, claim.job_id)
    if job is None or job.status != JobStatus.QUEUED or job.attempt != claim.attempt - 1:
        session.rollback()
        return False
    gone = session.execute(delete(JobNode).where(
        *_slot(claim.job_id, claim.attempt, claim.node_rank, worker_id))
        .returning(JobNode.node_rank)).first() is not None
    if gone:
        append_events(session, claim.job_id, [("log", utcnow().timestamp(),
                                               {"event": "gang", "lines": [reason]})])
    session.commit()
    return bool(gone)


def renew_node(session: Session, *, job_id: str, attempt: int, node_rank: int, worker_id: str,
               lease_s: float) -> tuple[str, bool] | None:
    """Renew a running node's slot lease. Does not commit.

    Returns:
        ``(status, cancel_requested)`` of the job while it is running or cancelling at
        ``attempt``; None when the attempt is over for this node (the job was re-queued,
        ended, or the slot is not this worker's).
    """
    renewed = session.execute(update(JobNode)
                              .where(*_slot(job_id, attempt, node_rank, worker_id))
                              .values(lease_expires_at=utcnow() + timedelta(seconds=lease_s))
                              .returning(JobNode.node_rank)).first() is not None
    row = session.execute(select(Job.status, Job.cancel_requested, Job.attempt)
                          .where(Job.id == job_id)).first()
    if not renewed or row is None or row[0] not in ACTIVE or row[2] != attempt:
        return None
    return row[0], bool(row[1])


def record_node_pid(session: Session, *, job_id: str, attempt: int, node_rank: int,
                    worker_id: str, pid: int) -> None:
    """Store the pid (process group) of a node's engine in its slot. Does not commit."""
    session.execute(update(JobNode).where(*_slot(job_id, attempt, node_rank, worker_id))
                    .values(pid=pid, host=socket.gethostname()))


def record_node_exit(session: Session, *, job_id: str, attempt: int, node_rank: int,
                     worker_id: str, exit_code: int, stop: str | None, detail: str) -> None:
    """Write how a node's engine ended into its slot (node 0's worker reads it). Does not
    commit."""
    session.execute(update(JobNode).where(*_slot(job_id, attempt, node_rank, worker_id))
                    .values(exit_code=exit_code, stop=stop, detail=detail[-4000:],
                            exited_at=utcnow()))


def lost_nodes(session: Session, *, job_id: str, attempt: int, now: datetime | None = None
               ) -> list[tuple[NodeView, str]]:
    """Nodes other than 0 of a running attempt that stop it: an engine that exited with a
    code other than 0 (or stopped by its worker), or a slot whose lease expired (its worker
    died). Returns ``(node, why)`` pairs, by node rank."""
    now = now or utcnow()
    out = []
    for n in nodes_of(session, job_id, attempt):
        if n.node_rank == 0:
            continue
        if n.exit_code is not None and (n.exit_code != 0 or n.stop):
            why = f"its engine {'was stopped (' + n.stop + ')' if n.stop else 'failed'}, " \
                  f"exit code {n.exit_code}"
            # lines with a word in them: torchrun's failure report ends with a rule of '='
            last = [ln for ln in (n.detail or "").splitlines() if any(c.isalnum() for c in ln)]
            if last and not n.stop:
                why += f"; its log ends: {last[-1].strip()[:300]}"
            out.append((n, why))
        elif n.exit_code is None and n.lease_expires_at < now:
            out.append((n, "its node lease expired (worker lost)"))
    return out
