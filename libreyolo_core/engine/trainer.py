"""The training loop: data -> forward + loss (autocast) -> backward (scaled) -> step -> EMA.

One ``Trainer`` runs one training run of one process: the whole run on one device, or
one rank of a DDP job (torchrun or the spawn launcher; see docs/architecture.md,
"Multi-device"). It owns the run directory,
``events.jsonl``, ``results.csv`` and the checkpoints, and it is the place where the
schedule, accumulation (``nbs``), AMP, EMA, validation, early stopping, resume and
SIGTERM handling meet. Families plug in through the ``Family`` contract
(``libreyolo_core/models/family.py``: ``build_model``, ``build_loss``, ``preprocess``,
``postprocess``, hooks such as ``on_mosaic_disable`` with no-op defaults).
"""

from __future__ import annotations

import contextlib
import csv
import difflib
import io
import logging
import math
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import yaml
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import libreyolo_core
from libreyolo_core.config import TrainConfig
from libreyolo_core.data.config import load_data_config
from libreyolo_core.data.dataset import YOLODataset
from libreyolo_core.data.loader import build_dataloader
from libreyolo_core.data.scan import scan_split
from libreyolo_core.distributed.autobatch import autobatch
from libreyolo_core.distributed.batch import per_rank_batch
from libreyolo_core.distributed.context import (
    DistContext,
    all_reduce_sum,
    broadcast_object,
    destroy_distributed,
    init_distributed,
    mean_normalizer,
    set_phase,
    timeout_error,
)
from libreyolo_core.engine.amp import resolve_amp
from libreyolo_core.engine.checkpoint import (
    CheckpointError,
    lean_state,
    load_checkpoint,
    refuse_nonfinite,
    save_checkpoint,
)
from libreyolo_core.engine.cuda_graph import build_cuda_graph_manager
from libreyolo_core.engine.ema import ModelEMA, unwrap
from libreyolo_core.engine.eta import eta as estimate_eta
from libreyolo_core.engine.eta import validations_left
from libreyolo_core.engine.events import EventLog
from libreyolo_core.engine.freeze import freeze_modules, keep_frozen_eval
from libreyolo_core.engine.nonfinite import BatchNormGuard, describe_nonfinite, grads_finite
from libreyolo_core.engine.optim import LRSchedule, accumulate_steps, build_optimizer
from libreyolo_core.engine.resume import check_resume_classes
from libreyolo_core.engine.rundir import latest_last_checkpoint, make_run_dir
from libreyolo_core.eval.validate import validate
from libreyolo_core.models.registry import parse_model_name
from libreyolo_core.weights.transfer import compact_names

__all__ = ["Trainer", "TrainingInterrupted", "NonFiniteLossError", "fitness"]

log = logging.getLogger(__name__)

_NULL = contextlib.nullcontext()

#: The events ``callbacks`` may name (called on rank 0 with the trainer).
CALLBACK_EVENTS = ("on_train_start", "on_epoch_end", "on_train_end")

#: Consecutive non-finite losses that stop a run.
MAX_NONFINITE_STREAK = 10
#: Wall-clock seconds between progress events (and log lines) at most, whatever
#: ``log_interval`` says: long steps, a small dataset or validation never go quiet.
PROGRESS_EVERY_S = 2.0


class TrainingInterrupted(RuntimeError):
    """SIGTERM (or a callback's stop request) ended the run after saving ``last.pt``.

    Attributes:
        last_checkpoint: the ``last.pt`` written (None when not known, e.g. on a rank
            other than 0).
    """

    def __init__(self, reason: str, last_checkpoint: str | os.PathLike[str] | None = None):
        super().__init__(reason)
        self.last_checkpoint = None if last_checkpoint is None else str(last_checkpoint)


class NonFiniteLossError(RuntimeError):
    """The run diverged: ten consecutive non-finite losses, or an epoch in which no
    optimizer step could be taken (every step non-finite or skipped by the AMP scaler)."""


def fitness(metrics: dict[str, float]) -> float:
    """Model selection score: ``0.1 * mAP50 + 0.9 * mAP50-95`` (Ultralytics' convention)."""
    return 0.1 * metrics.get("mAP50", 0.0) + 0.9 * metrics.get("mAP50-95", 0.0)


class Trainer:
    """Train one model on one device, or be one rank of a DDP job when the torchrun
    variables are set (``WORLD_SIZE > 1``).

    Args:
        cfg: the resolved :class:`TrainConfig` (``data`` required; ``batch`` is global).
        model: an already built network to train (its ``nc`` must match the dataset);
            ``None`` builds one from the registry.
        callbacks: ``{event: [fn(trainer), ...]}`` for ``on_train_start``,
            ``on_epoch_end``, ``on_train_end`` (called on rank 0 only).
        preflight: the run's preflight estimate
            (:class:`~libreyolo_core.profiler.preflight.PreflightEstimate`), measured before
            this trainer by :meth:`LibreYOLO.train`; it is written into the run directory
            (``preflight.json``, the trial's files under ``preflight/``), announced as a
            ``preflight`` event, and its validation time seeds the ETA until one ran.

    Raises (from :meth:`train`):
        TrainingInterrupted: after SIGTERM or a stop request, once ``last.pt`` is written
            (under DDP every rank raises it at the same step).
        NonFiniteLossError: ten non-finite losses in a row, or an epoch without one
            optimizer step taken (the message names the first bad step and loss terms).
        NonFiniteCheckpointError: a checkpoint to write (or resume) holds NaN/inf.
        ValueError: a global ``batch`` not divisible by the world size.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        model: nn.Module | None = None,
        callbacks: dict[str, list[Callable[[Trainer], None]]] | None = None,
        preflight: Any = None,
    ):
        if not cfg.data:
            raise ValueError("data is required: a dataset yaml path (data=path/to/data.yaml)")
        for event, fns in (callbacks or {}).items():
            if event not in CALLBACK_EVENTS:
                close = difflib.get_close_matches(str(event), CALLBACK_EVENTS, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"callbacks: unknown event {event!r}.{hint} Events: {', '.join(CALLBACK_EVENTS)}")
            if not isinstance(fns, list | tuple) or not all(callable(fn) for fn in fns):
                raise ValueError(f"callbacks[{event!r}] must be a list of callables fn(trainer), "
                                 f"got {fns!r}")
        self.cfg = cfg
        self.callbacks = callbacks or {}
        self.model = model
        self.stop_requested = False
        self.stop_reason = ""
        self.run_dir: Path | None = None
        self.best_fitness = -1.0
        self.best_epoch = 0
        self.best_metrics: dict[str, float] = {}
        self.metrics: dict[str, float] = {}
        self.epoch = 0
        self.history: list[dict[str, Any]] = []
        self.nonfinite_skipped = 0
        self.nonfinite_streak = 0  # consecutive, across epochs
        self.amp_skipped = 0  # optimizer steps the fp16 GradScaler skipped (inf/NaN grads)
        self._steps_applied = 0  # optimizer steps taken (neither skipped nor scaler-skipped)
        self.profiler = None  # set in _setup only when cfg.profile
        self.profile_summary: dict[str, Any] | None = None
        self.profile_only = False
        self._last_window_report = 0.0  # when the profile window's progress was last reported
        self.dist = DistContext()  # replaced in _setup under torchrun / spawn
        self._owns_process_group = False
        self._stop_agreed = False  # under DDP: every rank knows a stop was requested
        self.preflight = preflight
        self._train_s: list[float] = []  # training seconds of each completed epoch (ETA)
        self._val_s: list[float] = []  # seconds of each completed validation (ETA)
        self._t_train_start = 0.0

    # -- callbacks / signals ------------------------------------------------------------
    def _fire(self, event: str) -> None:
        """Call the user callbacks of ``event`` (rank 0 only under DDP)."""
        if not self.dist.is_main:
            return
        for fn in self.callbacks.get(event, []):
            fn(self)

    def request_stop(self, reason: str = "stop requested") -> None:
        """Finish the current step, save ``last.pt`` and end the run as ``interrupted``."""
        self.stop_requested, self.stop_reason = True, reason

    def _stopping(self) -> bool:
        """Whether to stop now. Under DDP only a request every rank has seen counts (it
        travels with the per-step reduction), so all ranks leave the loop at the same step."""
        return self._stop_agreed if self.dist.enabled else self.stop_requested

    def _install_sigterm(self):
        """SIGTERM requests a stop (main thread only). A Python handler it replaces is called
        too: a caller running this trainer inside a longer job (a tune's trials, a
        preflight) learns of the stop even when it lands after the profile window."""
        if threading.current_thread() is not threading.main_thread():
            return None
        outer = signal.getsignal(signal.SIGTERM)

        def handler(signum, frame):
            log.warning("SIGTERM received: finishing the current step, then saving last.pt")
            self.request_stop("SIGTERM")
            if callable(outer):
                outer(signum, frame)

        return signal.signal(signal.SIGTERM, handler)

    # -- set-up ---------------------------------------------------------------------------
    def _resume_state(self) -> dict[str, Any] | None:
        resume = self.cfg.resume
        if not resume:
            return None
        path = latest_last_checkpoint(self.cfg.project) if resume is True else Path(str(resume))
        ckpt = load_checkpoint(path)
        if "optimizer" not in ckpt or "epoch" not in ckpt:
            raise ValueError(f"{path}: has no training state to resume (a final/inference checkpoint)")
        # Continue with the checkpoint's config; where to find things and how long to
        # train may change.
        keep = {k: getattr(self.cfg, k) for k in ("data", "device", "workers", "epochs")
                if k in self.cfg.model_fields_set}
        saved = TrainConfig(**{**ckpt["config"], **keep, "resume": str(path)})
        self.cfg = saved
        self._resume_path = path
        return ckpt

    def _setup(self) -> None:
        set_phase("set-up (process group, data scan, model)")
        ckpt = self._resume_state()
        cfg = self.cfg
        owned = not (dist.is_available() and dist.is_initialized())
        self.dist, self.device = init_distributed(cfg.device)
        self._owns_process_group = owned and self.dist.enabled
        ddp, main = self.dist.enabled, self.dist.is_main
        self.family, self.size = parse_model_name(cfg.model)
        torch.manual_seed(cfg.seed)

        # data (every rank scans: the reports are cheap and identical)
        self.data_cfg = load_data_config(cfg.data)
        if not self.data_cfg.train:
            raise ValueError(f"{self.data_cfg.yaml_path}: key 'train' is missing")
        if ckpt is not None:  # before the scan: a class mismatch is known from the yaml alone
            check_resume_classes(ckpt, self._resume_path, self.data_cfg)
        self.names = dict(self.data_cfg.names)
        self.nc = len(self.names)
        train_report = scan_split(self.data_cfg, "train")
        val_split = "val" if self.data_cfg.val else "train"
        if val_split == "train" and cfg.val and main:
            log.warning("%s has no 'val:' split: validating on the train split (its metrics "
                        "overstate what the model does on unseen images)", self.data_cfg.yaml_path)
        # validation runs on rank 0 alone (the others wait), so its metrics are one process's
        val_report = scan_split(self.data_cfg, val_split) if cfg.val and main else None

        # model (DDP broadcasts rank 0's weights when it wraps the model below)
        # a resumed run takes every weight from its checkpoint: build its own model
        if self.model is None or ckpt is not None or getattr(unwrap(self.model), "nc", self.nc) != self.nc:
            # a resumed model keeps the head widths it was trained with (YOLOv9's class tower)
            arch = self.family.arch_from_state(ckpt.get("train_model", ckpt["model"])) if ckpt else {}
            self.model = self.family.build_model(self.size, self.nc, **arch)
        self.model.to(self.device)
        self.frozen = freeze_modules(self.model, cfg.freeze)
        if self.frozen and main:
            log.info("freeze: %d modules keep their weights and BatchNorm statistics: %s", len(self.frozen),
                     ", ".join(compact_names(self.frozen)))
        self.amp = resolve_amp(cfg.amp, cfg.amp_dtype, self.device)
        self.batch = self._resolve_batch()
        self.rank_batch = per_rank_batch(self.batch, self.dist.world_size)
        if ddp:
            torch.manual_seed(cfg.seed + self.dist.rank)
            self.model = self._sync_batchnorm(self.model)

        self.train_set = YOLODataset(train_report, cfg.imgsz, augment=True, aug=cfg.augment,
                                     cache=cfg.cache, seed=cfg.seed, rank=self.dist.rank)
        visible = math.ceil(len(self.train_set) / self.dist.world_size)
        self.train_loader = build_dataloader(
            self.train_set, self.rank_batch, cfg.workers, shuffle=True, seed=cfg.seed,
            rank=self.dist.rank, world_size=self.dist.world_size, drop_last=visible >= self.rank_batch,
        )
        if visible >= self.rank_batch and visible % self.rank_batch and main:
            log.info("the sampler drops the last %d of %d images of each epoch on each rank (a partial "
                     "batch of %d); shuffling drops other images each epoch", visible % self.rank_batch,
                     visible, self.rank_batch)
        self.val_loader = None
        if val_report is not None:
            val_set = YOLODataset(val_report, cfg.imgsz, augment=False, cache=cfg.cache,
                                  seed=cfg.seed, rank=0)
            self.val_loader = build_dataloader(val_set, self.rank_batch, min(cfg.workers, 2),
                                               shuffle=False, seed=cfg.seed)

        # loss, graphs
        self.loss_fn = self.family.build_loss(self.model, cfg)
        self.item_names = tuple(self.loss_fn.item_names)
        if ddp and hasattr(self.loss_fn, "normalizer_reduce"):
            self.loss_fn.normalizer_reduce = mean_normalizer(self.dist)
        if ddp and cfg.cuda_graph:
            if main:
                log.info("cuda_graph: not available under DDP; training eager")
            self.cuda_graph = None
        else:
            # None (eager, one log line) unless cuda_graph=True on CUDA for a family that allows it
            self.cuda_graph = build_cuda_graph_manager(self.model, cfg.cuda_graph, self.device,
                                                       family=self.family)

        # optimizer, accumulation, schedule
        self.accumulate = accumulate_steps(self.batch, cfg.nbs)
        weight_decay = cfg.weight_decay
        if cfg.nbs:
            weight_decay *= self.batch * self.accumulate / cfg.nbs
        self.optimizer = build_optimizer(self.model, cfg.optimizer, cfg.lr0, cfg.momentum,
                                         weight_decay, cfg.nesterov)
        self.steps_per_epoch = math.ceil(len(self.train_loader) / self.accumulate)
        self.schedule = LRSchedule.from_config(cfg, self.steps_per_epoch)
        # rank 0 alone validates and saves, so only it keeps the EMA
        self.ema = ModelEMA(self.model, cfg.ema_decay, cfg.ema_tau) if cfg.ema and main else None
        self.start_epoch = 0
        if main and cfg.warmup_epochs > cfg.epochs:
            log.warning("warmup_epochs=%g is longer than the run (epochs=%d): the learning rate never "
                        "reaches lr0=%g; lower warmup_epochs", cfg.warmup_epochs, cfg.epochs, cfg.lr0)

        if cfg.profile and ddp:
            if main:
                log.warning("profile: the training profiler does not run under DDP; ignored "
                            "(profile a single-device run instead)")
        elif cfg.profile:
            from libreyolo_core.profiler import TrainingProfiler

            # the window stays inside the first epoch this run trains (LibreYOLO's contract)
            epochs_left = cfg.epochs - (int(ckpt["epoch"]) + 1 if ckpt else 0)
            self.profiler = TrainingProfiler(
                cfg, device=self.device, batch=self.batch, accumulate=self.accumulate,
                steps_available=len(self.train_loader) if epochs_left > 0 else 0,
                images=len(self.train_set), nbs=cfg.nbs,
                meta={"model": f"{self.family.title}-{self.size}", "device": str(self.device),
                      "batch": self.batch, "imgsz": cfg.imgsz, "amp": self.amp.enabled,
                      "amp_dtype": self.amp.name, "workers": cfg.workers, "cuda_graph": cfg.cuda_graph,
                      "world_size": 1, "torch": torch.__version__},
            )
        if ckpt is not None:
            self._load_resume(ckpt)
        self.bn_guard = BatchNormGuard(self.model)  # a skipped step leaves BatchNorm as it was
        if ddp:
            cuda = self.device.type == "cuda"
            self.model = DistributedDataParallel(
                self.model, device_ids=[self.device.index] if cuda else None,
                output_device=self.device.index if cuda else None, find_unused_parameters=False,
            )

        # rank 0 chooses the run directory and tells the others; it alone writes in it
        if main:
            if ckpt is not None:
                self.run_dir = self._resume_path.parent.parent
            else:
                self.run_dir = make_run_dir(cfg.project, cfg.name, cfg.exist_ok)
        self.run_dir = Path(broadcast_object(str(self.run_dir) if main else None, self.dist))
        self.events = EventLog(self.run_dir / "events.jsonl" if main else None)
        if main:
            (self.run_dir / "args.yaml").write_text(
                yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), encoding="utf-8"
            )

    def _resolve_batch(self) -> int:
        """The global batch: ``cfg.batch``, or measured by autobatch when it is -1 (rank 0
        probes its device and broadcasts the result)."""
        cfg = self.cfg
        if cfg.batch != -1:
            return cfg.batch
        set_phase("autobatch (rank 0 probes batch sizes, the others wait)")
        batch = autobatch(self.model, cfg.imgsz, self.device, self.dist.world_size, cfg.nbs,
                          autocast=self.amp.autocast) if self.dist.is_main else None
        return int(broadcast_object(batch, self.dist))

    def _sync_batchnorm(self, model: nn.Module) -> nn.Module:
        """BatchNorm -> SyncBatchNorm under DDP when ``sync_bn`` (reference D.6); warn when
        per-rank batch statistics come from fewer than 16 images."""
        has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
        if not has_bn:
            return model
        synced = self.cfg.sync_bn and self.device.type == "cuda"
        if synced:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        elif self.dist.is_main and self.cfg.sync_bn:
            log.info("sync_bn: SyncBatchNorm needs CUDA tensors; BatchNorm stays per-rank on %s",
                     self.device)
        if not synced and self.rank_batch < 16 and self.dist.is_main:
            log.warning("BatchNorm statistics come from %d images per rank (batch %d / world_size %d); "
                        "%s", self.rank_batch, self.batch, self.dist.world_size,
                        "set sync_bn=True to share them across ranks" if not self.cfg.sync_bn
                        else "on CUDA sync_bn would share them across ranks")
        return model

    def _load_resume(self, ckpt: dict[str, Any]) -> None:
        model = unwrap(self.model)
        refuse_nonfinite({k: ckpt[k] for k in ("model", "train_model", "optimizer") if k in ckpt},
                         self._resume_path, "cannot resume")
        try:
            model.load_state_dict(ckpt.get("train_model", ckpt["model"]))
        except RuntimeError as exc:
            detail = str(exc).splitlines()[0][:300]
            raise CheckpointError(f"{self._resume_path}: its weights do not fit {self.family.title}-{self.size} "
                                  f"({detail})") from None
        self.optimizer.load_state_dict(ckpt["optimizer"])
        if self.ema is not None and "model" in ckpt:
            self.ema.module.load_state_dict(ckpt["model"])
            self.ema.updates = int(ckpt.get("ema_updates", 0))
        if ckpt.get("scaler"):
            self.amp.scaler.load_state_dict(ckpt["scaler"])
        if "torch_rng" in ckpt and self.dist.is_main:  # other ranks keep their seed + rank
            torch.set_rng_state(ckpt["torch_rng"])
        self.start_epoch = int(ckpt["epoch"]) + 1
        self.best_fitness = float(ckpt.get("best_fitness", -1.0))
        self.best_epoch = int(ckpt.get("best_epoch", 0))
        self.best_metrics = dict(ckpt.get("best_metrics", {}))
        self.nonfinite_skipped = int(ckpt.get("nonfinite_skipped", 0))
        self.history = [r for r in ckpt.get("history", []) if r["epoch"] <= self.start_epoch]
        self._train_s = [float(r["epoch_time_s"]) for r in self.history if r.get("epoch_time_s")]
        self._val_s = [float(r["val_time_s"]) for r in self.history
                       if r.get("validated") and r.get("val_time_s")]
        if self.start_epoch >= self.cfg.epochs:
            log.warning("%s: the run already finished its %d epochs; nothing to train (pass a larger "
                        "epochs= to train longer)", self._resume_path, self.cfg.epochs)
        else:
            step = self.start_epoch * self.steps_per_epoch
            log.info("resuming %s from epoch %d at lr=%.6g (step %d of the %s schedule)", self._resume_path,
                     self.start_epoch + 1, self.schedule.lr(step), step, self.schedule.kind)
        if self._resume_path.name != "last.pt" and self.dist.is_main:
            log.warning("resuming from %s (epoch %d), not last.pt: the later epochs of this run are "
                        "trained again and their results.csv rows replaced", self._resume_path.name,
                        self.start_epoch)

    # -- checkpoints and files ------------------------------------------------------------
    def _state(self, epoch: int) -> dict[str, Any]:
        model = unwrap(self.model)
        weights = (self.ema.module if self.ema is not None else model).state_dict()
        return {
            "libreyolo_version": libreyolo_core.__version__,
            "model_family": self.family.name,
            "size": self.size,
            "task": "detect",
            "nc": self.nc,
            "names": self.names,
            "imgsz": self.cfg.imgsz,
            "model": weights,
            "train_model": model.state_dict(),
            "ema_updates": self.ema.updates if self.ema is not None else 0,
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.amp.scaler.state_dict() if self.amp.scaler.is_enabled() else {},
            "epoch": epoch,
            "best_fitness": self.best_fitness,
            "best_epoch": self.best_epoch,
            "best_metrics": self.best_metrics,
            "nonfinite_skipped": self.nonfinite_skipped,
            "history": self.history,
            "config": self.cfg.model_dump(mode="json"),
            "torch_rng": torch.get_rng_state(),
        }

    def _save(self, epoch: int, is_best: bool, periodic: bool = True) -> None:
        """``last.pt`` (+ ``best.pt`` when best); ``epoch_N.pt`` every ``save_period``
        completed epochs unless ``periodic`` is False (an interrupt's save, whose ``epoch``
        is the last completed one, -1 when none was)."""
        if not self.dist.is_main:
            return
        state = self._state(epoch)
        weights = self.run_dir / "weights"
        last = save_checkpoint(state, weights / "last.pt")
        self.events.emit("artifact", path="weights/last.pt", kind="checkpoint")
        if is_best:  # lean: the EMA weights in float16 and the metadata, no training state
            save_checkpoint(lean_state(state), weights / "best.pt")
            self.events.emit("artifact", path="weights/best.pt", kind="checkpoint")
        if periodic and self.cfg.save_period and (epoch + 1) % self.cfg.save_period == 0:
            shutil.copyfile(last, weights / f"epoch_{epoch + 1}.pt")

    def _write_results(self) -> None:
        if not self.history or not self.dist.is_main:
            return
        fields = list(self.history[-1].keys())
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for row in self.history:
            writer.writerow({k: ("" if isinstance(v, float) and not math.isfinite(v) else v)
                             for k, v in row.items()})
        tmp = self.run_dir / ".results.csv.tmp"
        tmp.write_text(buf.getvalue(), encoding="utf-8")
        os.replace(tmp, self.run_dir / "results.csv")

    # -- the loop -------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        """Run the whole schedule; returns the final metrics (see :meth:`_result`)."""
        previous = self._install_sigterm()
        status, error = "failed", None
        self._t_train_start = time.perf_counter()
        try:
            self._setup()
            self.events.emit("run_start", config=self.cfg.model_dump(mode="json"),
                             run_dir=str(self.run_dir.resolve()), start_epoch=self.start_epoch + 1,
                             device=str(self.device), amp=self.amp.name,
                             world_size=self.dist.world_size, batch=self.batch)
            self._print_header()
            if self.preflight is not None and self.dist.is_main:
                self._record_preflight()
            self._fire("on_train_start")
            status = self._loop()
            return self._result()
        except TrainingInterrupted:
            status = "interrupted"
            raise
        except BaseException as exc:
            timeout = timeout_error(exc) if self.dist.enabled else None
            error = f"{type(timeout or exc).__name__}: {timeout or exc}"
            if timeout is not None:  # name the phase that waited and the setting bounding it
                raise timeout from exc
            raise
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            if getattr(self, "events", None) is not None:
                self.events.emit("run_end", status=status, best_epoch=self.best_epoch,
                                 metrics=self.best_metrics or self.metrics, error=error,
                                 names=getattr(self, "names", None),
                                 nonfinite_skipped=self.nonfinite_skipped, timing=self.timing())
                self.events.close()
            self._fire("on_train_end")
            if self._owns_process_group:
                destroy_distributed()

    def _loop(self) -> str:
        cfg = self.cfg
        close_at = max(cfg.epochs - cfg.no_aug_epochs, 0)
        since_best = 0
        for epoch in range(self.start_epoch, cfg.epochs):
            self.epoch = epoch
            if epoch >= close_at and self.train_set.mosaic_enabled:
                self._close_mosaic(epoch)
            t0 = time.perf_counter()
            set_phase(f"training epoch {epoch + 1}")
            losses, lr = self._train_epoch(epoch)
            set_phase(f"end of epoch {epoch + 1} (rank 0 validates and saves, the other ranks wait)")
            if self._stopping():
                if self.profile_only:  # the truncated epoch is neither validated nor saved
                    return "succeeded"
                self._save(epoch - 1, is_best=False, periodic=False)
                raise TrainingInterrupted(self.stop_reason, self.run_dir / "weights" / "last.pt")
            epoch_time = time.perf_counter() - t0
            if cfg.profile_then_stop:  # a profile-only run writes no checkpoint or results
                continue
            validate_now = cfg.val and self.val_loader is not None and (
                (epoch + 1) % cfg.eval_interval == 0 or epoch + 1 == cfg.epochs
            )
            val_time = 0.0
            if validate_now:
                t_val = time.perf_counter()
                self.metrics = self._validate()
                val_time = time.perf_counter() - t_val
                self._val_s.append(val_time)
            self._train_s.append(epoch_time)
            fit = fitness(self.metrics) if validate_now else float("nan")
            is_best = validate_now and fit > self.best_fitness or (not cfg.val and epoch + 1 == cfg.epochs)
            if is_best:
                self.best_fitness, self.best_epoch = (fit if validate_now else 0.0), epoch + 1
                self.best_metrics = dict(self.metrics)
                since_best = 0
            elif validate_now:
                since_best += 1
            row = {"epoch": epoch + 1, "time": round(time.time(), 3), "epoch_time_s": round(epoch_time, 3),
                   "val_time_s": round(val_time, 3),
                   **{f"train/{k}_loss": round(v, 6) for k, v in losses.items()},
                   **{f"metrics/{k}": round(self.metrics.get(k, float("nan")), 6)
                      for k in ("precision", "recall", "mAP50", "mAP50-95")},
                   "fitness": round(fit, 6), "lr": lr, "validated": int(validate_now),
                   "is_best": int(is_best)}
            self.history.append(row)
            self._save(epoch, is_best)
            self._write_results()
            self.events.emit("artifact", path="results.csv", kind="results")
            self.events.emit("epoch_end", epoch=epoch + 1, epochs=cfg.epochs, losses=losses,
                             metrics={k: v for k, v in self.metrics.items() if k != "per_class_AP"}
                             if validate_now else {}, lr=lr, epoch_time_s=epoch_time,
                             val_time_s=val_time, fitness=fit, is_best=is_best,
                             mosaic=self.train_set.mosaic_enabled,
                             eta_s=round(self._eta(epoch + 1, 0, 1, 0.0).seconds, 1))
            self._print_epoch(epoch, losses, validate_now)
            self._fire("on_epoch_end")
            early = bool(cfg.patience and validate_now and since_best >= cfg.patience)
            if self.dist.enabled:
                early = self._share_epoch_outcome(early)
            if self._stopping():
                raise TrainingInterrupted(self.stop_reason, self.run_dir / "weights" / "last.pt")
            if early:
                log.info("early stop: no better fitness for %d validated epochs (best epoch %d)",
                         since_best, self.best_epoch)
                return "early_stopped"
        return "succeeded"

    def _share_epoch_outcome(self, early: bool) -> bool:
        """Rank 0's end-of-epoch decisions (early stop, a callback's stop request) and
        metrics, on every rank; also the barrier that holds the others while rank 0
        validates and saves. Returns the early-stop decision."""
        mine = (early, self.stop_requested, self.stop_reason, self.metrics, self.best_metrics,
                self.best_epoch, self.best_fitness) if self.dist.is_main else None
        (early, stop, reason, self.metrics, self.best_metrics, self.best_epoch,
         self.best_fitness) = broadcast_object(mine, self.dist)
        if stop:
            self._stop_agreed = True
            if not self.stop_requested:
                self.request_stop(reason)
        return early

    def _close_mosaic(self, epoch: int) -> None:
        self.train_set.close_mosaic()
        changed = self.family.on_mosaic_disable(self.model, self.loss_fn)
        left = self.cfg.epochs - epoch
        log.info("epoch %d: mosaic and mixup off for the last %s", epoch + 1,
                 "epoch" if left == 1 else f"{left} epochs")
        if changed:
            self.events.emit("captured_region_changed", epoch=epoch + 1, reason="mosaic closed")
            if getattr(self, "cuda_graph", None) is not None:
                self.cuda_graph.invalidate(f"{self.family.title} changed the network at mosaic close")

    def _train_epoch(self, epoch: int) -> tuple[dict[str, float], float]:
        cfg, device, amp = self.cfg, self.device, self.amp
        model, loader = self.model, self.train_loader
        model.train()
        keep_frozen_eval(unwrap(model), self.frozen)
        self.train_set.set_epoch(epoch)
        loader.sampler.set_epoch(epoch)
        nb = len(loader)
        sums = torch.zeros(len(self.item_names), dtype=torch.float64)
        counted = 0
        applied_before = self._steps_applied
        first_bad = ""  # "step 3 (box=nan, ...)": the first non-finite step of the epoch
        lr = self.optimizer.param_groups[0]["lr"]
        t_start = time.perf_counter()
        images_seen = 0
        prof = self.profiler  # None unless profiling: then the loop below takes no detour
        # a profile-only run reports the window (step k of warmup + steps), not the epoch
        window_progress = prof is not None and cfg.profile_then_stop
        progress = (self._progress(epoch, prof.window.total, desc="profile window")
                    if window_progress else self._progress(epoch, nb))
        self.optimizer.zero_grad(set_to_none=True)
        world_size = self.dist.world_size
        by_batch = self.family.scale_loss_by_batch
        graphs = self.cuda_graph  # None unless CUDA-graph capture applies (see _setup)
        batches = prof.wrap_loader(loader) if prof is not None else loader
        last_report = t_start
        for i, batch in enumerate(batches):
            step = epoch * self.steps_per_epoch + i // self.accumulate
            window_end = (i + 1) % self.accumulate == 0 or i + 1 == nb
            if i % self.accumulate == 0:
                lr = self.schedule.apply(self.optimizer, step)
                self.bn_guard.snapshot()
            with prof.phase("to_device") if prof is not None else _NULL:
                imgs = self.family.preprocess(batch.images.to(device, non_blocking=True))
                targets = batch.targets.to(device, non_blocking=True)
            # With a CUDA-graph manager the network replays (or runs eager for other shapes);
            # the loss is always eager. Graph capture needs autocast's cast cache off.
            with (prof.phase("forward") if prof is not None else _NULL,
                  amp.autocast(cache_enabled=graphs is None)):
                outputs = model(imgs) if graphs is None else graphs(imgs)
                loss, items = self.loss_fn(outputs, targets, imgs.shape[0])
            del outputs  # no autograd graph outlives its step (a live one breaks a capture)
            # Summed over the images of the micro-batch (Ultralytics' and YOLOv9's trainers do
            # the same): the lr0 = 0.01 SGD recipes assume it; families that say
            # otherwise (YOLOX) step on the loss as is. Micro-batches of an accumulation
            # window add up, so the window acts as one batch of nbs images. Under DDP the
            # loss divides by the global positive count / world_size and DDP averages
            # gradients, so the factor is the GLOBAL micro-batch (or 1): the gradient is
            # then the one a single process with the whole global batch computes.
            with prof.phase("backward") if prof is not None else _NULL:
                factor = imgs.shape[0] * world_size if by_batch else 1
                scaled = amp.scaler.scale(loss * factor)
                if graphs is None:
                    scaled.backward()
                else:
                    graphs.backward(scaled)
            values = self._step_values(loss, items)
            del loss, scaled
            finite = all(math.isfinite(v) for v in values)
            if not finite:
                self.nonfinite_streak += 1
                self.nonfinite_skipped += 1
                terms = describe_nonfinite(self.item_names, values[1:])
                first_bad = first_bad or f"step {i + 1}/{nb} ({terms})"
                log.warning("epoch %d step %d: non-finite loss (%s); optimizer step skipped",
                            epoch + 1, i + 1, terms)
                self.optimizer.zero_grad(set_to_none=True)
                self.bn_guard.restore()  # the forward pass already moved the running stats
                if prof is not None and prof.step_end():
                    self._finish_profile()
                    prof = None
                if self.nonfinite_streak >= MAX_NONFINITE_STREAK:
                    raise NonFiniteLossError(
                        f"{self.nonfinite_streak} non-finite losses in a row at epoch {epoch + 1}: the run diverged; "
                        "try amp=False or a lower lr0"
                    )
                continue
            self.nonfinite_streak = 0
            sums += torch.tensor(values[1:], dtype=torch.float64)
            counted += 1
            if window_end:
                self._optimizer_step(prof)
            images_seen += imgs.shape[0] * world_size
            if prof is not None:
                done, total = prof.position[0] + 1, prof.window.total
                finished = prof.step_end()
                if window_progress:
                    self._window_progress(prof, done, total, t_start, images_seen,
                                          self._mean_losses(sums, counted), progress,
                                          last=finished)
                if finished:
                    self._finish_profile()
                    prof = None
                    if self.stop_requested:
                        break
            now = time.perf_counter()
            report = not window_progress and ((i + 1) % cfg.log_interval == 0 or i + 1 == nb
                                              or now - last_report >= PROGRESS_EVERY_S)
            if not window_progress and (progress is not None or report):
                elapsed = now - t_start
                ips = images_seen / max(elapsed, 1e-9)
                mean = self._mean_losses(sums, counted)
                eta = self._eta(epoch, i + 1, nb, elapsed).seconds
                if progress is not None:
                    progress.set_postfix({**{k: f"{v:.3f}" for k, v in mean.items()}, "img/s": f"{ips:.1f}"})
                    progress.update(1)
                if report:
                    last_report = now
                    self.events.emit("progress", phase="training", epoch=epoch + 1,
                                     epochs=cfg.epochs, step=i + 1, steps=nb, eta_s=round(eta, 1),
                                     img_per_s=round(ips, 2), losses=mean)
                    if progress is None and self.dist.is_main:
                        print(f"epoch {epoch + 1}/{cfg.epochs} step {i + 1}/{nb} "
                              + " ".join(f"{k}={v:.4f}" for k, v in mean.items())
                              + f" {ips:.1f} img/s eta {eta:.0f}s", flush=True)
            if self._stopping():
                break
        if progress is not None:
            progress.close()
        if nb and self._steps_applied == applied_before and not self._stopping():
            why = (f"every loss was non-finite, the first at {first_bad}" if not counted else
                   "every step had non-finite gradients (skipped by the AMP GradScaler or the fp32 check)")
            raise NonFiniteLossError(f"epoch {epoch + 1}: no optimizer step was taken in {nb} steps: {why}. "
                                     "The run diverged; try amp=False or a lower lr0")
        mean = self._mean_losses(sums, counted)
        return mean, lr

    def _step_values(self, loss: torch.Tensor, items: torch.Tensor) -> list[float]:
        """``[total, *items]`` of this step as floats (one host read). Under DDP: the mean
        over ranks, i.e. the loss of the whole global batch, the same number one process
        would log; any rank's stop request (SIGTERM) reaches every rank here, and a
        non-finite value anywhere makes every rank skip the step together."""
        values = torch.cat([loss.detach().float().reshape(1), items.detach().float().reshape(-1)])
        if not self.dist.enabled:
            return values.tolist()
        flag = values.new_tensor([1.0 if self.stop_requested else 0.0])
        packed = all_reduce_sum(torch.cat([values, flag]), self.dist).tolist()
        if packed[-1] > 0:
            self._stop_agreed = True
            if not self.stop_requested:
                self.request_stop("another rank stopped")
        return [v / self.dist.world_size for v in packed[:-1]]

    def _mean_losses(self, sums: torch.Tensor, counted: int) -> dict[str, float]:
        """Mean of each loss part over the finite steps; NaN (an empty CSV cell) if none was."""
        if not counted:
            return dict.fromkeys(self.item_names, float("nan"))
        return {n: float(v) for n, v in zip(self.item_names, (sums / counted).tolist(), strict=True)}

    def _optimizer_step(self, prof=None) -> None:
        scaler = self.amp.scaler
        if not scaler.is_enabled() and not grads_finite(self.model.parameters()):
            # a finite loss with an inf/NaN gradient (fp32; the fp16 scaler checks itself)
            self.nonfinite_skipped += 1
            self.nonfinite_streak += 1
            log.warning("non-finite gradients (the loss was finite); optimizer step skipped")
            self.optimizer.zero_grad(set_to_none=True)
            self.bn_guard.restore()
            return
        with prof.phase("optimizer") if prof is not None else _NULL:
            if self.cfg.clip_max_norm:
                scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_max_norm,
                                               foreach=True)
            scale = scaler.get_scale() if scaler.is_enabled() else 0.0
            scaler.step(self.optimizer)
            scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
        # fp16 AMP: the scaler skipped the step (inf/NaN gradients) iff it lowered the scale;
        # the window then leaves no trace either (BatchNorm restored, EMA not blended)
        if scaler.is_enabled() and scaler.get_scale() < scale:
            self.amp_skipped += 1
            self.bn_guard.restore()
            log.log(logging.WARNING if self.amp_skipped % 100 == 0 else logging.DEBUG,
                    "AMP GradScaler skipped a step for inf/NaN gradients (%d so far); scale now %g",
                    self.amp_skipped, scaler.get_scale())
            return
        self._steps_applied += 1
        if self.ema is not None:
            with prof.phase("ema") if prof is not None else _NULL:
                self.ema.update(self.model)

    def _eta(self, epoch: int, done: int, nb: int, elapsed: float):
        """Time left (:func:`~libreyolo_core.engine.eta.eta`) at step ``done`` of ``nb`` of
        epoch ``epoch`` (0-based); ``done == 0``: epoch ``epoch`` has not started."""
        cfg = self.cfg
        validates = bool(cfg.val and self.val_loader is not None)
        after = cfg.epochs - epoch - (0 if done == 0 else 1)
        estimate = getattr(self.preflight, "val_s", None)
        return estimate_eta(step=done, steps=nb, elapsed_s=elapsed, epochs_after=after,
                            validations=validations_left(epoch, cfg.epochs, cfg.eval_interval,
                                                         validates),
                            train_s=self._train_s, val_s=self._val_s, val_estimate_s=estimate)

    def timing(self) -> dict[str, Any]:
        """Where the run's time went, seconds: ``epochs`` completed, ``epoch_time_s`` (mean
        training time of an epoch), ``train_s`` and ``val_s`` (sums over the completed
        epochs, a resumed run's earlier ones included) and ``wall_s`` (this process, set-up
        included)."""
        n = len(self._train_s)
        return {"epochs": n,
                "epoch_time_s": round(sum(self._train_s) / n, 3) if n else None,
                "train_s": round(sum(self._train_s), 3), "val_s": round(sum(self._val_s), 3),
                "wall_s": round(time.perf_counter() - self._t_train_start, 3)
                if self._t_train_start else None}

    def _record_preflight(self) -> None:
        """Move the preflight trial into ``<run>/preflight/``, write ``preflight.json`` and
        emit the ``preflight`` event (rank 0)."""
        pf = self.preflight
        src = Path(pf.trial_dir) if pf.trial_dir else None
        dst = self.run_dir / "preflight"
        if src is not None and src.is_dir() and src.resolve() != dst.resolve():
            shutil.rmtree(dst, ignore_errors=True)
            shutil.move(str(src), str(dst))
            if src.parent.name.startswith("libreyolo-preflight-"):  # its temporary folder
                with contextlib.suppress(OSError):
                    src.parent.rmdir()
            pf = pf.moved_to(dst)
            self.preflight = pf
        (self.run_dir / "preflight.json").write_text(pf.to_json(), encoding="utf-8")
        self.events.emit("artifact", path="preflight.json", kind="preflight")
        for name, kind in (("profile.json", "profile"), ("timeline.html", "timeline")):
            if (dst / name).is_file():
                self.events.emit("artifact", path=f"preflight/{name}", kind=kind)
        self.events.emit("preflight", **pf.to_dict())
        if self.dist.is_main:
            print(pf.summary_line(), flush=True)

    def _finish_profile(self) -> None:
        """The profile window is over: write its artifacts, drop every hook, go on (or stop)."""
        prof, self.profiler = self.profiler, None
        summary = prof.finish(self.run_dir)
        for path, kind in summary.get("artifacts", {}).items():
            self.events.emit("artifact", path=path, kind=kind)
        self.events.emit("profile", **{k: v for k, v in summary.items() if k != "artifacts"})
        self.profile_summary = summary
        if self.cfg.profile_then_stop:
            log.info("profile-only run: stopping after the profile window")
            self.profile_only = True
            self.request_stop("profile_then_stop")

    def _validate(self) -> dict[str, float]:
        net = self.ema.module if self.ema is not None else unwrap(self.model)
        return validate(net, self.family, self.val_loader, self.device, self.nc, conf=self.cfg.conf,
                        iou=self.cfg.iou, max_det=self.cfg.max_det, amp=self.amp,
                        on_batch=self._validation_progress())

    def _validation_progress(self):
        """``on_batch(k, n)`` for :func:`validate`: a ``progress`` event with ``phase:
        "validating"``, ``val_batch`` and ``val_batches`` (and a log line) at the first and
        last batch and at most every :data:`PROGRESS_EVERY_S` seconds between."""
        last = [0.0]
        epoch, epochs = self.epoch + 1, self.cfg.epochs

        def on_batch(k: int, n: int) -> None:
            now = time.perf_counter()
            if k not in (1, n) and now - last[0] < PROGRESS_EVERY_S:
                return
            last[0] = now
            self.events.emit("progress", phase="validating", epoch=epoch, epochs=epochs,
                             val_batch=k, val_batches=n)
            if self.dist.is_main:
                print(f"epoch {epoch}/{epochs} validating {k}/{n}", flush=True)

        return on_batch

    # -- output ---------------------------------------------------------------------------
    def _progress(self, epoch: int, total: int, desc: str | None = None):
        if not sys.stderr.isatty() or not self.dist.is_main:
            return None
        from tqdm import tqdm

        return tqdm(total=total, desc=desc or f"epoch {epoch + 1}/{self.cfg.epochs}",
                    unit="batch", dynamic_ncols=True, leave=True)

    def _window_progress(self, prof, done: int, total: int, t_start: float, images: int,
                         losses: dict[str, float], bar, last: bool) -> None:
        """Progress of a profile-only run: the window, step ``done`` of ``warmup + steps``.

        A ``progress`` event ``{phase: "profiling", step, steps, warmup, measured, eta_s,
        img_per_s, losses}`` (no epoch: the run never leaves the first one) at the first
        and last step, the end of the warm-up, every ``log_interval`` steps and at least
        every :data:`PROGRESS_EVERY_S`; the same as a printed line when stderr is no
        terminal, a tqdm bar when it is."""
        now = time.perf_counter()
        elapsed = now - t_start
        if bar is not None:
            bar.set_postfix({**{k: f"{v:.3f}" for k, v in losses.items()},
                             "img/s": f"{images / max(elapsed, 1e-9):.1f}"})
            bar.update(1)
            if last:
                bar.close()
        warmup = prof.window.warmup
        due = (done in (1, warmup) or last or done % self.cfg.log_interval == 0
               or now - self._last_window_report >= PROGRESS_EVERY_S)
        if not due:
            return
        self._last_window_report = now
        eta = (total - done) * elapsed / done
        ips = images / max(elapsed, 1e-9)
        stage = "warm-up" if done <= warmup else "measured"
        self.events.emit("progress", phase="profiling", step=done, steps=total, warmup=warmup,
                         measured=total - warmup, eta_s=round(eta, 1), img_per_s=round(ips, 2),
                         losses=losses)
        if bar is None and self.dist.is_main:
            print(f"profile window step {done}/{total} ({stage}; {warmup} warm-up + "
                  f"{total - warmup} measured) " + " ".join(f"{k}={v:.4f}" for k, v in losses.items())
                  + f" {ips:.1f} img/s eta {eta:.0f}s", flush=True)

    def _print_header(self) -> None:
        if not self.dist.is_main:
            return
        ddp = f" x {self.dist.world_size} ranks ({self.dist.backend})" if self.dist.enabled else ""
        print(f"{self.family.title}-{self.size} nc={self.nc} on {self.device}{ddp} ({self.amp.name}), "
              f"imgsz={self.cfg.imgsz} batch={self.batch} accumulate={self.accumulate}, "
              f"{len(self.train_set)} train images -> {self.run_dir}", flush=True)

    def _print_epoch(self, epoch: int, losses: dict[str, float], validated: bool) -> None:
        if not self.dist.is_main:
            return
        parts = [f"epoch {epoch + 1}/{self.cfg.epochs}"]
        parts += [f"{k}={v:.4f}" for k, v in losses.items()]
        if validated:
            m = self.metrics
            parts += [f"P={m.get('precision', 0):.3f}", f"R={m.get('recall', 0):.3f}",
                      f"mAP50={m.get('mAP50', 0):.4f}", f"mAP50-95={m.get('mAP50-95', 0):.4f}"]
        print("  ".join(parts), flush=True)

    def _result(self) -> dict[str, Any]:
        return {
            **(self.best_metrics or self.metrics),
            "fitness": self.best_fitness,
            "best_epoch": self.best_epoch,
            "epochs_completed": self.epoch + 1,
            "save_dir": str(self.run_dir),
            "best_checkpoint": str(self.run_dir / "weights" / "best.pt"),
            "last_checkpoint": str(self.run_dir / "weights" / "last.pt"),
            "names": self.names,  # class id -> name, the keys of per_class_AP
            "nonfinite_skipped": self.nonfinite_skipped,
            "amp_skipped": self.amp_skipped,
            "timing": self.timing(),
            **({"profile": self.profile_summary} if self.profile_summary else {}),
            **({"preflight": self.preflight.to_dict()} if self.preflight is not None else {}),
        }
