"""The worker's side of a multi-node job: waiting for the gang, launching one node, and the
watch loop of a node other than 0 (:mod:`service.gang` holds the rows).

Node 0's worker runs the job as a one-node job does (:mod:`worker.runner`: it holds the
job's lease, moves the events into ``job_events`` and finishes the job) and also watches
the other nodes (:class:`Peers`). Each other node's worker only runs its engine
(:func:`follow`): it renews its slot's lease, stops its engine when the attempt is over for
it (cancel, re-queue, end) or its worker shuts down, and writes how its engine ended into
its slot, where node 0's worker reads it.

Per-node files in the job folder (one folder on the shared artifact store): node 0 keeps
``job.json``, ``train.log`` and ``engine_error.json``; node ``r`` writes
``job.node<r>.json``, ``train.node<r>.log`` and ``engine_error.node<r>.json``.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service import gang
from service.db.models import Job, JobNode
from service.gang import Claim, NodeAddress, NodeView
from service.lifecycle import JobStatus
from service.outage import is_outage
from service.scheduler import owner_cap
from service.settings import Settings
from worker.launch import NodeLaunch
from worker.outcome import CANCEL, WORKER_SHUTDOWN
from worker.process import EngineProcess, kill_leftovers
from worker.supervise import Outage

__all__ = ["ATTEMPT_OVER", "NODE_LOST", "Peers", "address", "follow", "gather", "kill_earlier",
           "node_files", "node_launch"]

log = logging.getLogger(__name__)

#: why node 0's worker stopped its engine: another node was lost
NODE_LOST = "node lost"
#: why another node's worker stopped its engine: the attempt is over (re-queued or ended)
ATTEMPT_OVER = "attempt over"


def address(settings: Settings) -> NodeAddress | None:
    """This worker's :class:`~service.gang.NodeAddress` (``worker_addr`` and a free port
    there); None, with an error logged, when ``worker_addr`` is not an address of this
    host (the worker then takes no multi-node job)."""
    try:
        port = gang.free_port(settings.worker_addr)
    except OSError as exc:
        log.error("worker_addr %r cannot be bound here (%s): this worker takes no node of a "
                  "multi-node job; set LIBREYOLO_WORKER_ADDR to this host's address",
                  settings.worker_addr, exc)
        return None
    return NodeAddress(socket.gethostname(), settings.worker_addr, port)


def gather(claim: Claim, *, settings: Settings, sessions: sessionmaker[Session], worker_id: str,
           stop: threading.Event | None, resend: Callable[[], None] | None) -> bool:
    """Wait (at most ``gang_wait_s``) until the gang of ``claim``'s job is complete and the
    job runs; release the slot on a timeout or a worker shutdown (a ``gang`` log event says
    why; the job stays queued and ``resend`` puts a wake-up back on the queue).

    Returns:
        True when the job runs with this worker as node ``claim.node_rank``.
    """
    deadline = time.monotonic() + settings.gang_wait_s
    every = min(settings.heartbeat_s, 1.0)
    held = 0
    while True:
        with sessions() as s:
            owner = s.scalar(select(Job.owner_id).where(Job.id == claim.job_id))
            cap = owner_cap(s, owner, settings) if owner else 0
            state, held = gang.gather_step(s, claim, worker_id=worker_id,
                                           lease_s=settings.lease_s, cap=cap)
        if state == "running":
            return True
        if state == "gone":
            log.info("job %s: node slot %d gone (the job left the queue, or the slot expired)",
                     claim.job_id, claim.node_rank)
            return False
        why = None
        if stop is not None and stop.is_set():
            why = f"worker {worker_id} shutting down: node slot {claim.node_rank} released"
        elif time.monotonic() > deadline:
            why = (f"gang wait: {held} of {claim.nodes} nodes after {settings.gang_wait_s:g} s "
                   f"(gang_wait_s); {worker_id} released node slot {claim.node_rank}; the "
                   "job stays queued")
        if why is not None:
            log.warning("job %s: %s", claim.job_id, why)
            with sessions() as s:
                released = gang.release_slot(s, claim, worker_id=worker_id, reason=why)
            if released and resend is not None:
                try:
                    resend()
                except Exception:
                    log.exception("job %s: could not re-send (the reaper will)", claim.job_id)
            return False
        time.sleep(every)


def node_files(job_dir: Path, node_rank: int) -> tuple[Path, Path, Path]:
    """``(spec, log, engine error file)`` of node ``node_rank`` in the job folder."""
    if node_rank == 0:
        return job_dir / "job.json", job_dir / "train.log", job_dir / "engine_error.json"
    return (job_dir / f"job.node{node_rank}.json", job_dir / f"train.node{node_rank}.log",
            job_dir / f"engine_error.node{node_rank}.json")


def node_launch(sessions: sessionmaker[Session], claim: Claim, settings: Settings) -> NodeLaunch:
    """The torchrun arguments of this node: node 0's published rendezvous endpoint.

    Raises:
        LookupError: node 0's slot (or its port) is missing.
    """
    with sessions() as s:
        zero = s.scalar(select(JobNode).where(JobNode.job_id == claim.job_id,
                                              JobNode.attempt == claim.attempt,
                                              JobNode.node_rank == 0))
        if zero is None or zero.port is None:
            raise LookupError(f"job {claim.job_id} attempt {claim.attempt}: node 0 published "
                              "no rendezvous endpoint")
        endpoint = f"{zero.addr}:{zero.port}"
    return NodeLaunch(nnodes=claim.nodes, node_rank=claim.node_rank, endpoint=endpoint,
                      run_id=f"{claim.job_id}-{claim.attempt}", local_addr=settings.worker_addr,
                      join_timeout_s=settings.gang_wait_s)


def kill_earlier(sessions: sessionmaker[Session], job_id: str, attempt: int,
                 job_dir: Path) -> int:
    """SIGKILL what earlier attempts of ``job_id`` left running on this host (every node's
    engine pid recorded here; :func:`worker.process.kill_leftovers`)."""
    host = socket.gethostname()
    with sessions() as s:
        pids = list(s.scalars(select(JobNode.pid).where(
            JobNode.job_id == job_id, JobNode.attempt < attempt, JobNode.host == host,
            JobNode.pid.is_not(None))))
    return sum(kill_leftovers(pid, job_dir) for pid in pids)


def _tail(path: Path, lines: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 16384))
            return b"\n".join(f.read().splitlines()[-lines:]).decode("utf-8", "replace")
    except OSError:
        return ""


class Peers:
    """Node 0's view of the other nodes of its attempt: who was lost, and why."""

    def __init__(self, sessions: sessionmaker[Session], claim: Claim, worker_id: str,
                 settings: Settings):
        self.sessions, self.claim, self.worker_id, self.settings = sessions, claim, worker_id, settings
        self.lost: tuple[NodeView, str] | None = None

    def check(self) -> tuple[NodeView, str] | None:
        """Renew node 0's slot and look for a lost node (kept in :attr:`lost`)."""
        with self.sessions() as s:
            gang.renew_node(s, job_id=self.claim.job_id, attempt=self.claim.attempt,
                            node_rank=0, worker_id=self.worker_id, lease_s=self.settings.lease_s)
            found = gang.lost_nodes(s, job_id=self.claim.job_id, attempt=self.claim.attempt)
            s.commit()
        if found and self.lost is None:
            self.lost = found[0]
        return self.lost

    def wait_for_report(self, renew: Callable[[], Any], timeout_s: float) -> tuple[NodeView, str] | None:
        """After node 0's engine failed by itself: wait (renewing the job's lease with
        ``renew``) until another node reports its end or is lost, at most ``timeout_s``.
        Returns the lost node, or None when every other node ended cleanly or none said."""
        deadline = time.monotonic() + timeout_s
        while self.lost is None and time.monotonic() < deadline:
            renew()
            if self.check() is not None:
                break
            with self.sessions() as s:
                views = gang.nodes_of(s, self.claim.job_id, self.claim.attempt)
            if all(v.exit_code is not None for v in views if v.node_rank != 0):
                break
            time.sleep(min(self.settings.heartbeat_s, 1.0))
        return self.lost

    def describe(self) -> str:
        """``node <r> (worker <w>) lost: <why>`` of :attr:`lost`."""
        if self.lost is None:
            return "no node lost"
        node, why = self.lost
        return f"node {node.node_rank} (worker {node.worker}) lost: {why}"


def follow(engine: EngineProcess, claim: Claim, *, settings: Settings,
           sessions: sessionmaker[Session], worker_id: str, stop: threading.Event | None,
           log_path: Path) -> str:
    """Watch node ``claim.node_rank``'s engine (a node other than 0) until it exits: renew
    the slot's lease; stop the engine (SIGTERM, then SIGKILL after ``grace_s``) on a cancel,
    when the attempt is over for this node (the job re-queued, failed or lost its other
    nodes; after a success the engine gets ``grace_s`` to end by itself), or on a worker
    shutdown. Then write the exit into the slot.

    Returns:
        ``"node <r> exited <code>"``.
    """
    next_beat = time.monotonic()
    over_at: float | None = None
    outage = Outage(claim.job_id, settings.lease_s)  # the database may be away a while
    while True:
        rc = engine.poll()
        now = time.monotonic()
        if outage.due(now):
            try:
                renew = now >= next_beat
                if renew:
                    next_beat = now + settings.heartbeat_s
                beat, status = _read_slot(sessions, claim, worker_id, settings, renew=renew)
                over_at = _stop_when_over(engine, beat, status, rc, now=now, over_at=over_at,
                                          grace_s=settings.grace_s)
                outage.up(now)
            except Exception as exc:  # keep the engine, retry
                if not is_outage(exc):
                    raise
                outage.failed(now, exc)
        if stop is not None and stop.is_set():
            engine.terminate(WORKER_SHUTDOWN)
        engine.kill_if_overdue(now=now, grace_s=settings.grace_s, rc=rc)
        if rc is not None:
            break
        time.sleep(settings.poll_interval_s)
    engine.kill_group()
    detail = _tail(log_path, settings.log_tail_lines)

    def record() -> None:
        with sessions() as s:
            gang.record_node_exit(s, job_id=claim.job_id, attempt=claim.attempt,
                                  node_rank=claim.node_rank, worker_id=worker_id, exit_code=rc,
                                  stop=engine.stop_reason, detail=detail)
            s.commit()

    outage.retry(record)
    log.info("job %s: node %d engine exited %s (%s)", claim.job_id, claim.node_rank, rc,
             engine.stop_reason or "by itself")
    return f"node {claim.node_rank} exited {rc}"


def _read_slot(sessions: sessionmaker[Session], claim: Claim, worker_id: str,
               settings: Settings, *, renew: bool) -> tuple[tuple[str, bool] | None, str | None]:
    """One look of :func:`follow` at the job: with ``renew``, renew the node slot's lease
    (:func:`service.gang.renew_node`); else only read the job's status and attempt.

    Returns:
        ``(beat, status)``: ``beat`` is ``(status, cancel_requested)`` while the attempt
        goes on for this node, None when it is over (the slot's lease lost, the job
        re-queued, ended or on another attempt); ``status`` the job's (None: no such job).
    """
    if renew:
        with sessions() as s:
            beat = gang.renew_node(s, job_id=claim.job_id, attempt=claim.attempt,
                                   node_rank=claim.node_rank, worker_id=worker_id,
                                   lease_s=settings.lease_s)
            status = s.scalar(select(Job.status).where(Job.id == claim.job_id))
            s.commit()
        return beat, status
    with sessions() as s:
        row = s.execute(select(Job.status, Job.attempt).where(Job.id == claim.job_id)).first()
    status = row[0] if row is not None else None
    over = row is None or row[1] != claim.attempt or status not in (
        JobStatus.RUNNING, JobStatus.CANCELLING)
    return (None if over or status is None else (status, False)), status


def _stop_when_over(engine: EngineProcess, beat: tuple[str, bool] | None, status: str | None,
                    rc: int | None, *, now: float, over_at: float | None,
                    grace_s: float) -> float | None:
    """Stop a node's engine on a cancel, or when the attempt is over for it (after a
    success the engine gets ``grace_s`` to end by itself, counted from ``over_at``).

    Returns:
        ``over_at``: when this node first saw its succeeded attempt over (``now`` the first
        time; None otherwise).
    """
    if beat is not None and beat[0] == JobStatus.CANCELLING:
        engine.terminate(CANCEL)
    elif beat is None and rc is None:
        if status != JobStatus.SUCCEEDED:
            engine.terminate(ATTEMPT_OVER)
        elif over_at is None:
            over_at = now
        elif now - over_at > grace_s:
            engine.terminate(ATTEMPT_OVER)
    return over_at
