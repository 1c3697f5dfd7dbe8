"""A prepared training run: everything the loop needs, built before the loop starts.

:func:`prepare_run` does the set-up of one process's run in order: it opens a resume
checkpoint unless the caller did (the run then continues with the checkpoint's config),
joins the process group (torchrun / spawn), loads the dataset yaml unless the caller did
(:func:`load_run_data`, the one place that checks a resumed run's classes, before the
scan; :func:`~libreyolo_core.engine.train_run.train_run` calls it itself), builds the parts (:func:`~libreyolo_core.engine.build.build_parts`), the profile
window when ``profile`` is set, restores the resumed state, wraps the network in
``DistributedDataParallel`` and opens the run directory (rank 0 creates it; it alone writes
``events.jsonl`` and ``args.yaml``). The :class:`Run` it returns holds all of it, none of it
optional, so the :class:`~libreyolo_core.engine.trainer.Trainer` and its hooks read a
finished run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import yaml
from torch.nn.parallel import DistributedDataParallel

from libreyolo_core.config import TrainConfig
from libreyolo_core.data.config import DataConfig, load_data_config
from libreyolo_core.distributed.context import (
    DistContext,
    broadcast_object,
    init_distributed,
    set_phase,
)
from libreyolo_core.engine import fence
from libreyolo_core.engine.build import TrainParts, build_parts
from libreyolo_core.engine.events import EventLog
from libreyolo_core.engine.nonfinite import BatchNormGuard
from libreyolo_core.engine.profile_hook import build_profiler
from libreyolo_core.engine.resume import (
    Resume,
    announce_resume,
    check_resume_classes,
    open_resume,
    warn_ignored,
)
from libreyolo_core.engine.rundir import make_run_dir
from libreyolo_core.engine.state import TrainState
from libreyolo_core.models.family import Family
from libreyolo_core.models.registry import parse_model_name

if TYPE_CHECKING:
    from libreyolo_core.profiler.window import TrainingProfiler

__all__ = ["Run", "prepare_run", "load_run_data"]


@dataclass
class Run:
    """One process's prepared run (:func:`prepare_run`).

    Attributes:
        cfg: the config the run trains with (a resumed run's: the checkpoint's, see
            :meth:`~libreyolo_core.engine.resume.Resume.config`).
        dist: the process's rank context (a plain one outside DDP).
        device: the device this process trains on.
        family, size: the model's family and size code (``"t"``).
        names, nc: the dataset's classes (id -> name) and their number.
        parts: the built parts (the network wrapped in DDP under DDP).
        state: what is saved and resumed (a resumed run's, restored).
        resume: the checkpoint the run continues from, or None for a new run.
        run_dir: the run directory (every rank knows it; rank 0 alone writes in it).
        events: ``events.jsonl`` (rank 0; a disabled log on the other ranks).
        bn_guard: restores BatchNorm's statistics after a skipped step.
        owns_process_group: this run started the process group (and destroys it).
        profiler: the profile window (``profile=True``, single device), else None.
    """

    cfg: TrainConfig
    dist: DistContext
    device: torch.device
    family: Family
    size: str
    names: dict[int, str]
    nc: int
    parts: TrainParts
    state: TrainState
    resume: Resume | None
    run_dir: Path
    events: EventLog
    bn_guard: BatchNormGuard
    owns_process_group: bool = False
    profiler: TrainingProfiler | None = None

    @property
    def title(self) -> str:
        """The model's name, ``"YOLOv9-t"``."""
        return f"{self.family.title}-{self.size}"

    def meta(self) -> dict[str, Any]:
        """The checkpoint's model metadata: ``model_family``, ``size``, ``nc``, ``names``, ``imgsz``."""
        return {"model_family": self.family.name, "size": self.size, "nc": self.nc, "names": self.names,
                "imgsz": self.cfg.imgsz}


def prepare_run(cfg: TrainConfig, *, model: torch.nn.Module | None = None,
                resume: Resume | None = None, data: DataConfig | None = None,
                on_dist: Callable[[DistContext, bool], None] | None = None) -> Run:
    """Set up one process's run and return its :class:`Run` (the module docstring gives the
    order).

    Args:
        cfg: the resolved config (``data`` required; ``batch`` is global).
        model: a built network to start from (``build_parts`` builds another when it is
            None, when resuming, or when its ``nc`` differs from the dataset's).
        resume: the checkpoint ``cfg.resume`` names, when the caller already loaded it
            (:func:`~libreyolo_core.engine.resume.load_resume`; read once); None opens
            ``cfg.resume`` here (or starts a new run).
        data: the dataset yaml as :func:`load_run_data` gave it to the caller; None: here.
        on_dist: called as ``on_dist(context, owned)`` as soon as the process's
            :class:`DistContext` is known (``owned``: this call started the process group),
            so that a caller can name a collective's timeout and end the group when a
            later step of the set-up fails; or None.

    Raises:
        CheckpointError: a resume checkpoint that cannot be found or read, or whose class
            count differs from the dataset yaml's.
        ValueError: no ``data``, or a dataset yaml without ``train``; a resume checkpoint without training
            state; a global ``batch`` not divisible by the world size.
        DatasetError: a split that cannot be scanned.
        ProfileWindowError: ``profile`` and one epoch cannot hold the window's steps.
    """
    set_phase("set-up (process group, data scan, model)")
    if resume is None:
        resume = open_resume(cfg)
    ignored: list[str] = []
    if resume is not None:  # continue with the checkpoint's config
        ignored = resume.ignored(cfg)
        cfg = resume.config(cfg)
    owned = not (dist.is_available() and dist.is_initialized())
    ctx, device = init_distributed(cfg.device)
    owned = owned and ctx.enabled
    if on_dist is not None:
        on_dist(ctx, owned)
    if resume is not None and ignored and ctx.is_main:
        warn_ignored(ignored, resume)
    family, size = parse_model_name(cfg.model)
    torch.manual_seed(cfg.seed)

    if data is None:
        data = load_run_data(cfg, resume)
    names, nc = dict(data.names), len(data.names)
    arch = resume.arch(family) if resume is not None else None
    parts = build_parts(cfg, family=family, size=size, data=data, dist=ctx, device=device,
                        model=model, arch=arch)
    title = f"{family.title}-{size}"
    profiler = (build_profiler(cfg, parts, dist=ctx, device=device, title=title,
                               epochs_done=resume.epochs_done if resume else 0)
                if cfg.profile else None)
    state = TrainState()
    if resume is not None:
        _load_resume(resume, state, parts, cfg, ctx, title)
    bn_guard = BatchNormGuard(parts.model)  # a skipped step leaves BatchNorm as it was
    if ctx.enabled:
        _wrap_ddp(parts, device)
    run_dir, events = _open_run_dir(cfg, resume, ctx)
    return Run(cfg=cfg, dist=ctx, device=device, family=family, size=size, names=names, nc=nc,
               parts=parts, state=state, resume=resume, run_dir=run_dir, events=events,
               bn_guard=bn_guard, owns_process_group=owned, profiler=profiler)


def load_run_data(cfg: TrainConfig, resume: Resume | None) -> DataConfig:
    """The run's dataset yaml ``cfg.data``, loaded (not scanned); a resumed run's classes
    checked against it before the scan (a class mismatch is known from the yaml alone). The
    one place a resume's classes are checked: :func:`prepare_run` calls it, or the caller
    that hands it the result (:func:`~libreyolo_core.engine.train_run.train_run`).

    Raises:
        ValueError: no ``data``, or a yaml without ``train``.
        DataConfigError: the yaml cannot be read or is malformed.
        CheckpointError: ``resume``'s class count differs from the yaml's (same count,
            other names: a warning).
    """
    if not cfg.data:
        raise ValueError("data is required: a dataset yaml path (data=path/to/data.yaml)")
    data = load_data_config(cfg.data)  # every rank scans: the reports are cheap and identical
    if not data.train:
        raise ValueError(f"{data.yaml_path}: key 'train' is missing")
    if resume is not None:
        check_resume_classes(resume.ckpt, resume.path, data)
    return data


def _load_resume(resume: Resume, state: TrainState, parts: TrainParts, cfg: TrainConfig,
                 ctx: DistContext, title: str) -> None:
    """Restore the checkpoint's weights and training state into ``parts`` and ``state``,
    and say where the run continues."""
    set_phase("loading the resumed checkpoint")
    state.load(resume.ckpt, parts, path=resume.path, title=title,
               restore_rng=ctx.is_main)  # other ranks keep their seed + rank
    step = state.start_epoch * parts.steps_per_epoch
    announce_resume(resume, start_epoch=state.start_epoch, epochs=cfg.epochs,
                    lr=parts.schedule.lr(step), step=step, schedule=parts.schedule.kind,
                    main=ctx.is_main)


def _wrap_ddp(parts: TrainParts, device: torch.device) -> None:
    """Wrap the network in ``DistributedDataParallel`` (after a resume is loaded: rank 0's
    weights are broadcast); a compiled runner runs the wrapper (PyTorch's order)."""
    set_phase("DDP start-up (every rank waits until all have scanned the dataset and built "
              "the model, then rank 0's weights are broadcast)")
    cuda = device.type == "cuda"
    parts.model = DistributedDataParallel(
        parts.model, device_ids=[device.index] if cuda else None,
        output_device=device.index if cuda else None, find_unused_parameters=False)
    if parts.compiled is not None:  # torch.compile(DDP(model)): PyTorch's order
        parts.compiled.module = parts.model


def _open_run_dir(cfg: TrainConfig, resume: Resume | None, ctx: DistContext) -> tuple[Path, EventLog]:
    """Rank 0 chooses the run directory (a resumed run's own) and tells the others; it
    alone writes in it (``events.jsonl``, ``args.yaml``)."""
    main = ctx.is_main
    set_phase("opening the run directory (rank 0 creates it, the other ranks wait)")
    chosen = None
    if main:
        chosen = str(resume.run_dir if resume is not None
                     else make_run_dir(cfg.project, cfg.name, cfg.exist_ok))
    run_dir = Path(broadcast_object(chosen, ctx))
    events = EventLog(run_dir / "events.jsonl" if main else None)
    if main:
        fence.check("args.yaml")  # an attempt given up writes nothing
        (run_dir / "args.yaml").write_text(
            yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), encoding="utf-8")
    return run_dir, events
