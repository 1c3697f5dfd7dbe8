"""The engine's command line, environment and ``job.json``.

One process: ``python -m libreyolo_core.cli train spec=<job.json>``. N ranks:
``python -m libreyolo_core.distributed.torchrun --standalone --nproc_per_node=N -m
libreyolo_core.cli train spec=<job.json>`` (torchrun, whose stop by SIGTERM ends with one
line and exit 143 instead of a traceback; ``--standalone`` picks a free rendezvous port, so
two jobs on one host do not collide).

One node of a multi-node job (:class:`NodeLaunch`): the same torchrun with ``--nnodes``,
``--node-rank`` (the node's slot) and torchrun's static rendezvous at node 0's published
endpoint: node 0's agent hosts the TCP store there and waits for the others (at most
``join_timeout_s``); ``--rdzv-id`` is the job and attempt. The static backend keeps
torch's node order equal to the slots, so global rank 0, the rank that logs, writes
events and checkpoints, runs on node 0, whose log is the job's log. (c10d's rendezvous
numbers the agents by their address and pid instead and ignores ``--node-rank``: rank 0
landed on node 1 in most 2-node runs, and ``GET /v1/jobs/{id}/logs`` showed no training.)
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libreyolo_core.records.job import JobSpec
from service.settings import Settings

__all__ = ["CommandBuilder", "NodeLaunch", "build_command", "build_env", "job_spec",
           "world_size"]


@dataclass(frozen=True)
class NodeLaunch:
    """One node of a multi-node job: ``nnodes`` in the world, this node's ``node_rank``
    (its slot), node 0's rendezvous ``endpoint`` (``addr:port``), the rendezvous ``run_id``
    (``<job id>-<attempt>``), this worker's ``local_addr`` and how long the agents wait
    for each other (``join_timeout_s``)."""

    nnodes: int
    node_rank: int
    endpoint: str
    run_id: str
    local_addr: str
    join_timeout_s: float

    def torchrun_args(self) -> list[str]:
        """The torchrun flags of this node."""
        return [f"--nnodes={self.nnodes}", f"--node-rank={self.node_rank}",
                "--rdzv-backend=static", f"--rdzv-endpoint={self.endpoint}",
                f"--rdzv-id={self.run_id}", f"--rdzv-conf=timeout={max(1, int(self.join_timeout_s))}",
                f"--local-addr={self.local_addr}", "--max-restarts=0"]


#: (spec path, ranks per node, settings, node or None) -> argv. Injectable for tests and
#: custom engines.
CommandBuilder = Callable[[Path, int, Settings, NodeLaunch | None], list[str]]


def world_size(gpus: int, procs: int) -> int:
    """Ranks of a job: its GPU count, or ``procs`` CPU ranks (Gloo) when ``gpus == 0``."""
    return gpus if gpus > 0 else max(1, procs)


def build_command(spec_path: Path, nproc: int, settings: Settings,
                  node: NodeLaunch | None = None) -> list[str]:
    """argv that starts the engine on ``spec_path`` with ``nproc`` ranks (on this node,
    when ``node`` is one node of a multi-node job).

    ``settings.engine_command`` (a list with ``{spec}``, ``{nproc}``, ``{nnodes}`` and
    ``{node_rank}`` placeholders) replaces the default command when set.
    """
    if settings.engine_command:
        values = {"{spec}": str(spec_path), "{nproc}": str(nproc),
                  "{nnodes}": str(node.nnodes if node else 1),
                  "{node_rank}": str(node.node_rank if node else 0)}
        out = []
        for arg in settings.engine_command:
            for key, value in values.items():
                arg = arg.replace(key, value)
            out.append(arg)
        return out
    cmd = [settings.engine_python]
    if node is not None:
        cmd += ["-m", "libreyolo_core.distributed.torchrun", *node.torchrun_args(),
                f"--nproc-per-node={nproc}"]
    elif nproc > 1:
        cmd += ["-m", "libreyolo_core.distributed.torchrun", "--standalone",
                f"--nproc_per_node={nproc}"]
    return cmd + ["-m", "libreyolo_core.cli", "train", f"spec={spec_path}"]


def build_env(gpu_ids: Sequence[str] | None, gpus: int,
              base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of the engine: ``CUDA_VISIBLE_DEVICES`` = the first ``gpus`` of the
    worker's GPUs (empty for a CPU job, so the engine never grabs a GPU)."""
    env = dict(os.environ if base is None else base)
    if gpus == 0:
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(list(gpu_ids)[:gpus])
    env.setdefault("PYTHONUNBUFFERED", "1")
    # The engine runs with cwd = the job dir: make the engine package importable even when
    # it is used from a source checkout rather than installed.
    spec = importlib.util.find_spec("libreyolo_core")
    if spec is not None and spec.origin:
        root = str(Path(spec.origin).resolve().parents[1])
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if root not in parts:
            env["PYTHONPATH"] = os.pathsep.join([root, *parts])
    return env


def job_spec(*, kind: str, model: str, data: str, params: Mapping[str, Any], gpus: int,
             job_dir: Path, resume: str | bool,
             options: Mapping[str, Any] | None = None,
             cache_dir: Path | None = None) -> JobSpec:
    """The job's :class:`~libreyolo_core.records.job.JobSpec`: the engine's run dir is
    ``<job dir>/run``; ``cache_dir`` (the setting ``cache_root``) holds its label-scan
    and image caches, so the engine never writes into the dataset's folders.

    A CPU job gets ``params.device = "cpu"``; GPU jobs keep the engine's ``auto``
    (ranks pick ``local_rank`` among ``CUDA_VISIBLE_DEVICES``). A tune job's options go in
    ``tune`` (the engine's ``TuneOptions``).
    """
    p = dict(params)
    if cache_dir is not None:
        p["cache_dir"] = str(cache_dir)
    if gpus == 0:
        p["device"] = "cpu"
    return JobSpec(kind=kind, model=model, data=data, params=p, project=str(job_dir),
                   name="run", exist_ok=True, resume=resume,
                   **({"tune": dict(options or {})} if kind == "tune" else {}))
