"""The engine's command line, environment and ``job.json``.

One process: ``python -m libreyolo_core.cli train spec=<job.json>``. N ranks:
``python -m libreyolo_core.distributed.torchrun --standalone --nproc_per_node=N -m
libreyolo_core.cli train spec=<job.json>`` (torchrun, whose stop by SIGTERM ends with one
line and exit 143 instead of a traceback; ``--standalone`` picks a free rendezvous port, so
two jobs on one host do not collide).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from libreyolo_core.records.job import JobSpec
from service.settings import Settings

__all__ = ["CommandBuilder", "build_command", "build_env", "job_spec", "world_size"]

#: (spec path, rank count, settings) -> argv. Injectable for tests and custom engines.
CommandBuilder = Callable[[Path, int, Settings], list[str]]


def world_size(gpus: int, procs: int) -> int:
    """Ranks of a job: its GPU count, or ``procs`` CPU ranks (Gloo) when ``gpus == 0``."""
    return gpus if gpus > 0 else max(1, procs)


def build_command(spec_path: Path, nproc: int, settings: Settings) -> list[str]:
    """argv that starts the engine on ``spec_path`` with ``nproc`` ranks.

    ``settings.engine_command`` (a list with ``{spec}`` / ``{nproc}`` placeholders)
    replaces the default command when set.
    """
    if settings.engine_command:
        return [a.replace("{spec}", str(spec_path)).replace("{nproc}", str(nproc))
                for a in settings.engine_command]
    cmd = [settings.engine_python]
    if nproc > 1:
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
             options: Mapping[str, Any] | None = None) -> JobSpec:
    """The job's :class:`~libreyolo_core.records.job.JobSpec`: the engine's run dir is
    ``<job dir>/run``.

    A CPU job gets ``params.device = "cpu"``; GPU jobs keep the engine's ``auto``
    (ranks pick ``local_rank`` among ``CUDA_VISIBLE_DEVICES``). A tune job's options go in
    ``tune`` (the engine's ``TuneOptions``).
    """
    p = dict(params)
    if gpus == 0:
        p["device"] = "cpu"
    return JobSpec(kind=kind, model=model, data=data, params=p, project=str(job_dir),
                   name="run", exist_ok=True, resume=resume,
                   **({"tune": dict(options or {})} if kind == "tune" else {}))
