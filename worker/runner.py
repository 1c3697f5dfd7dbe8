"""Run one job: claim, prepare, launch, watch (tail, heartbeat, cancel), finish.

The database is the source of truth. A ``run_job`` message only wakes the worker:
:func:`run_next` claims the job the scheduler picks in the message's queue
(:mod:`service.scheduler`: ``queued -> running``, ``attempt += 1``, a lease, atomically);
a message that finds no job it may start is used up and nothing happens. When a job ends,
the worker sends wake-ups for its owner's queued jobs, which the owner's cap may have held
back. :func:`run_job` runs one given job (a direct run). The engine runs as a subprocess in
its own session (process group); this process never imports torch.

A multi-node job's claim is one node slot (:mod:`service.gang`): the worker waits for the
gang (:func:`worker.nodes.gather`), then runs its node. Node 0 runs the job as below and
also watches the other nodes; a lost node stops the attempt, which is re-queued as a whole
(:func:`service.job_store.node_lost`). The other nodes only run their engine
(:func:`worker.nodes.follow`).

The parts: :mod:`worker.process` (start the engine, the stop sequence, kill what is left),
:mod:`worker.tail` (the engine's files into ``job_events`` and the job's progress),
:mod:`worker.outcome` (exit code and stop reason -> final status and error),
:mod:`worker.result` (the result summary). This module holds the job's row: the claim,
lease, event writes, hand-back and finish, and the watch loop that drives the parts.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from libreyolo_core.engine.fence import FENCE_FILE_ENV
from libreyolo_core.engine.fence import TOKEN_ENV as FENCE_TOKEN_ENV
from libreyolo_core.engine.watchdog import FACTOR_ENV as HANG_FACTOR_ENV
from libreyolo_core.engine.watchdog import MIN_S_ENV as HANG_MIN_S_ENV
from libreyolo_core.profiler.preflight import CURRENCY_ENV, PRICE_ENV
from service import gang, job_store
from service.db.models import Job, utcnow
from service.ends import INFRASTRUCTURE, JOB
from service.gang import Claim
from service.lifecycle import TERMINAL, JobStatus
from service.ops import append_events
from service.outage import is_outage
from service.scheduler import wake_gangs, wake_targets
from service.settings import Settings
from service.storage import ArtifactStore, artifact_kind, sha256_file
from service.storage.roots import data_refusal
from worker import nodes
from worker.launch import CommandBuilder, NodeLaunch, build_command, build_env, job_spec, world_size
from worker.launcher import (
    ClusterNews,
    Engine,
    Launcher,
    LaunchRequest,
    LocalLauncher,
    make_launcher,
)
from worker.outcome import (
    CANCEL,
    ENGINE_ERROR_FILE,
    LEASE_LOST,
    TIME_BUDGET,
    WORKER_SHUTDOWN,
    Outcome,
    after_exit,
    exit_outcome,
    read_engine_error,
)
from worker.process import EngineProcess, kill_leftovers
from worker.result import result_summary
from worker.supervise import Outage
from worker.tail import Observed, Tail

__all__ = ["low_disk", "run_job", "run_next", "wake_gangs_on"]

log = logging.getLogger(__name__)


class _Run:
    """State of one attempt of one job in this worker."""

    def __init__(self, job: Job, *, settings: Settings, sessions: sessionmaker[Session],
                 worker_id: str, store: ArtifactStore):
        self.job_id, self.settings, self.sessions = job.id, settings, sessions
        self.worker_id, self.store = worker_id, store
        self.job_dir = store.job_dir(job.id)
        self.run_dir = store.run_dir(job.id)
        # this attempt's fence token (libreyolo_core.engine.fence): unique per attempt
        self.token = f"{job.attempt}.{secrets.token_hex(6)}"
        self.events = Tail(self.run_dir / "events.jsonl", job.events_offset)
        self.log = Tail(store.log_path(job.id), job.log_offset)
        self.seen = Observed(job.progress, log_tail_lines=settings.log_tail_lines,
                             attempt_token=self.token)
        self.kind = job.kind
        # rows read but not yet committed (a database outage): written first next time
        self._pending: tuple[list[Any], int, int] | None = None
        self._news: list[ClusterNews] = []  # the cluster's news not yet written (a cluster launcher)

    # -- database (through service.job_store) ------------------------------------------
    def _mine(self) -> list[Any]:
        return job_store.held_by(self.worker_id)

    def _lease(self) -> dict[str, Any]:
        return {"lease_expires_at": utcnow() + timedelta(seconds=self.settings.lease_s)}

    def heartbeat(self) -> tuple[str, bool] | None:
        """Renew the lease; returns (status, cancel_requested), or None if the lease is lost."""
        with self.sessions() as s:
            beat = job_store.renew_lease(session=s, job_id=self.job_id, worker_id=self.worker_id,
                                         lease_s=self.settings.lease_s)
            s.commit()
        return beat

    def status(self) -> str | None:
        """The job's status now (a read, for the cancel poll)."""
        with self.sessions() as s:
            return s.scalar(select(Job.status).where(Job.id == self.job_id))

    def pump(self) -> bool | None:
        """Move new engine events and log lines into job_events (one transaction).

        Returns:
            True if something was written, False if nothing new, None if the lease is lost.
        """
        if self._pending is not None:  # read before an outage: the same rows, once
            batch, ev_off, log_off = self._pending
        else:
            lines, ev_off = self.events.read()
            log_lines, log_off = self.log.read()
            if not lines and not log_lines:
                return False
            batch = self.seen.take(lines, log_lines, start=self.events.offset)
            self._pending = (batch, ev_off, log_off)
        with self.sessions() as s:
            last = append_events(s, self.job_id, batch, where=self._mine(),
                                 events_offset=ev_off, log_offset=log_off,
                                 progress=self.seen.progress or None, **self._lease())
            s.commit()
        self._pending = None
        if last is None:
            return None
        self.events.offset, self.log.offset = ev_off, log_off
        return True

    def cluster_news(self, news: ClusterNews | None) -> None:
        """Write the cluster's view of the attempt (``jobs.cluster``) and, when the cluster
        re-ran the allocation, count attempt N+1 (:func:`service.job_store.cluster_restarted`);
        news that a database outage kept back goes first."""
        if news is not None:
            self._news.append(news)
        while self._news:
            item = self._news[0]
            with self.sessions() as s:
                if item.restarted:
                    log.warning("job %s: %s", self.job_id, item.restarted)
                    job_store.cluster_restarted(session=s, job_id=self.job_id,
                                                worker_id=self.worker_id, why=item.restarted,
                                                cluster=item.cluster, store=self.store)
                else:
                    job_store.set_cluster(session=s, job_id=self.job_id,
                                          worker_id=self.worker_id, cluster=item.cluster)
                s.commit()
            self._news.pop(0)

    def record_pid(self, pid: int) -> None:
        with self.sessions() as s:
            s.execute(update(Job).where(Job.id == self.job_id, *self._mine())
                      .values(pid=pid, host=socket.gethostname()))
            s.commit()

    def finish(self, status: JobStatus, *, result: dict[str, Any] | None,
               error: dict[str, Any] | None, event: dict[str, Any],
               end_class: str | None = None, why: str | None = None) -> bool:
        """Record artifacts and the final status (only while this worker holds the lease)."""
        artifacts = []
        for rel, path in self.store.list_files(self.job_id):
            try:
                artifacts.append({"job_id": self.job_id, "path": rel,
                                  "kind": self.seen.artifact_kinds.get(rel) or artifact_kind(rel),
                                  "size_bytes": path.stat().st_size, "sha256": sha256_file(path),
                                  "created_at": utcnow()})
            except OSError:
                continue
        with self.sessions() as s:
            ok = job_store.finish(session=s, job_id=self.job_id, worker_id=self.worker_id,
                                  status=status, result=result, error=error, event=event,
                                  progress=self.seen.progress or None, artifacts=artifacts,
                                  end_class=end_class, why=why)
            if ok:
                s.commit()
            else:
                s.rollback()
        return ok

    def hand_back(self, reason: str) -> bool:
        """Give the job back (worker shutdown): :func:`service.job_store.hand_back`; the next
        attempt resumes from last.pt and this one does not count."""
        with self.sessions() as s:
            ok = job_store.hand_back(session=s, job_id=self.job_id, worker_id=self.worker_id,
                                     reason=reason, progress=self.seen.progress or None)
            s.commit()
        return ok


def _claim(sessions: sessionmaker[Session], settings: Settings, worker_id: str, *,
           queue: str | None = None, job_id: str | None = None) -> Claim | None:
    """Claim the best eligible job of ``queue``, or only ``job_id``
    (:func:`service.job_store.claim`; a node slot of a multi-node job when this worker's
    ``worker_addr`` works); the claim, or None."""
    where = nodes.address(settings)
    whole = make_launcher(settings).whole  # a cluster launcher claims every node at once
    with sessions() as s:
        return job_store.claim(session=s, settings=settings, worker_id=worker_id, queue=queue,
                               job_id=job_id, where=where, whole=whole)


def run_job(job_id: str, *, settings: Settings, sessions: sessionmaker[Session],
            gpu_ids: Sequence[str] | None = None, worker_id: str | None = None,
            command: CommandBuilder = build_command, stop: threading.Event | None = None,
            on_requeue: Any = None) -> str:
    """Run job ``job_id`` itself to the end, if it is queued and its owner is under their
    cap (a direct run; the ``run_job`` task goes through :func:`run_next`).

    Args:
        settings: lease, heartbeat, poll, grace and artifact settings.
        sessions: database session factory.
        gpu_ids: GPUs this worker owns (``CUDA_VISIBLE_DEVICES`` takes the first ``gpus``).
        worker_id: lease owner name; default ``<host>:<pid>:<thread>``.
        command: builds the engine argv (injectable for tests).
        stop: set when the worker shuts down: the engine is stopped (SIGTERM) and the job
            re-queued to resume elsewhere.
        on_requeue: ``f(job_id, queue, priority)`` sending a ``run_job`` message: after a
            re-queue, and after the job ends for the owner's queued jobs that their cap
            held back (:func:`service.scheduler.wake_targets`).

    Returns:
        The final status, ``"skipped"`` (not queued: duplicate message, cancelled; or its
        owner at their cap) or ``"lost"`` (the lease was taken away, e.g. by the reaper).
    """
    return _run(job_id, pick=False, settings=settings, sessions=sessions, gpu_ids=gpu_ids,
                worker_id=worker_id, command=command, stop=stop, on_requeue=on_requeue)


def run_next(job_id: str, *, settings: Settings, sessions: sessionmaker[Session],
             gpu_ids: Sequence[str] | None = None, worker_id: str | None = None,
             command: CommandBuilder = build_command, stop: threading.Event | None = None,
             on_requeue: Any = None) -> str:
    """The body of the ``run_job`` task: a message for ``job_id`` wakes this worker, and the
    database chooses which job of that job's queue it runs (:func:`service.scheduler.claim`:
    effective priority, then the owner with the fewest running jobs, then the oldest; owners
    at their cap wait). Arguments as :func:`run_job`.

    Returns:
        The final status of the job it ran, ``"skipped"`` when no job of the queue may start
        now (the message is used up; a job held back by its owner's cap gets a new message
        when one of the owner's jobs ends), or ``"lost"``.
    """
    return _run(job_id, pick=True, settings=settings, sessions=sessions, gpu_ids=gpu_ids,
                worker_id=worker_id, command=command, stop=stop, on_requeue=on_requeue)


def _run(job_id: str, *, pick: bool, settings: Settings, sessions: sessionmaker[Session],
         gpu_ids: Sequence[str] | None, worker_id: str | None, command: CommandBuilder,
         stop: threading.Event | None, on_requeue: Any) -> str:
    worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"
    if stop is not None and stop.is_set():
        return _message_back(job_id, sessions, on_requeue)
    low = low_disk(settings)
    if low is not None:
        return _refuse_low_disk(job_id, low, sessions=sessions, worker_id=worker_id,
                                stop=stop, on_requeue=on_requeue, settings=settings)
    claim = _claim_for(job_id, pick, sessions, settings, worker_id)
    job = read_job(sessions, claim.job_id) if claim is not None else None
    if claim is None or job is None:
        return "skipped"
    if not claim.started:
        wake = (job.id, job.queue, job.priority)

        def resend() -> None:
            if on_requeue is not None:
                on_requeue(*wake)

        if not nodes.gather(claim, settings=settings, sessions=sessions, worker_id=worker_id,
                            stop=stop, resend=resend):
            return "skipped"
        job = read_job(sessions, claim.job_id) or job
    status = _start(job, claim, settings=settings, sessions=sessions, gpu_ids=gpu_ids,
                    worker_id=worker_id, command=command, stop=stop, on_requeue=on_requeue)
    if status in TERMINAL and on_requeue is not None:
        _wake_owner(sessions, job.owner_id, on_requeue)
    if claim.nodes > 1 and on_requeue is not None:
        _wake_gang(sessions, job.queue, on_requeue)
    return status


def _message_back(job_id: str, sessions: sessionmaker[Session], on_requeue: Any) -> str:
    """A message this worker took while shutting down (it can be the very job it just
    re-queued): starting an attempt only to kill it would burn one of max_attempts. The
    job stays queued and its message goes back for the next worker. Returns ``skipped``."""
    queued = read_job(sessions, job_id)
    if queued is not None and queued.status == JobStatus.QUEUED and on_requeue is not None:
        on_requeue(job_id, queued.queue, queued.priority)
    log.info("job %s: worker shutting down; message handed back", job_id)
    return "skipped"


def _claim_for(job_id: str, pick: bool, sessions: sessionmaker[Session], settings: Settings,
               worker_id: str) -> Claim | None:
    """The claim of a message: with ``pick``, the scheduler's best job of the queue of
    ``job_id``; else ``job_id`` itself. None (logged) when nothing may start now."""
    if not pick:
        claim = _claim(sessions, settings, worker_id, job_id=job_id)
        if claim is None:
            log.info("job %s is not queued or its owner is at their cap; skipping", job_id)
        return claim
    queue = getattr(read_job(sessions, job_id), "queue", None)
    claim = _claim(sessions, settings, worker_id, queue=queue) if queue else None
    if claim is None:
        log.info("woken by job %s: no job of queue %s may start now", job_id, queue)
    elif claim.job_id != job_id:
        log.info("woken by job %s: the scheduler chose job %s", job_id, claim.job_id)
    return claim


def low_disk(settings: Settings) -> str | None:
    """Why this worker may not start a job now: the disk of ``artifact_root`` has less free
    space than ``min_free_disk_mb`` (checkpoints and logs go there); None when it has room
    (or the check is off, 0)."""
    if settings.min_free_disk_mb <= 0:
        return None
    where = Path(settings.artifact_root)
    while not where.exists() and where != where.parent:
        where = where.parent
    free_mb = shutil.disk_usage(where).free / 2**20
    if free_mb >= settings.min_free_disk_mb:
        return None
    return (f"{free_mb:,.0f} MB free on its disk, below min_free_disk_mb="
            f"{settings.min_free_disk_mb:g}")


def _refuse_low_disk(job_id: str, low: str, *, sessions: sessionmaker[Session], worker_id: str,
                     stop: threading.Event | None, on_requeue: Any, settings: Settings) -> str:
    """A woken worker whose disk is below the floor starts nothing: the queued jobs of the
    message's queue get the reason (their ``waiting`` field, until a claim clears it), the
    wake-up is sent again for a worker with room, and this one waits ``disk_recheck_s``
    before it takes another message (so it does not take that one straight back)."""
    note = f"waiting for a worker with room: worker {worker_id} has {low}"
    log.warning("job %s: not started: %s", job_id, note)
    job = read_job(sessions, job_id)
    if job is None or job.status != JobStatus.QUEUED:
        return "skipped"
    with sessions() as s:
        s.execute(update(Job).where(Job.queue == job.queue, Job.status == JobStatus.QUEUED)
                  .values(waiting_note=note))
        s.commit()
    if on_requeue is not None:
        try:
            on_requeue(job.id, job.queue, job.priority)
        except Exception:
            log.exception("job %s: could not re-send (the reaper will)", job_id)
    (stop or threading.Event()).wait(settings.disk_recheck_s)
    return "skipped"


def _send_wakeups(sessions: sessionmaker[Session], targets: Callable[[Session], list],
                 send: Any, what: str) -> None:
    """Send the wake-ups ``targets(session)`` lists (``(job id, queue, priority)``
    tuples); a failure is logged, not raised (the reaper re-sends), ``what`` names them."""
    try:
        with sessions() as s:
            found = targets(s)
        for target in found:
            send(*target)
    except Exception:
        log.exception("could not send wake-ups for %s (the reaper re-sends)", what)


def _wake_owner(sessions: sessionmaker[Session], owner_id: str, send: Any) -> None:
    """One of ``owner_id``'s jobs ended: a wake-up for each queue holding their queued
    jobs (the cap may have held them back; a spare message is dropped harmlessly)."""
    _send_wakeups(sessions, lambda s: wake_targets(s, owner_id), send, f"user {owner_id}")


def _wake_gang(sessions: sessionmaker[Session], queue: str, send: Any) -> None:
    """A node of a multi-node job ended: one wake-up for the queue's best queued multi-node
    job, if any (its wake-ups may sit with workers that were busy)."""
    _send_wakeups(sessions, lambda s: wake_gangs(s, [queue], limit=1)[:1], send,
                 f"queue {queue}")


def wake_gangs_on(sessions: sessionmaker[Session], queues: Sequence[str], send: Any) -> None:
    """This worker just came online: a wake-up per node of each queued multi-node job of
    ``queues`` (:func:`service.scheduler.wake_gangs`)."""
    _send_wakeups(sessions, lambda s: wake_gangs(s, queues), send, f"queues {list(queues)}")


def _start(job: Job, claim: Claim, *, settings: Settings, sessions: sessionmaker[Session],
           gpu_ids: Sequence[str] | None, worker_id: str, command: CommandBuilder,
           stop: threading.Event | None, on_requeue: Any) -> str:
    """Prepare the run directory of a claimed job (one node of it, for a multi-node job),
    launch the engine and watch it."""
    job_id = job.id
    store = ArtifactStore(settings.artifact_root)
    run = _Run(job, settings=settings, sessions=sessions, worker_id=worker_id, store=store)
    run.job_dir.mkdir(parents=True, exist_ok=True)
    launcher = make_launcher(settings)
    multi = claim.nodes > 1 and not claim.whole  # a gang of our workers
    _clear_earlier(run, job, claim, multi)
    # any earlier attempt (a crash, or a hand-back that did not count) left last.pt
    last_pt = store.last_checkpoint(job_id)
    resume: str | bool = str(last_pt) if last_pt is not None else False
    # the yaml may have changed since the submit; a "Try it" image lies in the job's folder
    refused = None if job.kind == "predict" and store.is_input(job.id, job.data) \
        else data_refusal(job.data, settings)
    if refused is not None:
        return _not_started(run, claim, refused, "data refused")
    spec_path, log_path, error_file = nodes.node_files(run.job_dir, claim.node_rank)
    resume_spec, last = _write_specs(run, job, spec_path, resume, whole=launcher.whole)
    launch: NodeLaunch | None = None
    if multi:
        try:
            launch = nodes.node_launch(sessions, claim, settings)
        except LookupError as exc:
            log.error("job %s: %s", job_id, exc)
            return _not_started(run, claim, str(exc), "launch failed")
    argv = command(spec_path, world_size(job.gpus, job.procs), settings, launch)
    env = _engine_env(run, job, claim, gpu_ids, error_file)
    where = f" node {claim.node_rank} of {claim.nodes}" if multi else ""
    log.info("job %s attempt %d%s: %s", job_id, job.attempt, where, " ".join(argv))
    request = LaunchRequest(job_id=job_id, attempt=job.attempt, job_dir=run.job_dir,
                            spec_path=spec_path, log_path=log_path, argv=argv, env=env,
                            nodes=job.nodes, gpus=job.gpus, procs=job.procs,
                            priority=job.priority, resume_spec=resume_spec, last_pt=last,
                            previous=job.cluster)
    try:
        engine = launcher.launch(request)
    except OSError as exc:
        return _not_started(run, claim, f"could not start the engine: {exc}", "launch failed")
    if multi:
        with sessions() as s:
            gang.record_node_pid(s, job_id=job_id, attempt=claim.attempt,
                                 node_rank=claim.node_rank, worker_id=worker_id, pid=engine.pid)
            s.commit()
    if claim.node_rank:
        return nodes.follow(cast(EngineProcess, engine), claim, settings=settings, sessions=sessions,
                            worker_id=worker_id, stop=stop, log_path=log_path)
    run.record_pid(engine.pid)
    peers = nodes.Peers(sessions, claim, worker_id, settings) if multi else None
    return _watch(run, engine, job, stop, on_requeue, peers, launcher)


def _clear_earlier(run: _Run, job: Job, claim: Claim, multi: bool) -> None:
    """Before an attempt starts: kill the engine process groups an earlier attempt left
    (a crash or a hand-back; node 0 by the row's pid, every node of a gang by its slot's),
    and on node 0 raise the fence (:func:`_raise_fence`)."""
    leftovers = kill_leftovers(job.pid, run.job_dir) if job.pid and claim.node_rank == 0 else 0
    if multi:
        leftovers += nodes.kill_earlier(run.sessions, job.id, claim.attempt, run.job_dir)
    if leftovers:  # process groups of an earlier attempt (crash or hand-back)
        log.warning("job %s: killed %d leftover engine processes", job.id, leftovers)
    if claim.node_rank == 0:  # rank 0 (on node 0) writes every event and checkpoint
        # before last.pt is chosen: from here on an earlier attempt's engine, on any host,
        # writes nothing; what it wrote before is this attempt's starting point
        _raise_fence(run.job_dir / FENCE_FILE, run.token)
        run.seen.fence_offset = _size(run.run_dir / "events.jsonl")


def _not_started(run: _Run, claim: Claim, reason: str, event_reason: str) -> str:
    """An attempt that could not start: node 0 fails the job with ``reason`` (its
    ``status`` event says ``event_reason``); another node only says so.

    Returns:
        ``failed``, or ``"node <r>: <reason>"`` for a node other than 0.
    """
    if claim.node_rank:
        return f"node {claim.node_rank}: {reason}"
    run.finish(JobStatus.FAILED, result=None, error={"reason": reason, "exit_code": None},
               event={"reason": event_reason})
    return JobStatus.FAILED


def _write_specs(run: _Run, job: Job, spec_path: Path, resume: str | bool, *,
                 whole: bool) -> tuple[Path | None, Path | None]:
    """Write the engine's job spec to ``spec_path``; for a ``whole`` launcher (a cluster,
    which may re-run the allocation) also ``job.resume.json``, resuming from ``last.pt``.

    Returns:
        ``(resume spec, last.pt)`` of a whole launcher; ``(None, None)`` otherwise.
    """
    settings = run.settings
    spec = job_spec(kind=job.kind, model=job.model, data=job.data, params=job.params,
                    gpus=job.gpus, job_dir=run.job_dir, resume=resume, options=job.options,
                    cache_dir=settings.cache_root)
    spec.write(spec_path)
    if not whole:
        return None, None
    last = run.run_dir / "weights" / "last.pt"
    resume_spec = run.job_dir / "job.resume.json"
    job_spec(kind=job.kind, model=job.model, data=job.data, params=job.params,
             gpus=job.gpus, job_dir=run.job_dir, resume=str(last),
             options=job.options).write(resume_spec)
    return resume_spec, last


def _engine_env(run: _Run, job: Job, claim: Claim, gpu_ids: Sequence[str] | None,
                error_file: Path) -> dict[str, str]:
    """The engine's environment: its devices (:func:`build_env`), node 0's fence, the
    error file (a previous attempt's deleted), the hang watchdog, the resume hint of a
    stopped run's log, the preflight's price, the tracker's tags and MLflow's URI."""
    settings, job_id = run.settings, job.id
    env = build_env(gpu_ids, job.gpus)
    if claim.node_rank == 0:
        env[FENCE_TOKEN_ENV], env[FENCE_FILE_ENV] = run.token, str(run.job_dir / FENCE_FILE)
    error_file.unlink(missing_ok=True)  # a previous attempt's
    env["LIBREYOLO_ERROR_FILE"] = str(error_file)
    env[HANG_FACTOR_ENV] = f"{settings.hang_factor:g}"  # the engine's hang watchdog
    env[HANG_MIN_S_ENV] = f"{settings.hang_min_s:g}"
    # what a stopped run's log tells a remote user (not resume=<server path>)
    # (a cancel is the user's; a worker that shuts down re-queues the job itself)
    env["LIBREYOLO_RESUME_HINT"] = (f"`libreyolo-service jobs resume {job_id}` (POST "
                                    f"/v1/jobs/{job_id}/resume, or Resume on its page) if "
                                    "it was cancelled; when its worker shut down, the "
                                    "service re-queues it by itself")
    if settings.gpu_hour_price is not None:  # a preflight's cost estimate
        env[PRICE_ENV], env[CURRENCY_ENV] = f"{settings.gpu_hour_price:g}", settings.currency
    env["LIBREYOLO_JOB_ID"], env["LIBREYOLO_USER"] = job.id, job.owner_id  # tracker tags
    if settings.mlflow_tracking_uri:  # every job logs its run (libreyolo_core/engine/trackers.py)
        env["MLFLOW_TRACKING_URI"] = settings.mlflow_tracking_uri
    return env


#: the job folder's fence file: the token of the attempt that holds the job
FENCE_FILE = "attempt.fence"


def _raise_fence(path: Path, token: str) -> None:
    """Make ``token`` the job's current attempt (atomically): from now on an engine of an
    earlier attempt, on any host that shares the artifact store, writes no event and no
    checkpoint (:func:`libreyolo_core.engine.fence.check`)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    tmp.write_text(token + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _watch(run: _Run, engine: Engine, job: Job, stop: threading.Event | None,
           on_requeue: Any, peers: nodes.Peers | None = None,
           launcher: Launcher | None = None) -> str:
    """Pump events, renew the lease and poll for a cancel until the engine exits; stop it
    (:class:`worker.process.EngineProcess`) on a cancel, a worker shutdown, the time budget,
    a lost lease, or (node 0 of a multi-node job, ``peers``) a lost node. Returns the job's
    status as :func:`run_job` does."""
    launcher = launcher or LocalLauncher()
    outage = Outage(run.job_id, run.settings.lease_s)
    rc, lost = _watch_loop(run, engine, job, stop, peers, launcher, outage)
    engine.kill_group()  # loader workers or ranks left behind
    lost = _drain_events(run, outage, lost)
    if peers is not None:  # node 0's exit, as the other nodes record theirs
        _record_node0_exit(run, peers, engine, rc, outage)
    action = after_exit(lost=lost, stop_reason=engine.stop_reason)
    if action == "lost":
        return "lost"
    if peers is not None and action == "finish" and _node_was_lost(run, peers, engine, rc):
        return _node_lost(run, job, peers, on_requeue)
    if action == "hand back" and _handed_back(run, job, outage, on_requeue):
        return JobStatus.QUEUED
    outcome = exit_outcome(rc, stop_reason=engine.stop_reason, run_end=run.seen.run_end,
                           engine_error=read_engine_error(run.job_dir / ENGINE_ERROR_FILE),
                           log_tail=run.seen.log_tail, time_budget_s=job.time_budget_s)
    outcome = launcher.classify(engine, outcome)  # the cluster's own ends (Slurm's states)
    outage.retry(lambda: run.cluster_news(launcher.watch(engine)))
    if outcome.status == JobStatus.FAILED and outcome.end_class == INFRASTRUCTURE:
        return _requeue_infra(run, job, outcome, outage, on_requeue)
    result = result_summary(run.seen, run.run_dir, run.kind)
    if not outage.retry(lambda: run.finish(outcome.status, result=result, error=outcome.error,
                                           event=outcome.event, end_class=outcome.end_class,
                                           why=outcome.why)):
        return "lost"
    log.info("job %s: %s (exit %s)", run.job_id, outcome.status, rc)
    return outcome.status


def _watch_loop(run: _Run, engine: Engine, job: Job, stop: threading.Event | None,
                peers: nodes.Peers | None, launcher: Launcher,
                outage: Outage) -> tuple[int, bool]:
    """:func:`_watch`'s loop, until the engine exits: every ``poll_interval_s`` a check-in
    (:func:`_check_in`, while the database answers) and the stops (a lost lease, a worker
    shutdown, the time budget; SIGKILL after ``grace_s``).

    Returns:
        ``(exit code, lost)``: ``lost`` when the lease was lost on the way.
    """
    settings = run.settings
    started = time.monotonic()
    next_beat = started + settings.heartbeat_s
    lost = False
    while True:
        rc = engine.poll()
        now = time.monotonic()
        if outage.due(now):
            try:
                now, next_beat, lost_now = _check_in(run, engine, launcher, peers, next_beat,
                                                     beat_now=outage.down)
                lost = lost or lost_now
                outage.up(now)
            except Exception as exc:  # the database is away: keep the engine, retry
                if not is_outage(exc):
                    raise
                outage.failed(now, exc)
        if lost:
            log.warning("job %s: lease lost; stopping the engine", run.job_id)
            engine.terminate(LEASE_LOST)
        if stop is not None and stop.is_set():
            engine.terminate(WORKER_SHUTDOWN)
        if job.time_budget_s and now - started > job.time_budget_s:
            engine.terminate(TIME_BUDGET)
        engine.kill_if_overdue(now=now, grace_s=settings.grace_s, rc=rc)
        if rc is not None:
            return rc, lost
        time.sleep(settings.poll_interval_s)


def _check_in(run: _Run, engine: Engine, launcher: Launcher, peers: nodes.Peers | None,
              next_beat: float, *, beat_now: bool) -> tuple[float, float, bool]:
    """One look of :func:`_watch` at the world: the cluster's news, the new events and log
    lines pumped into the database; when something was written, a heartbeat is due
    (``next_beat``) or ``beat_now``, a heartbeat (a cancel stops the engine; node 0 of a
    gang also checks its ``peers``); else a look for a cancel.

    Returns:
        ``(now, next heartbeat, lost)``: ``now`` the clock after the pump; ``lost`` when
        the lease is lost.
    """
    run.cluster_news(launcher.watch(engine))  # Slurm's job id, state, reason
    wrote = run.pump()
    now = time.monotonic()
    if wrote is None:
        return now, next_beat, True
    if wrote or now >= next_beat or beat_now:
        beat = run.heartbeat()
        next_beat = now + run.settings.heartbeat_s
        if beat is not None and beat[0] == JobStatus.CANCELLING:
            engine.terminate(CANCEL)
        if peers is not None and peers.check() is not None:
            engine.terminate(nodes.NODE_LOST)
        return now, next_beat, beat is None
    if run.status() == JobStatus.CANCELLING:
        engine.terminate(CANCEL)
    return now, next_beat, False


def _drain_events(run: _Run, outage: Outage, lost: bool) -> bool:
    """After the engine exited: pump its last events and log lines (waiting out a
    database outage), until nothing new is written.

    Returns:
        ``lost``, or True when the lease was lost meanwhile.
    """
    if outage.retry(run.pump) is None:
        lost = True
    if not lost:  # catch up: the last events may have waited for the database
        while (wrote := outage.retry(run.pump)) is True:
            pass
        lost = wrote is None
    return lost


def _record_node0_exit(run: _Run, peers: nodes.Peers, engine: Engine, rc: int,
                       outage: Outage) -> None:
    """Write node 0's exit into its slot of the gang, as the other nodes record theirs."""
    def record() -> None:
        with run.sessions() as s:
            gang.record_node_exit(s, job_id=run.job_id, attempt=peers.claim.attempt,
                                  node_rank=0, worker_id=run.worker_id, exit_code=rc,
                                  stop=engine.stop_reason,
                                  detail="\n".join(run.seen.log_tail))
            s.commit()

    outage.retry(record)


def _node_was_lost(run: _Run, peers: nodes.Peers, engine: Engine, rc: int) -> bool:
    """Whether node 0's failed engine (exit ``rc``) failed because another node of the
    gang was lost: not for a config, data or model error (exit 2, 3 or 4 in its error
    file: that fails on every node alike), else when ``peers`` saw a node lost or one
    reports its loss within a lease and a heartbeat."""
    if rc == 0 or engine.stop_reason not in (None, nodes.NODE_LOST):
        return False
    own = read_engine_error(run.job_dir / ENGINE_ERROR_FILE)
    # a config, data or model error fails on every node alike: no node was lost (also
    # when node 0's engine wrote it as the lost node's SIGTERM came: it failed by itself)
    if own is not None and own.exit_code in (2, 3, 4):
        return False
    wait_s = run.settings.lease_s + run.settings.heartbeat_s
    return peers.lost is not None or peers.wait_for_report(run.heartbeat, wait_s) is not None


def _handed_back(run: _Run, job: Job, outage: Outage, on_requeue: Any) -> bool:
    """Hand the job back to the queue (a worker shutdown), with one wake-up per node to
    gather (a failed send is logged: the reaper re-sends).

    Returns:
        True when it was handed back; False when the worker no longer held it.
    """
    if not outage.retry(lambda: run.hand_back(
            f"worker shut down; re-queued, {run.store.resume_note(run.job_id)}")):
        return False
    if on_requeue is not None:
        try:
            for _ in range(job.nodes):  # one wake-up per node to gather
                on_requeue(run.job_id, job.queue, job.priority)
        except Exception:
            log.exception("job %s: could not re-send (the reaper will)", run.job_id)
    return True


def _requeue_infra(run: _Run, job: Job, outcome: Outcome, outage: Outage,
                   on_requeue: Any) -> str:
    """The engine ended for a reason of the infrastructure (a hang, the host's OOM killer,
    a full disk): :func:`service.job_store.requeue_infra` (re-queued on the infrastructure
    budget to resume from last.pt, or failed once it is spent); wake-ups for a re-queue."""
    log.warning("job %s: infrastructure: %s", run.job_id, outcome.why)

    def requeue() -> JobStatus | None:
        with run.sessions() as s:
            status = job_store.requeue_infra(
                session=s, job_id=run.job_id, worker_id=run.worker_id, why=outcome.why or "",
                error=outcome.error or {}, progress=run.seen.progress or None, store=run.store,
                max_infra_retries=run.settings.max_infra_retries)
            s.commit()
        return status

    status = outage.retry(requeue)
    if status is None:
        return "lost"
    if status == JobStatus.QUEUED and on_requeue is not None:
        try:
            for _ in range(job.nodes):
                on_requeue(run.job_id, job.queue, job.priority)
        except Exception:
            log.exception("job %s: could not re-send (the reaper will)", run.job_id)
    return status


def _node_lost(run: _Run, job: Job, peers: nodes.Peers, on_requeue: Any) -> str:
    """Node 0's end of an attempt that lost another node: hand the job back when that node's
    worker shut down (the attempt does not count), else :func:`service.job_store.node_lost`
    (re-queued as one whole attempt, or failed); wake-ups for every node of a re-queued job."""
    node = peers.lost[0] if peers.lost is not None else None
    reason = peers.describe()
    if node is not None and node.stop is None and node.exit_code in (2, 3, 4):
        # the other node's config, data or model error: the job's own, it fails at once
        log.warning("job %s: %s", run.job_id, reason)
        ok = run.finish(JobStatus.FAILED, result=None,
                        error={"reason": reason, "exit_code": node.exit_code},
                        event={"reason": reason, "exit_code": node.exit_code},
                        end_class=JOB, why=reason)
        return JobStatus.FAILED if ok else "lost"
    if node is not None and node.stop == WORKER_SHUTDOWN:
        ok = run.hand_back(f"{reason}; re-queued, {run.store.resume_note(run.job_id)}")
        status: str | None = JobStatus.QUEUED if ok else None
    else:
        log.warning("job %s: %s", run.job_id, reason)
        with run.sessions() as s:
            status = job_store.node_lost(session=s, job_id=run.job_id, worker_id=run.worker_id,
                                         reason=reason, progress=run.seen.progress or None,
                                         store=run.store,
                                         max_infra_retries=run.settings.max_infra_retries)
            s.commit()
    if status is None:
        return "lost"
    if status == JobStatus.QUEUED and on_requeue is not None:
        try:
            for _ in range(job.nodes):
                on_requeue(run.job_id, job.queue, job.priority)
        except Exception:
            log.exception("job %s: could not re-send (the reaper will)", run.job_id)
    return status


def read_job(sessions: sessionmaker[Session], job_id: str) -> Job | None:
    """Fresh copy of a job row (helper for tasks and tests)."""
    with sessions() as s:
        return s.scalar(select(Job).where(Job.id == job_id))
