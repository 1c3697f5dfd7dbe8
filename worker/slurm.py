"""The Slurm launcher: the worker submits an attempt with ``sbatch``, Slurm runs
``srun torchrun`` on the nodes it allocates, the worker follows the run folder as usual.

The Celery worker runs on a submit host. For an attempt it writes two scripts into the
job's folder (on storage every node shares) and submits the first:

- ``slurm/batch.sh`` runs on the allocation's first node: it finds that node's address
  (``scontrol show node``: its ``NodeAddr``), picks the rendezvous port
  (``slurm_port_base + job id mod 1000``), and runs ``srun`` with one task per node. It
  traps ``SIGUSR1`` (``--signal=B:USR1@<slurm_signal_s>``: the time limit is near) and
  passes a SIGTERM on to the engine, which saves ``last.pt`` and stops.
- ``slurm/node.sh`` runs on each node: ``torchrun --nnodes=$SLURM_NNODES
  --node-rank=$SLURM_NODEID`` with torchrun's static rendezvous at the first node
  (global rank 0, which logs, writes events and checkpoints, runs there), the node's log
  and error file (:func:`worker.nodes.node_files`: node 0's is the job's ``train.log``).

``sbatch`` gets ``--nodes``, ``--ntasks-per-node=1``, ``--gpus-per-node`` for a GPU job or
``--cpus-per-task=<procs>`` for a CPU job, ``--requeue`` and the settings' partition,
account, QoS, time limit and extra arguments. A re-run allocation (preempted, a node
failed, ``scontrol requeue``: ``SLURM_RESTART_COUNT`` > 0) starts from ``job.resume.json``
when ``last.pt`` exists, and the runner counts it as attempt N+1 of the same job
(:class:`ClusterNews` ``restarted``).

:class:`SlurmJob` is the :class:`worker.launcher.Engine` the watch loop drives:
``poll`` reads ``scontrol show job`` (at most every ``slurm_poll_s``), ``terminate`` is
``scancel --signal=TERM`` (``scancel`` for a job still pending), ``kill_if_overdue`` is
``scancel`` after the grace period. :meth:`SlurmLauncher.classify` maps Slurm's end states
to ours: COMPLETED -> the engine's own end (succeeded), FAILED -> the engine's error (a job
end), NODE_FAIL, PREEMPTED, BOOT_FAIL -> infrastructure, TIMEOUT and OUT_OF_MEMORY named.
"""

from __future__ import annotations

import logging
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

from service.ends import INFRASTRUCTURE, JOB
from service.lifecycle import JobStatus
from service.settings import Settings
from worker.launcher import ClusterNews, LaunchRequest
from worker.nodes import node_files
from worker.outcome import CANCEL, WORKER_SHUTDOWN, Outcome

__all__ = ["ACTIVE_STATES", "INFRA_STATES", "SlurmJob", "SlurmLauncher", "parse_job",
           "sbatch_args"]

log = logging.getLogger(__name__)

#: Slurm job states of a job that has not ended (it may still run, or run again)
ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED",
                           "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SIGNALING",
                           "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT"})
#: end states that are the cluster's doing, not the job's (re-queued as infrastructure)
INFRA_STATES = {"NODE_FAIL": "a node of the allocation failed (NODE_FAIL)",
                "PREEMPTED": "preempted by a higher-priority job (PREEMPTED)",
                "BOOT_FAIL": "a node failed to boot (BOOT_FAIL)"}
#: end states named as what they are (job ends)
NAMED_STATES = {"TIMEOUT": "Slurm's time limit was reached (TIMEOUT)",
                "OUT_OF_MEMORY": "the job used more memory than it asked Slurm for "
                                 "(OUT_OF_MEMORY)",
                "DEADLINE": "Slurm's deadline was reached (DEADLINE)"}
#: what the batch script writes when Slurm's signal (the time limit is near) came
SIGNAL_MARK = "slurm/signalled"
_PAIR = re.compile(r"(?:^|\s)([A-Za-z][\w:/]*)=(\S*)")


def parse_job(text: str) -> dict[str, str]:
    """The ``Key=Value`` fields of one ``scontrol show job -o`` line (values up to the
    next blank; enough for JobState, Reason, NodeList, ExitCode, Restarts, BatchHost)."""
    return {k: v for k, v in _PAIR.findall(text)}


def sbatch_args(settings: Settings, request: LaunchRequest, script: Path) -> list[str]:
    """The ``sbatch`` command line of an attempt (see the module's docstring)."""
    out = request.job_dir / "slurm" / "slurm-%j.out"
    args = ["sbatch", "--parsable", f"--job-name=ly-{request.job_id[:12]}",
            f"--nodes={request.nodes}", "--ntasks-per-node=1",
            f"--chdir={request.job_dir}", f"--output={out}", "--requeue",
            f"--signal=B:USR1@{settings.slurm_signal_s}"]
    if request.gpus > 0:
        args.append(f"--gpus-per-node={request.gpus}")
    else:
        args.append(f"--cpus-per-task={max(1, request.procs)}")
    for flag, value in (("--partition", settings.slurm_partition),
                        ("--account", settings.slurm_account), ("--qos", settings.slurm_qos),
                        ("--time", settings.slurm_time_limit)):
        if value:
            args.append(f"{flag}={value}")
    if settings.slurm_fair_share == "slurm":  # Slurm orders the jobs: pass the priority on
        args.append(f"--nice={(9 - max(0, min(9, request.priority))) * 100}")
    return [*args, *settings.slurm_extra_args, str(script)]


def _node_addr(var: str) -> str:
    """Shell that prints the ``NodeAddr`` of the node named by ``$var``."""
    return (f'$(scontrol show node "${var}" | tr " " "\\n" | sed -n "s/^NodeAddr=//p" '
            f'| head -n1)')


def write_scripts(settings: Settings, request: LaunchRequest) -> Path:
    """Write ``slurm/batch.sh`` and ``slurm/node.sh`` into the job's folder; returns the
    batch script."""
    folder = request.job_dir / "slurm"
    folder.mkdir(parents=True, exist_ok=True)
    q = shlex.quote
    nproc = request.gpus if request.gpus > 0 else max(1, request.procs)
    cases = []
    for rank in range(request.nodes):
        _, log_path, error_file = node_files(request.job_dir, rank)
        cases.append(f"  {rank}) LOG={q(str(log_path))}; ERR={q(str(error_file))} ;;")
    torchrun = [settings.engine_python, "-m", "libreyolo_core.distributed.torchrun"]
    node = "\n".join([
        "#!/bin/bash",
        f"# LibreYOLO job {request.job_id}, one node (worker.slurm); run by srun",
        'case "$SLURM_NODEID" in', *cases,
        f'  *) LOG={q(str(request.job_dir))}/train.node$SLURM_NODEID.log; '
        f'ERR={q(str(request.job_dir))}/engine_error.node$SLURM_NODEID.json ;;',
        "esac",
        'export LIBREYOLO_ERROR_FILE="$ERR"',
        'rm -f "$ERR"',
        f"SELF={_node_addr('SLURMD_NODENAME')}",
        'exec >>"$LOG" 2>&1',
        f"cd {q(str(request.job_dir))}",
        "exec " + " ".join(q(a) for a in torchrun) +
        ' --nnodes="$SLURM_NNODES" --node-rank="$SLURM_NODEID" --rdzv-backend=static'
        ' --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"'
        ' --rdzv-id="$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}" --rdzv-conf=timeout=300'
        f' --local-addr="$SELF" --max-restarts=0 --nproc-per-node={nproc}'
        ' -m libreyolo_core.cli train spec="$LY_SPEC"',
        ""])
    (folder / "node.sh").write_text(node, encoding="utf-8")
    resume = ""
    if request.resume_spec is not None and request.last_pt is not None:
        resume = (f'if [ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ] && [ -f {q(str(request.last_pt))} ]'
                  f"; then LY_SPEC={q(str(request.resume_spec))}; fi")
    batch = "\n".join([
        "#!/bin/bash",
        f"# LibreYOLO job {request.job_id}: one srun torchrun per node (worker.slurm)",
        f"export LY_SPEC={q(str(request.spec_path))}",
        resume,
        'FIRST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        f"export MASTER_ADDR={_node_addr('FIRST')}",
        f"export MASTER_PORT=$(( {settings.slurm_port_base} + SLURM_JOB_ID % 1000 ))",
        f"MARK={q(str(request.job_dir / SIGNAL_MARK))}",
        'rm -f "$MARK"',
        # the time limit is near (or a preemption's signal): the engine saves and stops
        'forward() { echo "slurm: SIGUSR1: the engine saves last.pt and stops" >"$MARK";'
        ' [ -n "$STEP" ] && kill -TERM "$STEP"; }',
        "trap forward USR1",
        f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash {q(str(folder / 'node.sh'))} &",
        "STEP=$!",
        'while :; do wait "$STEP"; rc=$?; kill -0 "$STEP" 2>/dev/null || break; done',
        'exit "$rc"',
        ""])
    script = folder / "batch.sh"
    script.write_text(batch, encoding="utf-8")
    return script


class SlurmJob:
    """A submitted Slurm job as the watch loop drives it (:class:`worker.launcher.Engine`).

    Args:
        slurm_id: Slurm's job id.
        job_id: our job (named in log lines).
        env: the environment of the Slurm commands (``SLURM_CONF`` and ``PATH``).
        poll_s: the least time between two ``scontrol`` reads.
    """

    pid = 0  #: no local process (``jobs.pid`` stays empty of meaning)

    def __init__(self, slurm_id: str, job_id: str, env: dict[str, str], poll_s: float):
        self.slurm_id, self.job_id, self.env, self.poll_s = slurm_id, job_id, env, poll_s
        self.stop_reason: str | None = None
        self.fields: dict[str, str] = {"JobState": "PENDING"}
        self.rc: int | None = None
        self._read_at = 0.0
        self._term_at: float | None = None
        self._killed = False
        self._reported: dict[str, Any] | None = None
        self._restarts = 0
        self.states: list[str] = []  #: every state seen, in order (for the end's class)

    # -- Slurm commands ------------------------------------------------------------------
    def _cmd(self, *argv: str) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                                  timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return subprocess.CompletedProcess(list(argv), 1, "", str(exc))

    def refresh(self, force: bool = False) -> dict[str, str]:
        """Read ``scontrol show job`` (at most every ``poll_s`` unless ``force``)."""
        now = time.monotonic()
        if not force and now - self._read_at < self.poll_s:
            return self.fields
        self._read_at = now
        done = self._cmd("scontrol", "show", "job", "-o", self.slurm_id)
        if done.returncode == 0 and "JobState=" in done.stdout:
            self.fields = parse_job(done.stdout)
            state = self.state
            if not self.states or self.states[-1] != state:
                self.states.append(state)
        elif "Invalid job id" in (done.stderr or "") and self.state in ACTIVE_STATES:
            # purged (MinJobAge): it has ended
            self.fields = {**self.fields, "JobState": "UNKNOWN_ENDED"}
        return self.fields

    @property
    def state(self) -> str:
        """Slurm's state (``PENDING``, ``RUNNING``, ``COMPLETED``, ...; flags dropped)."""
        return self.fields.get("JobState", "PENDING").split("+")[0]

    # -- the Engine protocol ----------------------------------------------------------------
    def poll(self) -> int | None:
        """The job's exit code once Slurm says it ended (its ``ExitCode``: the batch
        script's, i.e. ``srun``'s; ``-signal`` when a signal ended it), else None."""
        if self.rc is not None:
            return self.rc
        self.refresh()
        if self.state in ACTIVE_STATES:
            return None
        code, _, sig = self.fields.get("ExitCode", "1:0").partition(":")
        try:
            rc, signum = int(code), int(sig or 0)
        except ValueError:
            rc, signum = 1, 0
        if signum:
            rc = -signum
        if self.state != "COMPLETED" and rc == 0:
            rc = 1  # ended by Slurm (a node failure, a time limit) with no code of its own
        self.rc = rc
        return rc

    def terminate(self, reason: str) -> None:
        """The graceful stop: ``scancel --signal=TERM`` to the job's steps (the engine
        saves ``last.pt`` and exits 143); a job still pending is simply cancelled. Only the
        first call acts and sets :attr:`stop_reason`."""
        if self._term_at is not None:
            return
        self._term_at, self.stop_reason = time.monotonic(), reason
        self.refresh(force=True)
        pending = self.state in ("PENDING", "REQUEUED")
        log.info("job %s: %s Slurm job %s: %s", self.job_id,
                 "scancel" if pending else "scancel --signal=TERM", self.slurm_id, reason)
        if pending:
            self._cmd("scancel", self.slurm_id)
        else:
            self._cmd("scancel", "--signal=TERM", self.slurm_id)

    def kill_if_overdue(self, *, now: float, grace_s: float, rc: int | None) -> None:
        """``scancel`` (Slurm's own SIGTERM, then SIGKILL after its ``KillWait``) once, when
        the job still runs ``grace_s`` after the graceful stop."""
        if self._term_at is not None and not self._killed and rc is None \
                and now - self._term_at > grace_s:
            log.warning("job %s: grace period (%g s) over; scancel %s", self.job_id, grace_s,
                        self.slurm_id)
            self._cmd("scancel", self.slurm_id)
            self._killed = True

    def kill_group(self) -> None:
        """``scancel`` if the job has not ended (nothing is left on the nodes after)."""
        if self.rc is None and self.state in ACTIVE_STATES:
            self._cmd("scancel", self.slurm_id)

    # -- what the runner stores -------------------------------------------------------------
    def view(self) -> dict[str, Any]:
        """The cluster's view for ``jobs.cluster``."""
        f = self.fields
        nodes = f.get("NodeList") or ""
        reason = f.get("Reason") or ""
        return {"launcher": "slurm", "job_id": self.slurm_id, "state": self.state,
                "reason": None if reason in ("", "None") else reason,
                "nodes": None if nodes in ("", "(null)") else nodes,
                "restarts": int(f.get("Restarts") or 0)}

    def news(self) -> ClusterNews | None:
        """The view when it changed since the last call; ``restarted`` when Slurm re-ran
        the allocation (its ``Restarts`` grew)."""
        self.refresh()
        view = self.view()
        if view == self._reported:
            return None
        self._reported = view
        restarted = None
        if view["restarts"] > self._restarts:
            self._restarts = view["restarts"]
            before = [s for s in self.states[:-1] if s not in ("PENDING", "RUNNING",
                                                                "CONFIGURING", "COMPLETING")]
            cause = next((INFRA_STATES[s] for s in reversed(before) if s in INFRA_STATES),
                         None)
            restarted = f"Slurm re-queued job {self.slurm_id} " + (
                f"({cause})" if cause else "(preempted, a node failed, or scontrol requeue)")
        return ClusterNews(cluster=view, restarted=restarted)


class SlurmLauncher:
    """``launcher = "slurm"``: see the module's docstring."""

    name = "slurm"
    whole = True

    def __init__(self, settings: Settings):
        self.settings = settings

    def launch(self, request: LaunchRequest) -> SlurmJob:
        """Write the scripts and ``sbatch`` them.

        Raises:
            OSError: sbatch is missing or refused the job (its message).
        """
        script = write_scripts(self.settings, request)
        env = dict(request.env)
        if request.gpus > 0:
            env.pop("CUDA_VISIBLE_DEVICES", None)  # Slurm gives each node its GPUs
        self._cancel_previous(request, env)
        argv = sbatch_args(self.settings, request, script)
        log.info("job %s attempt %d: %s", request.job_id, request.attempt, " ".join(argv))
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired as exc:
            raise OSError(f"sbatch did not answer in 60 s: {exc}") from exc
        if done.returncode != 0:
            raise OSError(f"sbatch refused the job: {(done.stderr or done.stdout).strip()}")
        slurm_id = done.stdout.strip().split(";")[0]
        return SlurmJob(slurm_id, request.job_id, env, self.settings.slurm_poll_s)

    def _cancel_previous(self, request: LaunchRequest, env: dict[str, str]) -> None:
        """``scancel`` an earlier attempt's Slurm job of this job that still runs (its
        worker died and the reaper re-queued the job), so two never train at once; only a
        job of our name (``ly-<job id>``)."""
        old = str((request.previous or {}).get("job_id") or "")
        if not old.isdigit():
            return
        prev = SlurmJob(old, request.job_id, env, 0.0)
        fields = prev.refresh(force=True)
        if prev.state in ACTIVE_STATES and fields.get("JobName") == f"ly-{request.job_id[:12]}":
            log.warning("job %s: Slurm job %s of an earlier attempt still runs; scancel",
                        request.job_id, old)
            prev._cmd("scancel", old)

    def watch(self, engine: Any) -> ClusterNews | None:
        """:meth:`SlurmJob.news`."""
        return engine.news() if isinstance(engine, SlurmJob) else None

    def classify(self, engine: Any, outcome: Outcome) -> Outcome:
        """Slurm's end states as ours (see the module's docstring); a cancel or a worker
        shutdown, and COMPLETED, keep ``outcome``."""
        if not isinstance(engine, SlurmJob) or engine.stop_reason in (CANCEL, WORKER_SHUTDOWN):
            return outcome
        engine.refresh(force=True)
        state = engine.state
        error = dict(outcome.error or {})
        error["slurm_state"] = state
        if state in INFRA_STATES:
            why = f"Slurm: {INFRA_STATES[state]}"
            error["reason"] = why
            return Outcome(JobStatus.FAILED, error, {"reason": why, "exit_code": engine.rc},
                           INFRASTRUCTURE, why)
        if state in NAMED_STATES:
            why = f"Slurm: {NAMED_STATES[state]}"
            error["reason"] = why
            return Outcome(JobStatus.FAILED, error, {"reason": why, "exit_code": engine.rc},
                           JOB, why)
        mark = Path(engine.fields.get("WorkDir") or ".") / SIGNAL_MARK
        if outcome.status == JobStatus.FAILED and mark.is_file():
            why = ("Slurm's time limit is near (SIGUSR1, slurm_signal_s before it): the "
                   "engine saved last.pt and stopped")
            error["reason"] = why
            return Outcome(JobStatus.FAILED, error, {"reason": why, "exit_code": engine.rc},
                           JOB, why)
        if outcome.error is not None:
            return Outcome(outcome.status, error, outcome.event, outcome.end_class, outcome.why)
        return outcome

