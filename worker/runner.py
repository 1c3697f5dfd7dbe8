"""Run one job: claim, prepare, launch, watch (tail, heartbeat, cancel), finish.

The database is the source of truth. A ``run_job`` message only wakes the worker:
:func:`run_next` claims the job the scheduler picks in the message's queue
(:mod:`service.scheduler`: ``queued -> running``, ``attempt += 1``, a lease, atomically);
a message that finds no job it may start is used up and nothing happens. When a job ends,
the worker sends wake-ups for its owner's queued jobs, which the owner's cap may have held
back. :func:`run_job` runs one given job (a direct run). The engine runs as a subprocess in its own session (process group); this
process never imports torch.

Stopping (cancel, worker shutdown, the wall-clock budget, a lost lease) is one sequence,
in :func:`_watch`: SIGTERM to the engine's main process only (the engine, or torchrun's
agent, which passes it on to its ranks); the ranks finish the step, save ``last.pt``, emit
``run_end interrupted`` and exit 143. Loader workers are never signalled by the runner: the
main process owns their shutdown. Whatever is still alive after ``grace_s`` (the main
process, torchrun's ranks, which run in sessions of their own, their loader workers) is
SIGKILLed as a tree, and the engine's process group with it.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy import delete, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from libreyolo_core.profiler.preflight import CURRENCY_ENV, PRICE_ENV
from service.db.models import ACTIVE, TERMINAL, Artifact, Job, utcnow
from service.ops import EventIn, append_events, transition
from service.procs import die_with_parent
from service.scheduler import claim, wake_targets
from service.settings import Settings
from service.storage import ArtifactStore, artifact_kind, sha256_file
from worker.launch import CommandBuilder, build_command, build_env, job_spec, world_size

__all__ = ["run_job", "run_next", "kill_leftovers", "EXIT_REASONS"]

log = logging.getLogger(__name__)

EXIT_REASONS = {
    1: "runtime error", 2: "bad config", 3: "data error", 4: "model or checkpoint error",
    143: "terminated (SIGTERM)",
    -15: "terminated (SIGTERM)", -9: "killed (SIGKILL)", 137: "killed (SIGKILL)",
}
#: What the engine writes when it fails (``$LIBREYOLO_ERROR_FILE``): its exit code and
#: error line, which a torchrun launcher (always exit 1) would hide.
ENGINE_ERROR_FILE = "engine_error.json"
METRIC_EVENTS = {"epoch_start", "progress", "epoch_end", "profile", "preflight", "tune_candidate",
                 "tune"}
#: The preflight figures kept in a job's ``progress`` (the page and the SDK show them while
#: the run goes on; the whole estimate is the result's ``preflight``).
PREFLIGHT_PROGRESS = ("img_per_s", "epoch_s", "val_s", "total_s", "epochs", "peak_memory_mb",
                      "memory_kind", "cost", "currency", "device")
MAX_LOG_LINES_PER_EVENT = 500
MAX_READ_BYTES = 4 << 20


def _pdeathsig() -> None:  # runs in the child after setsid()
    die_with_parent(signal.SIGKILL)  # die with the worker (kill -9)


def _pgid_members(pgid: int) -> list[int]:
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def kill_leftovers(pgid: int | None, job_dir: Path) -> int:
    """SIGKILL processes of an earlier attempt's group that still run in ``job_dir``.

    Only processes whose working directory is inside ``job_dir`` are signalled, so a
    reused pid never hits an unrelated process. Returns how many were signalled.
    """
    if not pgid or not Path("/proc").is_dir():
        return 0
    n, root = 0, job_dir.resolve()
    for pid in _pgid_members(pgid):
        try:
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            continue
        if cwd == root or root in cwd.parents:
            try:
                os.kill(pid, signal.SIGKILL)
                n += 1
            except ProcessLookupError:
                pass
    return n


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_tree(pid: int) -> int:
    """SIGKILL ``pid``, every descendant (torchrun's ranks live in sessions of their own,
    so their group is not the engine's) and the engine's process group. Returns how many
    processes of the tree were signalled."""
    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.Error:
        procs = []
    n = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
            n += 1
    _signal_group(pid, signal.SIGKILL)
    return n


class _Tail:
    """Complete lines appended to a file since ``offset`` (offset in bytes)."""

    def __init__(self, path: Path, offset: int):
        self.path, self.offset = path, offset

    def read(self) -> tuple[list[bytes], int]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(MAX_READ_BYTES)
        except FileNotFoundError:
            return [], self.offset
        end = data.rfind(b"\n")
        if end < 0:
            if len(data) < MAX_READ_BYTES:
                return [], self.offset
            end = len(data) - 1  # a huge line without newline: take it as is
        chunk = data[: end + 1]
        return chunk.splitlines(), self.offset + len(chunk)


def _event_kind(name: str) -> str:
    if name == "artifact":
        return "artifact"
    if name in METRIC_EVENTS:
        return "metric"
    return "status"


class _Run:
    """State of one attempt of one job in this worker."""

    def __init__(self, job: Job, *, settings: Settings, sessions: sessionmaker[Session],
                 worker_id: str, store: ArtifactStore):
        self.job_id, self.settings, self.sessions = job.id, settings, sessions
        self.worker_id, self.store = worker_id, store
        self.job_dir = store.job_dir(job.id)
        self.run_dir = store.run_dir(job.id)
        self.events = _Tail(self.run_dir / "events.jsonl", job.events_offset)
        self.log = _Tail(store.log_path(job.id), job.log_offset)
        self.progress: dict[str, Any] = dict(job.progress or {})
        self.run_end: dict[str, Any] | None = None
        self.profile: dict[str, Any] | None = None
        self.kind = job.kind
        self.artifact_kinds: dict[str, str] = {}
        self.log_tail: list[str] = []

    # -- database ---------------------------------------------------------------------
    def _mine(self) -> list[Any]:
        return [Job.lease_owner == self.worker_id, Job.status.in_(ACTIVE)]

    def _lease(self) -> dict[str, Any]:
        return {"lease_expires_at": utcnow() + timedelta(seconds=self.settings.lease_s)}

    def heartbeat(self) -> tuple[str, bool] | None:
        """Renew the lease; returns (status, cancel_requested), or None if the lease is lost."""
        with self.sessions() as s:
            row = s.execute(update(Job).where(Job.id == self.job_id, *self._mine())
                            .values(**self._lease())
                            .returning(Job.status, Job.cancel_requested)).first()
            s.commit()
        return None if row is None else (row[0], bool(row[1]))

    def status(self) -> str | None:
        """The job's status now (a read, for the cancel poll)."""
        with self.sessions() as s:
            return s.scalar(select(Job.status).where(Job.id == self.job_id))

    def pump(self) -> bool | None:
        """Move new engine events and log lines into job_events (one transaction).

        Returns:
            True if something was written, False if nothing new, None if the lease is lost.
        """
        lines, ev_off = self.events.read()
        log_lines, log_off = self.log.read()
        if not lines and not log_lines:
            return False
        batch: list[EventIn] = []
        for raw in lines:
            if not raw.strip():
                continue
            try:
                ev = json.loads(raw)
                if not isinstance(ev, dict):
                    raise ValueError("not an object")
            except ValueError:
                ev = {"event": "bad_event_line", "line": raw.decode("utf-8", "replace")[:2000]}
            name = str(ev.get("event", "unknown"))
            self._observe(name, ev)
            batch.append((_event_kind(name), float(ev.get("time") or time.time()), ev))
        if log_lines:
            text = [ln.decode("utf-8", "replace").rstrip("\r") for ln in log_lines]
            self.log_tail = (self.log_tail + text)[-self.settings.log_tail_lines:]
            now = time.time()
            for i in range(0, len(text), MAX_LOG_LINES_PER_EVENT):
                batch.append(("log", now, {"event": "log",
                                           "lines": text[i:i + MAX_LOG_LINES_PER_EVENT]}))
        with self.sessions() as s:
            last = append_events(s, self.job_id, batch, where=self._mine(),
                                 events_offset=ev_off, log_offset=log_off,
                                 progress=self.progress or None, **self._lease())
            s.commit()
        if last is None:
            return None
        self.events.offset, self.log.offset = ev_off, log_off
        return True

    def _observe(self, name: str, ev: dict[str, Any]) -> None:
        if name in ("progress", "epoch_start"):
            for k in ("phase", "epoch", "epochs", "step", "steps", "val_batch", "val_batches",
                      "warmup", "measured", "eta_s", "img_per_s", "losses", "candidate",
                      "candidate_index", "candidates", "trial", "trials", "trials_done",
                      "trials_planned"):
                if k in ev:
                    self.progress[k] = ev[k]
        elif name == "preflight":
            self.progress["preflight"] = {k: ev.get(k) for k in PREFLIGHT_PROGRESS}
        elif name == "epoch_end":
            for k in ("phase", "val_batch", "val_batches"):  # the epoch's phases are over
                self.progress.pop(k, None)
            for k in ("epoch", "epochs", "losses", "metrics", "lr", "epoch_time_s", "fitness",
                      "eta_s"):
                if k in ev:
                    self.progress[k] = ev[k]
            if "epoch" in ev:  # kept in progress so that a resumed attempt still knows it
                self.progress["epochs_completed"] = ev["epoch"]
            if ev.get("is_best"):
                self.progress["best_epoch"] = ev.get("epoch")
        elif name == "artifact" and isinstance(ev.get("path"), str):
            self.artifact_kinds[ev["path"]] = str(ev.get("kind") or "other")
        elif name == "run_end":
            self.run_end = ev
        elif name == "profile":
            self.profile = ev

    def record_pid(self, pid: int) -> None:
        with self.sessions() as s:
            s.execute(update(Job).where(Job.id == self.job_id, *self._mine())
                      .values(pid=pid, host=socket.gethostname()))
            s.commit()

    def finish(self, status: str, *, result: dict[str, Any] | None,
               error: dict[str, Any] | None, event: dict[str, Any]) -> bool:
        """Record artifacts and the final status (only while this worker holds the lease)."""
        artifacts = []
        for rel, path in self.store.list_files(self.job_id):
            try:
                artifacts.append({"job_id": self.job_id, "path": rel,
                                  "kind": self.artifact_kinds.get(rel) or artifact_kind(rel),
                                  "size_bytes": path.stat().st_size, "sha256": sha256_file(path),
                                  "created_at": utcnow()})
            except OSError:
                continue
        with self.sessions() as s:
            ok = transition(s, self.job_id, ACTIVE, status,
                            extra_where=[Job.lease_owner == self.worker_id], event=event,
                            finished_at=utcnow(), lease_owner=None, lease_expires_at=None,
                            result=result, error=error, progress=self.progress or None)
            if ok:
                s.execute(delete(Artifact).where(Artifact.job_id == self.job_id))
                if artifacts:
                    s.execute(insert(Artifact), artifacts)
                s.commit()
            else:
                s.rollback()
        return ok

    def requeue(self, reason: str) -> bool:
        """Give the job back (worker shutdown): ``running -> queued``; resumes from last.pt.

        A graceful hand-back is not a failed attempt: the attempt count goes back down, so
        restarting the service any number of times never uses up ``max_attempts``.
        """
        with self.sessions() as s:
            ok = transition(s, self.job_id, ["running"], "queued",
                            extra_where=[Job.lease_owner == self.worker_id],
                            event={"reason": reason}, lease_owner=None, lease_expires_at=None,
                            enqueued_at=utcnow(), sent_at=utcnow(),
                            progress=self.progress or None,
                            attempt=Job.attempt - 1)
            s.commit()
        return ok

    def result_summary(self) -> dict[str, Any]:
        end = self.run_end or {}
        result: dict[str, Any] = {
            "status": end.get("status"),
            "best_epoch": end.get("best_epoch", self.progress.get("best_epoch")),
            "metrics": end.get("metrics") or self.progress.get("metrics"),
            # the last epoch_end's epoch: a progress event's epoch may be one cut off
            "epochs_completed": self.progress.get("epochs_completed", 0),
            "names": end.get("names"),  # class id -> name: the keys of metrics.per_class_AP
        }
        if self.profile is not None:
            prof = {k: v for k, v in self.profile.items() if k not in ("event", "time")}
            result["verdict"] = prof.get("verdict")
            result["bound_why"] = prof.get("bound_why")
            result["lever"] = prof.get("lever")
            result["profile"] = prof
        preflight = _read_json(self.run_dir / "preflight.json")
        if preflight is not None:
            preflight.pop("trial_dir", None)
            result["preflight"] = {**preflight, "actual": _actual_timing(self.run_dir, end)}
        if self.kind == "tune":
            tune = _read_json(self.run_dir / "tune.json")
            if tune is not None:
                result.update(tune=tune, answer=tune.get("answer"),
                              recommended_params=tune.get("recommended_params"))
        return result


def _read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``; ``None`` when missing or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _actual_timing(run_dir: Path, run_end: dict[str, Any]) -> dict[str, Any]:
    """What the run took, seconds, beside its preflight estimate: from ``results.csv`` (every
    completed epoch, earlier attempts included) ``epochs``, ``epoch_time_s`` (mean training
    time of an epoch), ``first_epoch_s``, ``train_s``, ``val_s`` (sums) and ``val_time_s``
    (mean of the validated epochs); ``wall_s`` of the engine's last attempt (``run_end``)."""
    rows: list[dict[str, str]] = []
    with contextlib.suppress(OSError, csv.Error):
        with open(run_dir / "results.csv", encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))

    def floats(key: str, only_validated: bool = False) -> list[float]:
        out = []
        for r in rows:
            if only_validated and r.get("validated") not in ("1", "True", "true"):
                continue
            with contextlib.suppress(TypeError, ValueError):
                out.append(float(r[key]))
        return out

    train, val = floats("epoch_time_s"), floats("val_time_s", only_validated=True)
    timing = (run_end or {}).get("timing") or {}
    return {"epochs": len(train),
            "epoch_time_s": round(sum(train) / len(train), 3) if train else None,
            "first_epoch_s": train[0] if train else None,
            "train_s": round(sum(train), 3), "val_s": round(sum(val), 3),
            "val_time_s": round(sum(val) / len(val), 3) if val else None,
            "wall_s": timing.get("wall_s")}


def _claim(sessions: sessionmaker[Session], settings: Settings, worker_id: str, *,
           queue: str | None = None, job_id: str | None = None) -> Job | None:
    """Claim the best eligible job of ``queue``, or only ``job_id`` (see
    :func:`service.scheduler.claim`); the claimed row, or None."""
    with sessions() as s:
        if queue is None:
            queue = s.scalar(select(Job.queue).where(Job.id == job_id))
            if queue is None:
                return None
        claimed = claim(s, queue, worker_id, settings, job_id=job_id)
        if claimed is None:
            return None
        return s.get(Job, claimed)


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
        # A message this worker took while shutting down (it can be the very job it just
        # re-queued): starting an attempt only to kill it would burn one of max_attempts.
        # Leave the job queued and put the message back for the next worker.
        queued = read_job(sessions, job_id)
        if queued is not None and queued.status == "queued" and on_requeue is not None:
            on_requeue(job_id, queued.queue, queued.priority)
        log.info("job %s: worker shutting down; message handed back", job_id)
        return "skipped"
    if pick:
        queue = getattr(read_job(sessions, job_id), "queue", None)
        job = _claim(sessions, settings, worker_id, queue=queue) if queue else None
        if job is None:
            log.info("woken by job %s: no job of queue %s may start now", job_id, queue)
            return "skipped"
        if job.id != job_id:
            log.info("woken by job %s: the scheduler chose job %s", job_id, job.id)
    else:
        job = _claim(sessions, settings, worker_id, job_id=job_id)
        if job is None:
            log.info("job %s is not queued or its owner is at their cap; skipping", job_id)
            return "skipped"
    status = _start(job, settings=settings, sessions=sessions, gpu_ids=gpu_ids,
                    worker_id=worker_id, command=command, stop=stop, on_requeue=on_requeue)
    if status in TERMINAL and on_requeue is not None:
        _wake_owner(sessions, job.owner_id, on_requeue)
    return status


def _wake_owner(sessions: sessionmaker[Session], owner_id: str, send: Any) -> None:
    """One of ``owner_id``'s jobs ended: send a wake-up for each queue holding their queued
    jobs (the cap may have held them back; a spare message is dropped harmlessly)."""
    try:
        with sessions() as s:
            targets = wake_targets(s, owner_id)
        for target in targets:
            send(*target)
    except Exception:
        log.exception("could not send wake-ups for user %s (the reaper re-sends)", owner_id)


def _start(job: Job, *, settings: Settings, sessions: sessionmaker[Session],
           gpu_ids: Sequence[str] | None, worker_id: str, command: CommandBuilder,
           stop: threading.Event | None, on_requeue: Any) -> str:
    """Prepare the run directory of a claimed job, launch the engine and watch it."""
    job_id = job.id
    store = ArtifactStore(settings.artifact_root)
    run = _Run(job, settings=settings, sessions=sessions, worker_id=worker_id, store=store)
    run.job_dir.mkdir(parents=True, exist_ok=True)
    if job.pid:  # a process group of an earlier attempt (crash or hand-back)
        n = kill_leftovers(job.pid, run.job_dir)
        if n:
            log.warning("job %s: killed %d leftover engine processes", job_id, n)
    # any earlier attempt (a crash, or a hand-back that did not count) left last.pt
    last_pt = store.last_checkpoint(job_id)
    resume: str | bool = str(last_pt) if last_pt is not None else False
    spec = job_spec(kind=job.kind, model=job.model, data=job.data, params=job.params,
                    gpus=job.gpus, job_dir=run.job_dir, resume=resume, options=job.options)
    spec_path = run.job_dir / "job.json"
    tmp = spec_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(spec, indent=2))
    os.replace(tmp, spec_path)
    argv = command(spec_path, world_size(job.gpus, job.procs), settings)
    env = build_env(gpu_ids, job.gpus)
    error_file = run.job_dir / ENGINE_ERROR_FILE
    error_file.unlink(missing_ok=True)  # a previous attempt's
    env["LIBREYOLO_ERROR_FILE"] = str(error_file)
    if settings.gpu_hour_price is not None:  # a preflight's cost estimate
        env[PRICE_ENV], env[CURRENCY_ENV] = f"{settings.gpu_hour_price:g}", settings.currency
    log.info("job %s attempt %d: %s", job_id, job.attempt, " ".join(argv))
    with open(store.log_path(job_id), "ab") as logf:
        try:
            proc = subprocess.Popen(argv, cwd=run.job_dir, stdout=logf, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                    preexec_fn=_pdeathsig)
        except OSError as exc:
            run.finish("failed", result=None, error={"reason": f"could not start the engine: "
                                                     f"{exc}", "exit_code": None},
                       event={"reason": "launch failed"})
            return "failed"
    run.record_pid(proc.pid)
    return _watch(run, proc, job, stop, on_requeue)


def _watch(run: _Run, proc: subprocess.Popen, job: Job, stop: threading.Event | None,
           on_requeue: Any) -> str:
    settings = run.settings
    started = time.monotonic()
    next_beat = started + settings.heartbeat_s
    term_at: float | None = None
    term_reason: str | None = None
    killed = lost = False

    def terminate(reason: str) -> None:
        # The documented stop: SIGTERM to the engine's main process (or torchrun's agent,
        # which forwards it to the ranks) and never to the whole group, so loader workers
        # are not killed under a rank that is still finishing its step.
        nonlocal term_at, term_reason
        if term_at is None:
            log.info("job %s: SIGTERM to the engine (pid %d): %s", run.job_id, proc.pid, reason)
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            term_at, term_reason = time.monotonic(), reason

    while True:
        rc = proc.poll()
        wrote = run.pump()
        now = time.monotonic()
        if wrote is None:
            lost = True
        elif wrote or now >= next_beat:
            beat = run.heartbeat()
            next_beat = now + settings.heartbeat_s
            if beat is None:
                lost = True
            elif beat[0] == "cancelling":
                terminate("cancel")
        elif run.status() == "cancelling":
            terminate("cancel")
        if lost:
            log.warning("job %s: lease lost; stopping the engine", run.job_id)
            terminate("lease lost")
        if stop is not None and stop.is_set():
            terminate("worker shutdown")
        if job.time_budget_s and now - started > job.time_budget_s:
            terminate("time budget")
        if term_at is not None and not killed and now - term_at > settings.grace_s and rc is None:
            log.warning("job %s: grace period (%g s) over; SIGKILL to the engine's process tree",
                        run.job_id, settings.grace_s)
            _kill_tree(proc.pid)
            killed = True
        if rc is not None:
            break
        time.sleep(settings.poll_interval_s)
    _signal_group(proc.pid, signal.SIGKILL)  # loader workers or ranks left behind
    if run.pump() is None:
        lost = True
    if lost:
        return "lost"
    if term_reason == "worker shutdown":
        if run.requeue(f"worker shut down; re-queued, {run.store.resume_note(run.job_id)}"):
            if on_requeue is not None:
                try:
                    on_requeue(run.job_id, job.queue, job.priority)
                except Exception:
                    log.exception("job %s: could not re-send (the reaper will)", run.job_id)
            return "queued"
    return _conclude(run, rc, term_reason, job)


def _conclude(run: _Run, rc: int, term_reason: str | None, job: Job) -> str:
    end_status = (run.run_end or {}).get("status")
    result = run.result_summary()
    reason = EXIT_REASONS.get(rc, f"exit code {rc}")
    if term_reason in ("cancel", "worker shutdown"):
        status, error = "cancelled", None
        event = {"reason": "cancelled by request", "exit_code": rc}
    elif term_reason == "time budget":
        status = "failed"
        error = {"reason": f"time budget of {job.time_budget_s:g} s exceeded", "exit_code": rc,
                 "log_tail": run.log_tail}
        event = {"reason": error["reason"], "exit_code": rc}
    elif rc == 0 and end_status not in ("failed", "interrupted"):
        status, error = "succeeded", None
        event = {"exit_code": 0}
    else:
        status = "failed"
        error = {"reason": reason, "exit_code": rc, "log_tail": run.log_tail}
        if run.run_end and run.run_end.get("error"):
            error["engine_error"] = run.run_end["error"]
        engine = _engine_error(run.job_dir / ENGINE_ERROR_FILE)
        if engine is not None and engine["exit_code"] != rc:  # torchrun's 1 hides the engine's code
            error.update(reason=EXIT_REASONS.get(engine["exit_code"], f"exit code {engine['exit_code']}"),
                         exit_code=engine["exit_code"], launcher_exit_code=rc)
        if engine is not None:
            error["engine_error"] = engine["error"]
            error["failed_rank"] = engine["rank"]
        event = {"reason": error["reason"], "exit_code": error["exit_code"]}
    if not run.finish(status, result=result, error=error, event=event):
        return "lost"
    log.info("job %s: %s (exit %s)", run.job_id, status, rc)
    return status


def _engine_error(path: Path) -> dict[str, Any] | None:
    """The engine's error record, if it left one (see :data:`ENGINE_ERROR_FILE`)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        return {"exit_code": int(record["exit_code"]), "error": str(record["error"]),
                "rank": int(record.get("rank", 0))}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_job(sessions: sessionmaker[Session], job_id: str) -> Job | None:
    """Fresh copy of a job row (helper for tasks and tests)."""
    with sessions() as s:
        return s.scalar(select(Job).where(Job.id == job_id))
