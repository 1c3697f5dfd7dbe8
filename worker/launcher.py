"""The launcher interface: how a worker starts an attempt, watches it, stops it and
classifies its end, whatever runs it.

A :class:`Launcher` turns a :class:`LaunchRequest` (the job's folder, its ``job.json``,
the engine's argv and environment) into an :class:`Engine`: the handle the runner's watch
loop drives (:func:`worker.runner._watch`): ``poll`` for the exit code, ``terminate`` for
the graceful stop (the engine saves ``last.pt``), ``kill_if_overdue`` after the grace
period, ``kill_group`` for what is left. Two backends:

- :class:`LocalLauncher` (``launcher = "local"``, the default): torchrun on this host, a
  subprocess in a session of its own (:mod:`worker.process`); a multi-node job is a gang of
  our own workers (:mod:`worker.nodes`).
- :class:`worker.slurm.SlurmLauncher` (``launcher = "slurm"``): ``sbatch`` from this host;
  Slurm allocates the nodes and runs ``srun torchrun`` on each. It claims a multi-node job
  as a whole (:attr:`Launcher.whole`), reports the cluster's view of the attempt (its job id,
  nodes, state and waiting reason: :meth:`Launcher.watch`) and names the cluster's ends
  (:meth:`Launcher.classify`).

A Kubernetes backend (a Kubeflow ``TrainJob`` or a JobSet admitted by Kueue) would be one
more module with the same three methods; see ``docs/scaling.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from service.settings import Settings
from worker.outcome import Outcome
from worker.process import EngineProcess, spawn_engine

__all__ = ["ClusterNews", "Engine", "LaunchRequest", "Launcher", "LocalLauncher",
           "make_launcher"]


@dataclass(frozen=True)
class LaunchRequest:
    """One attempt to start.

    Args:
        job_id: the job.
        attempt: its attempt number (1 on the first run).
        job_dir: the job's folder (``job.json``, ``train.log``, ``run/``); a cluster
            launcher needs it on storage every node shares.
        spec_path: the engine's ``job.json`` (node 0's, for a gang node).
        log_path: where the engine's stdout and stderr go (node 0's: the job's log).
        argv: the local engine command (:func:`worker.launch.build_command`).
        env: the engine's environment (:func:`worker.launch.build_env` and the runner's).
        nodes, gpus, procs: the job's shape: hosts, GPUs per host (0: a CPU job) and ranks
            per host.
        priority: the job's priority (0..9), for a launcher that passes it on.
        resume_spec: a ``job.json`` that resumes from ``last.pt``, for an allocation the
            cluster re-runs (a cluster launcher picks it when ``last.pt`` exists).
        last_pt: where ``last.pt`` appears.
        previous: the job's ``jobs.cluster`` from an earlier attempt (a cluster launcher
            cancels that cluster job if it still runs: its worker died).
    """

    job_id: str
    attempt: int
    job_dir: Path
    spec_path: Path
    log_path: Path
    argv: list[str]
    env: dict[str, str]
    nodes: int = 1
    gpus: int = 0
    procs: int = 1
    priority: int = 0
    resume_spec: Path | None = None
    last_pt: Path | None = None
    previous: dict[str, Any] | None = None


@dataclass(frozen=True)
class ClusterNews:
    """What changed in the cluster's view of an attempt since the last look.

    ``cluster``: the new view for ``jobs.cluster`` (``launcher``, ``job_id``, ``nodes``,
    ``state``, ``reason``, ``restarts``); ``restarted``: why, when the cluster re-ran the
    allocation itself (a preemption, a node failure, ``scontrol requeue``): the runner
    counts attempt N+1, which resumes from ``last.pt``.
    """

    cluster: dict[str, Any] = field(default_factory=dict)
    restarted: str | None = None


class Engine(Protocol):
    """A started attempt as the watch loop drives it (:class:`worker.process.EngineProcess`
    is the local one)."""

    stop_reason: str | None

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def terminate(self, reason: str) -> None: ...

    def kill_if_overdue(self, *, now: float, grace_s: float, rc: int | None) -> None: ...

    def kill_group(self) -> None: ...


class Launcher(Protocol):
    """A backend that runs attempts (see the module's docstring)."""

    #: the ``launcher`` setting that selects it
    name: str
    #: True when one claim runs every node of a multi-node job (the cluster starts them)
    whole: bool

    def launch(self, request: LaunchRequest) -> Engine:
        """Start (or submit) the attempt.

        Raises:
            OSError: it could not be started (the message says why).
        """
        ...

    def watch(self, engine: Engine) -> ClusterNews | None:
        """What changed in the cluster's view since the last call; None when nothing did
        (the local launcher: always None)."""
        ...

    def classify(self, engine: Engine, outcome: Outcome) -> Outcome:
        """The end of the attempt as this backend knows it: ``outcome`` is what the exit
        code, the engine's error and the stop reason say (:func:`worker.outcome.exit_outcome`);
        a cluster launcher names its own ends (a node failure, a time limit)."""
        ...


class LocalLauncher:
    """torchrun (or the bare engine, one rank) on this host: today's launch, unchanged."""

    name = "local"
    whole = False

    def launch(self, request: LaunchRequest) -> EngineProcess:
        """The engine as a subprocess in a session of its own, its output appended to
        ``request.log_path`` (:func:`worker.process.spawn_engine`)."""
        with open(request.log_path, "ab") as logf:
            proc = spawn_engine(request.argv, cwd=request.job_dir, log_file=logf,
                                env=request.env)
        return EngineProcess(proc, request.job_id)

    def watch(self, engine: Engine) -> ClusterNews | None:
        """Nothing to report: no cluster."""
        return None

    def classify(self, engine: Engine, outcome: Outcome) -> Outcome:
        """``outcome`` as it is."""
        return outcome


def make_launcher(settings: Settings) -> Launcher:
    """The backend the ``launcher`` setting names."""
    if settings.launcher == "slurm":
        from worker.slurm import SlurmLauncher

        return SlurmLauncher(settings)
    return LocalLauncher()
