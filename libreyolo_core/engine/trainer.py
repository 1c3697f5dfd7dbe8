"""The training loop: data -> forward + loss (autocast) -> backward (scaled) -> step -> EMA.

One ``Trainer`` runs one training run of one process: the whole run on one device, or
one rank of a DDP job (torchrun or the spawn launcher; see docs/architecture.md,
"Multi-device"). It is small on purpose: :func:`~libreyolo_core.engine.run.prepare_run`
sets the run up (the parts of :func:`~libreyolo_core.engine.build.build_parts`, the resumed
:class:`~libreyolo_core.engine.state.TrainState`, the run directory and its events) and
returns a finished :class:`~libreyolo_core.engine.run.Run`; the hooks of
:mod:`~libreyolo_core.engine.hooks` do everything around the step: profiling (through the
loader hook point and the phase timer of :mod:`~libreyolo_core.engine.timer`; the trainer
never names the profiler), validation and early stop, checkpoints, progress and events
(rank 0), the non-finite guard and the mosaic/L1 switch. Families plug in through the ``Family`` contract
(``libreyolo_core/models/family.py``: ``build_model``, ``build_loss``, ``preprocess``,
``postprocess``, hooks such as ``on_mosaic_disable`` with no-op defaults).
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from libreyolo_core.config import TrainConfig
from libreyolo_core.data.config import DataConfig
from libreyolo_core.distributed.context import (
    DistContext,
    all_reduce_sum,
    broadcast_object,
    current_phase,
    destroy_distributed,
    set_phase,
    timeout_error,
)
from libreyolo_core.engine.build import TrainParts
from libreyolo_core.engine.ema import unwrap
from libreyolo_core.engine.events import EventLog
from libreyolo_core.engine.freeze import keep_frozen_eval
from libreyolo_core.engine.hooks import (
    CALLBACK_EVENTS,
    CallbackHook,
    EpochMeter,
    EpochOutcome,
    HookBase,
    NonFiniteGuard,
)
from libreyolo_core.engine.hooks.policy import default_hooks
from libreyolo_core.engine.multi_scale import multi_scale_size, rescale_batch
from libreyolo_core.engine.nonfinite import BatchNormGuard
from libreyolo_core.engine.resume import Resume
from libreyolo_core.engine.run import Run, prepare_run
from libreyolo_core.engine.signals import install_sigterm
from libreyolo_core.engine.state import TrainState
from libreyolo_core.engine.timer import NULL_TIMER, StepTimer
from libreyolo_core.models.family import Family
from libreyolo_core.records.train import TrainResult

__all__ = ["Trainer", "TrainingInterrupted"]

log = logging.getLogger(__name__)


class TrainingInterrupted(RuntimeError):
    """SIGTERM (or a callback's stop request) ended the run after saving ``last.pt``.

    Attributes:
        last_checkpoint: the ``last.pt`` written (None when not known, e.g. on a rank
            other than 0).
    """

    def __init__(self, reason: str, last_checkpoint: str | os.PathLike[str] | None = None):
        super().__init__(reason)
        self.last_checkpoint = None if last_checkpoint is None else str(last_checkpoint)


class Trainer:
    """Train one model on one device, or be one rank of a DDP job when the torchrun
    variables are set (``WORLD_SIZE > 1``).

    Args:
        cfg: the resolved :class:`TrainConfig` (``data`` required; ``batch`` is global).
        model: an already built network to train (its ``nc`` must match the dataset);
            ``None`` builds one from the registry.
        callbacks: ``{event: [fn(trainer), ...]}`` for ``on_train_start``,
            ``on_epoch_end``, ``on_train_end`` (called on rank 0 only). A callback reads
            ``trainer.parts`` (model, loss_fn, optimizer, ema, ...; the prepared run's, so
            not in an ``on_train_end`` after a failed set-up), ``trainer.state``
            (epoch, history, ...) and may call :meth:`request_stop`.
        preflight: the run's preflight estimate
            (:class:`~libreyolo_core.profiler.preflight.PreflightEstimate`), measured before
            this trainer by :meth:`LibreYOLO.train`; it is written into the run directory
            (``preflight.json``, the trial's files under ``preflight/``), announced as a
            ``preflight`` event, and its validation time seeds the ETA until one ran.
        resume: the checkpoint ``cfg.resume`` names, when the caller loaded it (read once);
            None opens it in the set-up.
        data: the dataset yaml as :func:`~libreyolo_core.engine.run.load_run_data` gave it
            to the caller (which so checked a resumed run's classes); None loads it in the
            set-up.

    Raises (from :meth:`train`):
        TrainingInterrupted: after SIGTERM or a stop request, once ``last.pt`` is written
            (under DDP every rank raises it at the same step); a SIGTERM during set-up (the
            dataset scan, the model build, ...) raises it at once, with nothing saved.
        NonFiniteLossError: ten non-finite losses in a row, or an epoch without one
            optimizer step taken (the message names the first bad step and loss terms).
        NonFiniteCheckpointError: a checkpoint to write (or resume) holds NaN/inf.
        ValueError: a global ``batch`` not divisible by the world size.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        model: torch.nn.Module | None = None,
        callbacks: dict[str, list[Callable[[Trainer], None]]] | None = None,
        preflight: Any = None,
        resume: Resume | None = None,
        data: DataConfig | None = None,
    ):
        if not cfg.data:
            raise ValueError("data is required: a dataset yaml path (data=path/to/data.yaml)")
        _check_callbacks(callbacks or {})
        self.cfg = cfg  # the run's config once prepared (a resumed run's: the checkpoint's)
        self.preflight = preflight
        self.callbacks = callbacks or {}
        self._model_in = model  # the network to start from (build_parts may build another)
        self._resume_in = resume  # the resume checkpoint, when the caller loaded it
        self._data_in = data  # the dataset yaml, when the caller loaded (and checked) it
        self._run: Run | None = None  # prepared in _setup
        self.state = TrainState()  # the run's, once prepared
        self.dist = DistContext()  # replaced in _setup under torchrun / spawn
        self.meter = EpochMeter(0, (), lr=0.0)  # the epoch being trained
        self.outcome = EpochOutcome(-1, {}, 0.0, 0.0)  # the epoch just completed
        self.timer: StepTimer = NULL_TIMER  # times the step's phases (a profile window's hook swaps it)
        self.extra_result: dict[str, Any] = {}  # what hooks add to the result (``profile``)
        self.quiet_progress = False  # a hook reports this epoch's progress itself
        self.stop_is_success = False  # a hook's stop ends the run as succeeded (profile-only)
        self.stop_requested = False
        self.stop_reason = ""
        self.status = "failed"  # how the run ended (read by after_train)
        self.error: str | None = None
        self._stop_agreed = False  # under DDP: every rank knows a stop was requested
        self._owns_process_group = False
        self._t_train_start = 0.0
        self._in_setup = False  # SIGTERM during set-up stops at once (nothing to save yet)
        # until the run is prepared, a failure still reaches on_train_end
        self.hooks: list[HookBase] = [CallbackHook(self.callbacks)]
        self.hooks[0].trainer = self
        self.guard = NonFiniteGuard()
        self.watchdog: Any = None  # the hang watchdog while it runs (WatchdogHook)

    # -- the prepared run -------------------------------------------------------------
    @property
    def run(self) -> Run:
        """The prepared :class:`~libreyolo_core.engine.run.Run`.

        Raises:
            RuntimeError: asked before the set-up prepared it.
        """
        if self._run is None:
            raise RuntimeError("the run is not prepared yet (Trainer.train prepares it)")
        return self._run

    @property
    def parts(self) -> TrainParts:
        """The run's parts (model, loss_fn, optimizer, ema, loaders, ...)."""
        return self.run.parts

    @property
    def resume(self) -> Resume | None:
        """The checkpoint the run continues from, None for a new run."""
        return self.run.resume

    @property
    def run_dir(self) -> Path:
        """The run directory."""
        return self.run.run_dir

    @property
    def events(self) -> EventLog:
        """The run's ``events.jsonl`` (a disabled log on ranks other than 0)."""
        return self.run.events

    @property
    def device(self) -> torch.device:
        """The device this process trains on."""
        return self.run.device

    @property
    def family(self) -> Family:
        """The model's family."""
        return self.run.family

    @property
    def size(self) -> str:
        """The model's size code (``"t"``)."""
        return self.run.size

    @property
    def names(self) -> dict[int, str]:
        """The dataset's classes, id -> name."""
        return self.run.names

    @property
    def nc(self) -> int:
        """The number of classes."""
        return self.run.nc

    @property
    def bn_guard(self) -> BatchNormGuard:
        """Restores BatchNorm's statistics after a skipped step."""
        return self.run.bn_guard

    # -- stop requests ----------------------------------------------------------------
    def request_stop(self, reason: str = "stop requested") -> None:
        """Finish the current step, save ``last.pt`` and end the run as ``interrupted``."""
        self.stop_requested, self.stop_reason = True, reason

    def stopping(self) -> bool:
        """Whether to stop now. Under DDP only a request every rank has seen counts (it
        travels with the per-step reduction), so all ranks leave the loop at the same step."""
        return self._stop_agreed if self.dist.enabled else self.stop_requested

    def _on_sigterm(self) -> None:
        """SIGTERM requests a stop (the handler :meth:`train` installs, chained to the one it
        replaces: a caller running this trainer inside a longer job, a tune's trials or a
        preflight, learns of the stop even when it lands after the profile window)."""
        if self._in_setup:  # nothing trained, nothing to save: stop now, not after a scan
            log.warning("SIGTERM received during set-up (%s): stopping", current_phase())
            self.request_stop("SIGTERM")
            raise TrainingInterrupted("SIGTERM")
        log.warning("SIGTERM received: finishing the current step, then saving last.pt")
        self.request_stop("SIGTERM")

    # -- set-up -----------------------------------------------------------------------
    def _setup(self) -> None:
        """Prepare the run (:func:`~libreyolo_core.engine.run.prepare_run`) and build this
        rank's hooks (:func:`~libreyolo_core.engine.hooks.policy.default_hooks`)."""
        run = prepare_run(self.cfg, model=self._model_in, resume=self._resume_in, data=self._data_in,
                          on_dist=self._joined)
        self._run = run
        self.cfg, self.state = run.cfg, run.state
        self.hooks = default_hooks(self, self.callbacks)
        self.guard = next(h for h in self.hooks if isinstance(h, NonFiniteGuard))

    def _joined(self, ctx: DistContext, owned: bool) -> None:
        """The set-up knows the process's rank (``owned``: it started the process group)."""
        self.dist, self._owns_process_group = ctx, owned

    @property
    def title(self) -> str:
        """The model's name, ``"YOLOv9-t"``."""
        return self.run.title

    def meta(self) -> dict[str, Any]:
        """The checkpoint's model metadata: ``model_family``, ``size``, ``nc``, ``names``, ``imgsz``."""
        return self.run.meta()

    # -- the loop ---------------------------------------------------------------------
    def train(self) -> TrainResult:
        """Run the whole schedule; returns the run's :class:`~libreyolo_core.records.train.TrainResult`
        (the best epoch's metrics, the checkpoints, timing, ...)."""
        restore = install_sigterm(self._on_sigterm)
        self._t_train_start = time.perf_counter()
        try:
            self._in_setup = True
            try:
                self._setup()
            finally:
                self._in_setup = False
            set_phase("start of training (before_train hooks)")
            self._call("before_train")
            self.status = self._loop()
            return self._result()
        except TrainingInterrupted:
            self.status = "interrupted"
            raise
        except BaseException as exc:
            timeout = timeout_error(exc) if self.dist.enabled else None
            self.error = f"{type(timeout or exc).__name__}: {timeout or exc}"
            if timeout is not None:  # name the phase that waited and the setting bounding it
                raise timeout from exc
            raise
        finally:
            restore()
            self._call("after_train")
            if self._owns_process_group:
                destroy_distributed()

    def _call(self, point: str) -> None:
        """Call hook point ``point`` on every hook, in order."""
        for hook in self.hooks:
            getattr(hook, point)()

    def _loop(self) -> str:
        cfg, st = self.cfg, self.state
        for epoch in range(st.start_epoch, cfg.epochs):
            st.epoch = epoch
            self._call("before_epoch")
            t0 = time.perf_counter()
            set_phase(f"training epoch {epoch + 1}, first batch (the data loader starts)")
            losses, lr = self._train_epoch(epoch)
            set_phase(f"end of epoch {epoch + 1} (rank 0 validates and saves, the other ranks wait)")
            if self.stopping():
                if self.stop_is_success:  # the truncated epoch is neither validated nor saved
                    return "succeeded"
                self._call("on_interrupt")
                raise TrainingInterrupted(self.stop_reason, self.run_dir / "weights" / "last.pt")
            epoch_time = time.perf_counter() - t0
            if cfg.profile_then_stop:  # a profile-only run writes no checkpoint or results
                continue
            st.train_s.append(epoch_time)
            self.outcome = EpochOutcome(epoch, losses, lr, epoch_time)
            self._call("after_epoch")
            early = self.outcome.early_stop
            if self.dist.enabled:
                early = self._share_epoch_outcome(early)
            if self.stopping():
                raise TrainingInterrupted(self.stop_reason, self.run_dir / "weights" / "last.pt")
            if early:
                log.info("early stop: no better fitness for %d validated epochs (best epoch %d)",
                         self.outcome.since_best, st.best_epoch)
                return "early_stopped"
        return "succeeded"

    def _share_epoch_outcome(self, early: bool) -> bool:
        """Rank 0's end-of-epoch decisions (early stop, a callback's stop request) and
        metrics, on every rank; also the barrier that holds the others while rank 0
        validates and saves. Returns the early-stop decision."""
        st = self.state
        mine = (early, self.stop_requested, self.stop_reason, st.metrics, st.best_metrics,
                st.best_epoch, st.best_fitness) if self.dist.is_main else None
        (early, stop, reason, st.metrics, st.best_metrics, st.best_epoch,
         st.best_fitness) = broadcast_object(mine, self.dist)
        if stop:
            self._stop_agreed = True
            if not self.stop_requested:
                self.request_stop(reason)
        return early

    def _train_epoch(self, epoch: int) -> tuple[dict[str, float], float]:
        """Every micro-batch of ``epoch``; returns the mean loss terms and the last lr."""
        parts = self.parts
        parts.model.train()
        keep_frozen_eval(unwrap(parts.model), parts.frozen)
        parts.train_set.set_epoch(epoch)
        parts.train_loader.sampler.set_epoch(epoch)
        self.meter = EpochMeter(len(parts.train_loader), parts.item_names, lr=parts.optimizer.param_groups[0]["lr"])
        parts.optimizer.zero_grad(set_to_none=True)
        batches: Iterable[Any] = parts.train_loader
        for hook in self.hooks:  # the loader hook point
            batches = hook.wrap_loader(batches)
        for i, batch in enumerate(batches):
            self.meter.step = i
            if i == 0:
                set_phase(f"training epoch {epoch + 1}")  # its first batch has arrived
            finite = self._step(i, batch)
            if any(hook.after_step(finite) for hook in self.hooks) or (finite and self.stopping()):
                break
        self._call("after_train_epoch")
        return self.meter.mean(), self.meter.lr

    # -- the step ---------------------------------------------------------------------
    def _step(self, i: int, batch: Any) -> bool:
        """Micro-batch ``i``: forward, backward, the optimizer step at the end of its
        accumulation window. Returns whether its loss was finite (otherwise it is skipped)."""
        parts, m = self.parts, self.meter
        if i % parts.accumulate == 0:  # a window starts: its lr, and BatchNorm as it is now
            m.lr = parts.schedule.apply(parts.optimizer, self.state.epoch * parts.steps_per_epoch + i // parts.accumulate)
            self.bn_guard.snapshot()
        with self.phase("to_device"):
            imgs = self.family.preprocess(batch.images.to(self.device, non_blocking=True))
            targets = batch.targets.to(self.device, non_blocking=True)
            if self.cfg.multi_scale:
                size = multi_scale_size(self.cfg.imgsz, self.family.stride, self.cfg.seed, self.state.epoch, i)
                imgs, targets = rescale_batch(imgs, targets, size)
            imgs = imgs.contiguous(memory_format=parts.memory_format)  # the network's layout
        loss, items = self._forward(imgs, targets)
        if not self._backward(loss, imgs.shape[0]):  # a compiled backward failed: again, eager
            del loss, items
            loss, items = self._forward(imgs, targets)
            self._backward(loss, imgs.shape[0])
        values = self._step_values(loss, items)
        del loss
        if not self.guard.loss_finite(values):
            return False
        m.add(values[1:], imgs.shape[0] * self.dist.world_size)
        if (i + 1) % parts.accumulate == 0 or i + 1 == m.steps:
            self._optimizer_step()
        return True

    def phase(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """The timer's context for phase ``name`` (a shared null context outside a profile window)."""
        return self.timer.phase(name)

    def _forward(self, imgs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Network and loss under autocast. With a CUDA-graph manager the network replays
        (or runs eager for other shapes); with ``compile`` it runs compiled (or eager after
        a failure); the loss is always eager. Graph capture needs autocast's cast cache
        off. No output outlives the call (a live autograd graph breaks a capture)."""
        parts, graphs = self.parts, self.parts.cuda_graph
        net = graphs or parts.compiled or parts.model
        with self.phase("forward"), parts.amp.autocast(cache_enabled=graphs is None):
            outputs = net(imgs)
            return parts.loss_fn(outputs, targets, imgs.shape[0])

    def _backward(self, loss: torch.Tensor, images: int) -> bool:
        """Back-propagate ``loss`` scaled by the fp16 scaler and by the micro-batch.

        Summed over the images of the micro-batch (Ultralytics' and YOLOv9's trainers do the
        same): the lr0 = 0.01 SGD recipes assume it; families that say otherwise (YOLOX)
        step on the loss as is. Micro-batches of an accumulation window add up, so the
        window acts as one batch of nbs images. Under DDP the loss divides by the global
        positive count / world_size and DDP averages gradients, so the factor is the
        GLOBAL micro-batch (or 1): the gradient is then the one a single process with the
        whole global batch computes.

        Returns False when a compiled backward failed and left the gradients as they were:
        the micro-batch must run again (eager now); True otherwise.
        """
        parts = self.parts
        with self.phase("backward"):
            factor = images * self.dist.world_size if self.family.scale_loss_by_batch else 1
            scaled = parts.amp.scaler.scale(loss * factor)
            if parts.cuda_graph is not None:
                parts.cuda_graph.backward(scaled)
            elif parts.compiled is not None:
                return bool(parts.compiled.backward(scaled))
            else:
                scaled.backward()
        return True

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

    def _optimizer_step(self) -> None:
        """Clip, step, update the scaler and the EMA; a step with non-finite gradients is
        dropped by the guard instead. With a clip, the fp32 check reads the clip's total
        norm: one pass over the gradients, not two (a non-finite norm has scaled them by
        NaN, and the guard drops them)."""
        parts, scaler = self.parts, self.parts.amp.scaler
        with self.phase("optimizer"):
            norm = None
            if self.cfg.clip_max_norm:
                scaler.unscale_(parts.optimizer)
                norm = torch.nn.utils.clip_grad_norm_(parts.model.parameters(), self.cfg.clip_max_norm,
                                                      foreach=True)
            if not scaler.is_enabled() and not self.guard.grads_finite(norm):
                return
            scale = scaler.get_scale() if scaler.is_enabled() else 0.0
            scaler.step(parts.optimizer)
            scaler.update()
            parts.optimizer.zero_grad(set_to_none=True)
        if self.guard.scaler_skipped(scale):
            return
        self.state.steps_applied += 1
        if parts.ema is not None:
            with self.phase("ema"):
                parts.ema.update(parts.model)

    # -- results ----------------------------------------------------------------------
    def timing(self) -> dict[str, Any]:
        """Where the run's time went (:meth:`TrainState.timing`); ``wall_s`` is this
        process's, set-up included."""
        wall = time.perf_counter() - self._t_train_start if self._t_train_start else None
        return self.state.timing(wall)

    def _result(self) -> TrainResult:
        st, weights = self.state, self.run_dir / "weights"
        return TrainResult.of({
            **(st.best_metrics or st.metrics),
            "fitness": st.best_fitness,
            "best_epoch": st.best_epoch,
            # a resumed run with nothing left to train ran no epoch: its checkpoint's count
            "epochs_completed": st.start_epoch if st.start_epoch >= self.cfg.epochs else st.epoch + 1,
            "save_dir": str(self.run_dir),
            "best_checkpoint": str(weights / "best.pt"),
            "last_checkpoint": str(weights / "last.pt"),
            "names": self.names,  # class id -> name, the keys of per_class_AP
            "nonfinite_skipped": st.nonfinite_skipped,
            "amp_skipped": st.amp_skipped,
            "timing": self.timing(),
            **self.extra_result,
            **({"preflight": self.preflight.to_dict()} if self.preflight is not None else {}),
        })


def _check_callbacks(callbacks: dict[str, Any]) -> None:
    """Refuse an unknown event (naming the closest) or a value that is not a list of callables.

    Raises:
        ValueError: naming the event and the events there are.
    """
    for event, fns in callbacks.items():
        if event not in CALLBACK_EVENTS:
            close = difflib.get_close_matches(str(event), CALLBACK_EVENTS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"callbacks: unknown event {event!r}.{hint} Events: {', '.join(CALLBACK_EVENTS)}")
        if not isinstance(fns, list | tuple) or not all(callable(fn) for fn in fns):
            raise ValueError(f"callbacks[{event!r}] must be a list of callables fn(trainer), got {fns!r}")
