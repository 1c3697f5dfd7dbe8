"""The trainer's builder: one call that makes every part a run trains with.

:func:`build_parts` turns a resolved :class:`~libreyolo_core.config.TrainConfig` (and the
process's rank and device) into a :class:`TrainParts`: the network, its loss, the loaders,
the optimizer and its schedule, the AMP policy, the EMA, the CUDA-graph manager and the
``torch.compile`` runner. It
reads nothing from a trainer and writes no file, so a test can build the parts of a run on
CPU and drive them without one. The order of the builds is the order the random number
generator sees them in (the model's initial weights, then the datasets); resume depends
on it, so keep it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from libreyolo_core.config import TrainConfig
from libreyolo_core.data.config import DataConfig
from libreyolo_core.data.dataset import YOLODataset
from libreyolo_core.data.loader import build_dataloader
from libreyolo_core.data.scan import require_trainable, scan_split
from libreyolo_core.data.workers import apply_threads, local_ranks, plan_workers
from libreyolo_core.distributed.autobatch import autobatch
from libreyolo_core.distributed.batch import per_rank_batch
from libreyolo_core.distributed.context import (
    DistContext,
    broadcast_object,
    mean_normalizer,
    set_phase,
)
from libreyolo_core.engine.amp import AmpPolicy, resolve_amp
from libreyolo_core.engine.compiled import build_compiled_network
from libreyolo_core.engine.cuda_graph import build_cuda_graph_manager
from libreyolo_core.engine.ema import ModelEMA, unwrap
from libreyolo_core.engine.freeze import freeze_modules
from libreyolo_core.engine.memory_format import apply_memory_format
from libreyolo_core.engine.optim import LRSchedule, accumulate_steps, build_optimizer
from libreyolo_core.weights.transfer import compact_names

__all__ = ["TrainParts", "build_parts"]

log = logging.getLogger(__name__)


@dataclass
class TrainParts:
    """What a run trains with, as :func:`build_parts` returns it.

    Attributes:
        model: the network on the run's device (SyncBatchNorm under DDP when asked; the
            trainer wraps it in ``DistributedDataParallel`` after a resume is loaded).
        frozen: names of the modules ``freeze`` keeps as they are.
        amp: the precision policy (autocast dtype and the fp16 ``GradScaler``).
        batch: the global batch (``cfg.batch``, or autobatch's when -1); ``rank_batch`` the
            images each rank loads per micro-batch.
        train_set, train_loader: the augmented training split and its sampler-driven loader.
        val_loader: the validation loader (rank 0, ``val=True``), else None.
        loss_fn: the family's loss, ``loss_fn(outputs, targets, batch_size) -> (loss, items)``;
            ``item_names`` names ``items``.
        cuda_graph: the CUDA-graph manager, or None (eager).
        compiled: the ``torch.compile`` runner of the network (``compile``), or None; the
            trainer sets its ``module`` to the DDP wrapper under DDP.
        accumulate: micro-batches per optimizer step (``nbs``); ``steps_per_epoch`` optimizer
            steps of one epoch.
        optimizer, schedule: the parameter groups and the lr / momentum schedule.
        ema: the weights' moving average (rank 0 with ``ema=True``), else None.
        data_summary: ``{"train": ..., "val": ...}``, each split's
            :meth:`~libreyolo_core.data.report.ScanReport.defect_summary` (the run's result).
        memory_format: the network's layout (``channels_last``); the trainer hands it its
            input in the same one.
    """

    model: nn.Module
    frozen: list[str]
    amp: AmpPolicy
    batch: int
    rank_batch: int
    train_set: YOLODataset
    train_loader: Any
    val_loader: Any
    loss_fn: Any
    item_names: tuple[str, ...]
    cuda_graph: Any
    accumulate: int
    optimizer: torch.optim.Optimizer
    steps_per_epoch: int
    schedule: LRSchedule
    ema: ModelEMA | None
    data_summary: dict[str, Any] | None = None
    compiled: Any = None
    memory_format: torch.memory_format = torch.contiguous_format


def build_parts(cfg: TrainConfig, *, family: Any, size: str, data: DataConfig, dist: DistContext,
                device: torch.device, model: nn.Module | None = None,
                arch: dict[str, Any] | None = None) -> TrainParts:
    """Build every part of a run (see the module docstring for the order).

    Args:
        cfg: the resolved config (a resumed run's: the checkpoint's).
        family: the model's :class:`~libreyolo_core.models.family.Family` (``build_model``,
            ``build_loss``; :func:`~libreyolo_core.models.registry.parse_model_name`).
        size: the size code (``"t"``).
        data: the loaded dataset yaml (``train`` present; scanned here, on every rank).
        dist: the process's rank context; logs that concern the whole run come from rank 0.
        device: the device the model trains on.
        model: a built network to train; a new one is built when it is None, when ``arch``
            is given (a resume takes every weight from its checkpoint) or when its ``nc``
            differs from the dataset's.
        arch: a resumed checkpoint's head widths (``family.arch_from_state``), else None.

    Returns:
        The :class:`TrainParts`.

    Raises:
        ValueError: a global ``batch`` not divisible by the world size.
        DatasetError: a split that cannot be scanned.
    """
    main, ddp = dist.is_main, dist.enabled
    train_report, val_report = _scan(cfg, data, main)
    model, frozen = _model(cfg, family, size, len(data.names), device, main, model, arch)
    memory_format = torch.channels_last if apply_memory_format(
        model, cfg.channels_last, device, announce=main) else torch.contiguous_format
    amp = resolve_amp(cfg.amp, cfg.amp_dtype, device)
    batch = _resolve_batch(cfg, model, device, dist, amp)
    rank_batch = per_rank_batch(batch, dist.world_size)
    if ddp:
        torch.manual_seed(cfg.seed + dist.rank)
        model = _sync_batchnorm(model, cfg, device, dist, batch, rank_batch)
    train_set, train_loader, val_loader = _loaders(cfg, train_report, val_report, dist, rank_batch,
                                                   device)

    loss_fn = family.build_loss(model, cfg)
    if ddp and hasattr(loss_fn, "normalizer_reduce"):
        loss_fn.normalizer_reduce = mean_normalizer(dist)
    compiled, cuda_graph = _runners(cfg, model, device, family, main=main, ddp=ddp)

    accumulate = accumulate_steps(batch, cfg.nbs)
    optimizer = _optimizer(cfg, model, batch, accumulate)
    steps_per_epoch = math.ceil(len(train_loader) / accumulate)
    schedule = LRSchedule.from_config(cfg, steps_per_epoch)
    # rank 0 alone validates and saves, so only it keeps the EMA
    ema = ModelEMA(model, cfg.ema_decay, cfg.ema_tau) if cfg.ema and main else None
    if main and cfg.warmup_epochs > cfg.epochs:
        log.warning("warmup_epochs=%g is longer than the run (epochs=%d): the learning rate never "
                    "reaches lr0=%g; lower warmup_epochs", cfg.warmup_epochs, cfg.epochs, cfg.lr0)
    return TrainParts(model=model, frozen=frozen, amp=amp, batch=batch, rank_batch=rank_batch,
                      train_set=train_set, train_loader=train_loader, val_loader=val_loader,
                      loss_fn=loss_fn, item_names=tuple(loss_fn.item_names), cuda_graph=cuda_graph,
                      accumulate=accumulate, optimizer=optimizer, steps_per_epoch=steps_per_epoch,
                      schedule=schedule, ema=ema, compiled=compiled, memory_format=memory_format,
                      data_summary={name: r.defect_summary() for name, r in
                                    (("train", train_report), ("val", val_report)) if r is not None})


def _runners(cfg: TrainConfig, model: nn.Module, device: torch.device, family: Any, *, main: bool,
             ddp: bool) -> tuple[Any, Any]:
    """The ``torch.compile`` runner and the CUDA-graph manager (each or both None: eager).
    ``compile`` wins over ``cuda_graph`` (one line says so); under DDP there is no graph
    manager, and the trainer points the compiled runner at the DDP wrapper."""
    compiled = build_compiled_network(model, cfg.compile, device, announce=main)
    if compiled is not None and cfg.cuda_graph:
        if main:
            log.info("cuda_graph=True ignored: compile=%s compiles the network instead (the two "
                     "do not stack; compile='reduce-overhead' adds CUDA graphs to the compiled "
                     "network)", compiled.mode)
        return compiled, None
    if ddp and cfg.cuda_graph:
        if main:
            log.info("cuda_graph: not available under DDP; training eager")
        return compiled, None
    # None (eager, one log line) unless cuda_graph=True on CUDA for a family that allows it
    return compiled, build_cuda_graph_manager(model, cfg.cuda_graph, device, family=family)


def _optimizer(cfg: TrainConfig, model: nn.Module, batch: int, accumulate: int) -> torch.optim.Optimizer:
    """The optimizer, its weight decay scaled to the images of one optimizer step over
    ``nbs`` (``batch * accumulate / nbs``) when ``nbs`` is set."""
    weight_decay = cfg.weight_decay
    if cfg.nbs:
        weight_decay *= batch * accumulate / cfg.nbs
    return build_optimizer(model, cfg.optimizer, cfg.lr0, cfg.momentum, weight_decay, cfg.nesterov)


def _scan(cfg: TrainConfig, data: DataConfig, main: bool) -> tuple[Any, Any]:
    """The train split's scan report and the val split's (the train split when the yaml
    has no ``val:``; None unless ``val`` and rank 0)."""
    set_phase("scanning the train split (reading or building its label cache; every rank)")
    train_report = require_trainable(scan_split(data, "train", cache_dir=cfg.cache_dir), "train")
    val_split = "val" if data.val else "train"
    if cfg.val and main:
        set_phase(f"scanning the {val_split} split for validation (reading or building its label "
                  f"cache; rank 0 alone, the other ranks go on)")
    if val_split == "train" and cfg.val and main:
        log.warning("%s has no 'val:' split: validating on the train split (its metrics "
                    "overstate what the model does on unseen images)", data.yaml_path)
    # validation runs on rank 0 alone (the others wait), so its metrics are one process's
    return train_report, (scan_split(data, val_split, cache_dir=cfg.cache_dir)
                          if cfg.val and main else None)


def _model(cfg: TrainConfig, family: Any, size: str, nc: int, device: torch.device, main: bool,
           model: nn.Module | None, arch: dict[str, Any] | None) -> tuple[nn.Module, list[str]]:
    """The network on ``device`` (see :func:`build_parts` for when it is built anew) and the
    names of the modules ``freeze`` keeps. Under DDP the wrapper broadcasts rank 0's weights."""
    set_phase("building the model")
    if model is None or arch is not None or getattr(unwrap(model), "nc", nc) != nc:
        model = family.build_model(size, nc, **(arch or {}))
    model.to(device)
    frozen = freeze_modules(model, cfg.freeze)
    if frozen and main:
        log.info("freeze: %d modules keep their weights and BatchNorm statistics: %s", len(frozen),
                 ", ".join(compact_names(frozen)))
    return model, frozen


def _loaders(cfg: TrainConfig, train_report: Any, val_report: Any, dist: DistContext,
             rank_batch: int, device: torch.device) -> tuple[YOLODataset, Any, Any]:
    """The augmented train set, its loader (each rank its share; ``loader=gpu``: decoded and
    augmented on ``device``) and the val loader (or None; always the CPU loader)."""
    set_phase("building the data loaders (and the image cache when cache= is set)")
    train_set = YOLODataset(train_report, cfg.imgsz, augment=True, aug=cfg.augment, cache=cfg.cache,
                            seed=cfg.seed, rank=dist.rank, cache_dir=cfg.cache_dir,
                            cache_recent_mb=0 if cfg.loader == "gpu" else cfg.cache_recent_mb)
    visible = math.ceil(len(train_set) / dist.world_size)
    plan = plan_workers(cfg.workers, local_ranks(dist.world_size))
    apply_threads(plan)
    if dist.is_main:
        log.info(plan.describe())
        if (recent := train_set.describe_recent()) is not None:
            log.info(recent)
    if cfg.loader == "gpu":
        train_loader = _gpu_loader(cfg, train_set, dist, rank_batch, plan.workers, device,
                                   drop_last=visible >= rank_batch)
    else:
        train_loader = build_dataloader(train_set, rank_batch, plan.workers, shuffle=True,
                                        seed=cfg.seed, rank=dist.rank, world_size=dist.world_size,
                                        drop_last=visible >= rank_batch)
    if visible < rank_batch and dist.is_main:
        world, per_rank = dist.world_size, " per rank" if dist.world_size > 1 else ""
        log.warning("batch=%d is more than the %d training images%s: every epoch is one partial "
                    "batch of %d (one optimizer step), while what scales with the batch (weight "
                    "decay, nbs accumulation) assumes %d; use batch=%d or less",
                    rank_batch * world, visible, per_rank, visible, rank_batch * world,
                    visible * world)
    if visible >= rank_batch and visible % rank_batch and dist.is_main:
        log.info("the sampler drops the last %d of %d images of each epoch on each rank (a partial "
                 "batch of %d); shuffling drops other images each epoch", visible % rank_batch,
                 visible, rank_batch)
    if val_report is None:
        return train_set, train_loader, None
    val_set = YOLODataset(val_report, cfg.imgsz, augment=False, cache=cfg.cache, seed=cfg.seed, rank=0,
                          cache_dir=cfg.cache_dir, cache_recent_mb=cfg.cache_recent_mb)
    return train_set, train_loader, build_dataloader(val_set, rank_batch, min(plan.workers, 2),
                                                     shuffle=False, seed=cfg.seed)


def _gpu_loader(cfg: TrainConfig, train_set: YOLODataset, dist: DistContext, rank_batch: int,
                workers: int, device: torch.device, drop_last: bool) -> Any:
    """The ``loader=gpu`` training loader (:mod:`libreyolo_core.data.gpu_loader`).

    Raises:
        ValueError: a device that is neither CUDA nor the CPU (nvjpeg needs CUDA; the CPU
            runs the same tensor code, for tests and comparisons).
    """
    from libreyolo_core.data.gpu_loader import build_gpu_dataloader

    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"loader=gpu needs a CUDA device (device={device.type!r}); use loader=cpu")
    if dist.is_main:
        where = ("nvjpeg and batched tensor ops on " + str(device) if device.type == "cuda" else
                 "tensor ops on the CPU in the main process (a CPU device: for tests, not speed)")
        log.info("loader=gpu: %d worker(s) read files; decode and augmentation run as %s",
                 workers, where)
    return build_gpu_dataloader(train_set, rank_batch, workers, device, seed=cfg.seed,
                                rank=dist.rank, world_size=dist.world_size, drop_last=drop_last)


def _resolve_batch(cfg: TrainConfig, model: nn.Module, device: torch.device, dist: DistContext,
                   amp: AmpPolicy) -> int:
    """The global batch: ``cfg.batch``, or measured by autobatch when it is -1 (rank 0
    probes its device and broadcasts the result)."""
    if cfg.batch != -1:
        return cfg.batch
    set_phase("autobatch (rank 0 probes batch sizes, the others wait)")
    batch = autobatch(model, cfg.imgsz, device, dist.world_size, cfg.nbs,
                      autocast=amp.autocast) if dist.is_main else None
    return int(broadcast_object(batch, dist))


def _sync_batchnorm(model: nn.Module, cfg: TrainConfig, device: torch.device, dist: DistContext,
                    batch: int, rank_batch: int) -> nn.Module:
    """BatchNorm -> SyncBatchNorm under DDP when ``sync_bn`` (docs/architecture.md,
    "Multi-device"); warn when per-rank batch statistics come from fewer than 16 images."""
    has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    if not has_bn:
        return model
    synced = cfg.sync_bn and device.type == "cuda"
    if synced:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    elif dist.is_main and cfg.sync_bn:
        log.info("sync_bn: SyncBatchNorm needs CUDA tensors; BatchNorm stays per-rank on %s", device)
    if not synced and rank_batch < 16 and dist.is_main:
        log.warning("BatchNorm statistics come from %d images per rank (batch %d / world_size %d); "
                    "%s", rank_batch, batch, dist.world_size,
                    "set sync_bn=True to share them across ranks" if not cfg.sync_bn
                    else "on CUDA sync_bn would share them across ranks")
    return model
