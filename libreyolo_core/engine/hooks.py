"""The trainer's hooks: everything around the step that is not the step.

The loop (:class:`~libreyolo_core.engine.trainer.Trainer`) calls each hook point on every
hook of its list, in list order (:func:`default_hooks` builds the list once, when the
process's rank is known, so "rank 0 only" is decided there and nowhere else)::

    before_train
    for each epoch:
        before_epoch
        for each micro-batch:  step, then after_step(finite)   (True: leave the epoch)
        after_train_epoch                                       (every epoch, profile-only too)
        on_interrupt                                            (a stop was agreed: save)
        after_epoch                                             (validate, save, report)
    after_train                                                 (always, in ``finally``)

A hook reads and changes the run through ``self.trainer`` (set when the list is built).
The shape follows detectron2's ``HookBase`` (engine/hooks.py) with YOLOX's epoch points;
``after_train_epoch`` is ours: the step-level hooks close their epoch before validation,
which a profile-only run never reaches.

This module holds the hooks every rank runs (:class:`MosaicSwitchHook`,
:class:`NonFiniteGuard`, :class:`ValidationHook`) and rank 0's :class:`CheckpointHook`,
:class:`ReportHook` and :class:`CallbackHook`; the progress / events hook is in :mod:`~libreyolo_core.engine.progress`,
the profiler's in :mod:`~libreyolo_core.engine.profile_hook`.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from libreyolo_core.engine import fence
from libreyolo_core.engine.checkpoint import lean_state, save_checkpoint
from libreyolo_core.engine.ema import unwrap
from libreyolo_core.engine.nonfinite import NonFiniteLossError, describe_nonfinite, grads_finite
from libreyolo_core.engine.state import fitness
from libreyolo_core.eval.validate import ValPredictions, validate
from libreyolo_core.records.events import ArtifactEvent, CapturedRegionChangedEvent

if TYPE_CHECKING:
    from libreyolo_core.engine.trainer import Trainer

__all__ = ["HookBase", "EpochMeter", "EpochOutcome", "MosaicSwitchHook",
           "NonFiniteGuard", "ValidationHook", "ReportHook", "CheckpointHook", "CallbackHook",
           "WatchdogHook", "default_hooks",
           "CALLBACK_EVENTS", "MAX_NONFINITE_STREAK"]

log = logging.getLogger(__name__)

#: The events ``callbacks`` may name (called on rank 0 with the trainer).
CALLBACK_EVENTS = ("on_train_start", "on_epoch_end", "on_train_end")
#: Consecutive non-finite losses that stop a run.
MAX_NONFINITE_STREAK = 10


class HookBase:
    """A hook: override the points it needs (the module docstring gives the order).

    Attributes:
        trainer: the trainer whose loop calls it (set by :func:`default_hooks`).
    """

    trainer: Trainer

    def before_train(self) -> None:
        """Set-up is done (parts built, run directory chosen); nothing trained yet."""

    def before_epoch(self) -> None:
        """Epoch ``trainer.state.epoch`` (0-based) is about to start."""

    def after_step(self, finite: bool) -> bool | None:
        """Micro-batch ``trainer.meter.step`` is done; ``finite``: its loss was (the step
        counted; otherwise it was skipped). Return True to leave the epoch now (the later
        hooks are not called for this step)."""
        return None

    def after_train_epoch(self) -> None:
        """The epoch's steps are done (also in a profile-only run and when stopping)."""

    def on_interrupt(self) -> None:
        """A stop was agreed at the end of the epoch: ``last.pt`` of the epoch before is due."""

    def after_epoch(self) -> None:
        """The epoch completed: ``trainer.outcome`` holds its losses and times."""

    def after_train(self) -> None:
        """The run ended (``trainer.status``, ``trainer.error``); called on failures too."""


@dataclass
class EpochMeter:
    """The running figures of the epoch being trained, for the step's hooks.

    Attributes:
        steps: micro-batches in the epoch; ``step`` the current one, 0-based.
        sums: per-term loss sums over the counted (finite) steps, float64; ``counted`` their
            number; ``images`` the images trained on (all ranks).
        lr: the learning rate of the current accumulation window.
        t_start: ``time.perf_counter()`` at the epoch's first step; ``last_report`` at the
            last progress report.
    """

    steps: int
    item_names: tuple[str, ...]
    lr: float
    step: int = 0
    counted: int = 0
    images: int = 0
    t_start: float = field(default_factory=time.perf_counter)
    last_report: float = 0.0
    sums: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.sums = torch.zeros(len(self.item_names), dtype=torch.float64)
        self.last_report = self.t_start

    def add(self, items: list[float], images: int) -> None:
        """Count a finite step: its loss terms and its images."""
        self.sums += torch.tensor(items, dtype=torch.float64)
        self.counted += 1
        self.images += images

    def mean(self) -> dict[str, float]:
        """Mean of each loss part over the finite steps; NaN (an empty CSV cell) if none was."""
        if not self.counted:
            return dict.fromkeys(self.item_names, float("nan"))
        return {n: float(v) for n, v in zip(self.item_names, (self.sums / self.counted).tolist(),
                                            strict=True)}


@dataclass
class EpochOutcome:
    """One completed epoch, as the ``after_epoch`` hooks fill it in (0-based ``epoch``)."""

    epoch: int
    losses: dict[str, float]
    lr: float
    epoch_time_s: float
    validated: bool = False
    val_time_s: float = 0.0
    fitness: float = float("nan")
    is_best: bool = False
    early_stop: bool = False
    since_best: int = 0


class MosaicSwitchHook(HookBase):
    """At epoch ``epochs - no_aug_epochs``: mosaic and mixup off, and the family's
    ``on_mosaic_disable(model, loss_fn)`` (YOLOX switches its L1 loss on); a network the
    hook changed invalidates a captured CUDA graph (``captured_region_changed`` event)."""

    def before_epoch(self) -> None:
        t = self.trainer
        close_at = max(t.cfg.epochs - t.cfg.no_aug_epochs, 0)
        if t.state.epoch >= close_at and t.parts.train_set.mosaic_enabled:
            self.close(t.state.epoch)

    def close(self, epoch: int) -> None:
        """Switch augmentation off from ``epoch`` (0-based) on."""
        t, parts = self.trainer, self.trainer.parts
        parts.train_set.close_mosaic()
        changed = t.family.on_mosaic_disable(parts.model, parts.loss_fn)
        left = t.cfg.epochs - epoch
        log.info("epoch %d: mosaic and mixup off for the last %s", epoch + 1,
                 "epoch" if left == 1 else f"{left} epochs")
        if changed:
            t.events.write(CapturedRegionChangedEvent(epoch=epoch + 1, reason="mosaic closed"))
            if parts.cuda_graph is not None:
                parts.cuda_graph.invalidate(f"{t.family.title} changed the network at mosaic close")
            if parts.compiled is not None:
                parts.compiled.invalidate(f"{t.family.title} changed the network at mosaic close")


class NonFiniteGuard(HookBase):
    """A non-finite step leaves no trace (docs/architecture.md, "Trainer"): the step's
    gradients are dropped and BatchNorm's statistics restored; ten in a row, or an epoch
    without one optimizer step, raise :class:`NonFiniteLossError`."""

    def __init__(self) -> None:
        self.first_bad = ""  # "step 3/8 (box=nan, ...)": the first non-finite step of the epoch
        self.applied_before = 0  # optimizer steps taken before the epoch

    def before_epoch(self) -> None:
        self.first_bad = ""
        self.applied_before = self.trainer.state.steps_applied

    def _skip(self) -> None:
        self.trainer.parts.optimizer.zero_grad(set_to_none=True)
        self.trainer.bn_guard.restore()  # the forward pass already moved the running stats

    def loss_finite(self, values: list[float]) -> bool:
        """Whether the step's ``[total, *items]`` are finite; if not, count it, warn and
        drop the step."""
        t, st, m = self.trainer, self.trainer.state, self.trainer.meter
        if all(math.isfinite(v) for v in values):
            st.nonfinite_streak = 0
            return True
        st.nonfinite_streak += 1
        st.nonfinite_skipped += 1
        terms = describe_nonfinite(t.parts.item_names, values[1:])
        self.first_bad = self.first_bad or f"step {m.step + 1}/{m.steps} ({terms})"
        log.warning("epoch %d step %d: non-finite loss (%s); optimizer step skipped",
                    st.epoch + 1, m.step + 1, terms)
        self._skip()
        return False

    def grads_finite(self) -> bool:
        """fp32 steps: whether every gradient is finite (a finite loss can back-propagate an
        inf; the fp16 scaler checks itself); if not, count and drop the step."""
        st = self.trainer.state
        if grads_finite(self.trainer.parts.model.parameters()):
            return True
        st.nonfinite_skipped += 1
        st.nonfinite_streak += 1
        log.warning("non-finite gradients (the loss was finite); optimizer step skipped")
        self._skip()
        return False

    def scaler_skipped(self, scale_before: float) -> bool:
        """fp16 AMP: the scaler skipped the step (inf/NaN gradients) iff it lowered the
        scale; the window then leaves no trace either (BatchNorm restored, EMA not blended)."""
        st, scaler = self.trainer.state, self.trainer.parts.amp.scaler
        if not (scaler.is_enabled() and scaler.get_scale() < scale_before):
            return False
        st.amp_skipped += 1
        self.trainer.bn_guard.restore()
        log.log(logging.WARNING if st.amp_skipped % 100 == 0 else logging.DEBUG,
                "AMP GradScaler skipped a step for inf/NaN gradients (%d so far); scale now %g",
                st.amp_skipped, scaler.get_scale())
        return True

    def scaler_calibrating(self) -> bool:
        """fp16 AMP: whether an epoch whose every optimizer step the GradScaler skipped is
        the scaler still finding its scale, not a diverged run; if so, say it in one line.

        The scaler starts at 2**16 and halves at each skipped step. At that scale fp16
        weight gradients of a freshly initialised YOLO overflow (any |gradient| above
        65504 / 2**16 = 1), so the first several optimizer steps are skipped; with
        gradient accumulation and a small set (coco128 at batch 16: 2 optimizer steps an
        epoch) that can take whole epochs. Gradients that are still non-finite once the
        scale is below 1 are non-finite unscaled: that run diverged (the caller raises)."""
        scaler = self.trainer.parts.amp.scaler
        if not scaler.is_enabled() or scaler.get_scale() < 1.0:
            return False
        st = self.trainer.state
        log.warning("epoch %d: the AMP GradScaler skipped every optimizer step of the epoch "
                    "while it finds its scale (now %g after %d skipped step(s); it halves at each): "
                    "training goes on. amp_dtype=bfloat16 needs no scaler", st.epoch + 1,
                    scaler.get_scale(), st.amp_skipped)
        return True

    def after_step(self, finite: bool) -> None:
        st = self.trainer.state
        if not finite and st.nonfinite_streak >= MAX_NONFINITE_STREAK:
            raise NonFiniteLossError(
                f"{st.nonfinite_streak} non-finite losses in a row at epoch {st.epoch + 1}: the run diverged; "
                f"try {self._ways_out()}")

    def after_train_epoch(self) -> None:
        t, m = self.trainer, self.trainer.meter
        if m.steps and t.state.steps_applied == self.applied_before and not t.stopping():
            if m.counted and self.scaler_calibrating():
                return
            why = (f"every loss was non-finite, the first at {self.first_bad}" if not m.counted else
                   "every step had non-finite gradients (skipped by the AMP GradScaler or the fp32 check)")
            raise NonFiniteLossError(f"epoch {t.state.epoch + 1}: no optimizer step was taken in {m.steps} "
                                     f"steps: {why}. The run diverged; try {self._ways_out()}")

    def _ways_out(self) -> str:
        """What to try after a divergence, as training keys with values: a tenth of ``lr0``,
        and ``amp=False`` only when AMP is on (on the CPU it never is)."""
        t = self.trainer
        lower = f"a lower lr0 (lr0={t.cfg.lr0 / 10:g})"
        return f"amp=False or {lower}" if t.parts.amp.enabled else lower


class ValidationHook(HookBase):
    """Validation with the EMA weights every ``eval_interval`` epochs and at the last
    (rank 0; the val loader exists there only), the best epoch by :func:`fitness`, the
    epoch's ``results.csv`` row, and the early-stop decision (``patience`` validated
    epochs without a better fitness)."""

    def __init__(self) -> None:
        self.since_best = 0  # validated epochs since the best one
        self.last_pass: ValPredictions | None = None  # the latest validation (the report's input)
        self.last_epoch = 0

    def after_epoch(self) -> None:
        t, cfg, st, out = self.trainer, self.trainer.cfg, self.trainer.state, self.trainer.outcome
        epoch = out.epoch
        out.validated = bool(cfg.val and t.parts.val_loader is not None and (
            (epoch + 1) % cfg.eval_interval == 0 or epoch + 1 == cfg.epochs))
        if out.validated:
            t_val = time.perf_counter()
            st.metrics = self._validate()
            out.val_time_s = time.perf_counter() - t_val
            st.val_s.append(out.val_time_s)
        out.fitness = fitness(st.metrics) if out.validated else float("nan")
        out.is_best = out.validated and out.fitness > st.best_fitness or (not cfg.val and epoch + 1 == cfg.epochs)
        if out.is_best:
            st.best_fitness, st.best_epoch = (out.fitness if out.validated else 0.0), epoch + 1
            st.best_metrics = dict(st.metrics)
            self.since_best = 0
        elif out.validated:
            self.since_best += 1
        out.since_best = self.since_best
        out.early_stop = bool(cfg.patience and out.validated and self.since_best >= cfg.patience)
        st.history.append({
            "epoch": epoch + 1, "time": round(time.time(), 3), "epoch_time_s": round(out.epoch_time_s, 3),
            "val_time_s": round(out.val_time_s, 3),
            **{f"train/{k}_loss": round(v, 6) for k, v in out.losses.items()},
            **{f"metrics/{k}": round(st.metrics.get(k, float("nan")), 6)
               for k in ("precision", "recall", "mAP50", "mAP50-95")},
            "fitness": round(out.fitness, 6), "lr": out.lr, "validated": int(out.validated),
            "is_best": int(out.is_best)})

    def _validate(self) -> dict[str, float]:
        from libreyolo_core.engine.progress import validation_progress

        t, parts = self.trainer, self.trainer.parts
        net = parts.ema.module if parts.ema is not None else unwrap(parts.model)
        progress = validation_progress(t.events, t.state.epoch + 1, t.cfg.epochs)
        dog = getattr(t, "watchdog", None)

        def on_batch(k: int, n: int) -> None:
            progress(k, n)
            if dog is not None:  # a validation batch is a sign of life
                dog.alive()

        kept = ValPredictions()
        metrics = validate(net, t.family, parts.val_loader, t.device, t.nc, conf=t.cfg.conf, iou=t.cfg.iou,
                           max_det=t.cfg.max_det, amp=parts.amp, on_batch=on_batch, keep=kept)
        self.last_pass, self.last_epoch = kept, t.state.epoch + 1
        return metrics


class ReportHook(HookBase):
    """Rank 0, at the end of a run that finished: the validation report of the last
    validated epoch under ``<run_dir>/val/`` (:func:`~libreyolo_core.eval.report.write_report`;
    pictures unless ``plots=False``), its table printed, one ``artifact`` event per file.
    It reuses that epoch's predictions: no extra validation pass."""

    def __init__(self, validation: ValidationHook) -> None:
        self.validation = validation

    def after_train(self) -> None:
        t, vh = self.trainer, self.validation
        if t.status not in ("succeeded", "early_stopped") or vh.last_pass is None:
            return
        from libreyolo_core.eval.report import format_table, write_report

        labels = None
        if t.cfg.plots and getattr(t.parts, "train_set", None) is not None:
            labels = [r.labels for r in t.parts.train_set.records]
        meta = {"epoch": vh.last_epoch, "model": f"{t.family.name}-{t.size}", "imgsz": t.cfg.imgsz,
                "split": "val", "data": str(t.cfg.data), "val_time_s": round(t.state.val_s[-1], 3)
                if t.state.val_s else None}
        fence.check("the validation report (val/)")  # an attempt given up writes nothing
        try:
            report = write_report(t.run_dir / "val", vh.last_pass, dict(t.names or {}), t.cfg.plot_images,
                                  labels, meta, plots=t.cfg.plots)
        except Exception as exc:  # noqa: BLE001 - a failed report never fails a finished run
            log.warning("validation report not written: %s: %s", type(exc).__name__, exc)
            return
        print(f"validation report (epoch {vh.last_epoch}), {t.run_dir / 'val'}:\n{format_table(report)}", flush=True)
        print(f"report: {report['timing']['total_s']:.2f} s (the validation pass took "
              f"{meta['val_time_s']} s)", flush=True)
        for rel in _report_files(report):
            t.events.write(ArtifactEvent(path=f"val/{rel}", kind=_report_kind(rel)))


def _report_files(report: dict[str, Any]) -> list[str]:
    """The files of a written report, relative to ``val/``."""
    return list(report["files"].values()) + [img["file"] for img in report["images"]]


def _report_kind(rel: str) -> str:
    """The artifact kind of a report file: report, predictions, plot or detections."""
    if rel.startswith("detections/"):
        return "detections"
    if rel.endswith(".png"):
        return "plot"
    return "predictions" if rel in ("predictions.json", "ground_truth.json") else "report"


class CheckpointHook(HookBase):
    """Rank 0: ``weights/last.pt`` after every epoch (``best.pt`` too when best, lean;
    ``epoch_N.pt`` every ``save_period`` epochs) and ``results.csv``; on an interrupt,
    ``last.pt`` of the last completed epoch."""

    def after_epoch(self) -> None:
        out = self.trainer.outcome
        self.save(out.epoch, out.is_best)
        self._write_results()
        self.trainer.events.write(ArtifactEvent(path="results.csv", kind="results"))

    def on_interrupt(self) -> None:
        self.save(self.trainer.state.epoch - 1, is_best=False, periodic=False)

    def save(self, epoch: int, is_best: bool, periodic: bool = True) -> None:
        """``last.pt`` (+ ``best.pt`` when best); ``epoch_N.pt`` every ``save_period``
        completed epochs unless ``periodic`` is False (an interrupt's save, whose ``epoch``
        is the last completed one, -1 when none was)."""
        t = self.trainer
        state = t.state.checkpoint(epoch, t.parts, meta=t.meta(), config=t.cfg.model_dump(mode="json"))
        weights = t.run_dir / "weights"
        last = save_checkpoint(state, weights / "last.pt")
        t.events.write(ArtifactEvent(path="weights/last.pt", kind="checkpoint"))
        if is_best:  # lean: the EMA weights in float16 and the metadata, no training state
            save_checkpoint(lean_state(state), weights / "best.pt")
            t.events.write(ArtifactEvent(path="weights/best.pt", kind="checkpoint"))
        if periodic and t.cfg.save_period and (epoch + 1) % t.cfg.save_period == 0:
            fence.check(f"checkpoint epoch_{epoch + 1}.pt")
            shutil.copyfile(last, weights / f"epoch_{epoch + 1}.pt")

    def _write_results(self) -> None:
        history, run_dir = self.trainer.state.history, self.trainer.run_dir
        if not history:
            return
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(history[-1].keys()), extrasaction="ignore")
        writer.writeheader()
        for row in history:
            writer.writerow({k: ("" if isinstance(v, float) and not math.isfinite(v) else v)
                             for k, v in row.items()})
        tmp = run_dir / ".results.csv.tmp"
        fence.check("results.csv")  # an attempt given up writes nothing
        tmp.write_text(buf.getvalue(), encoding="utf-8")
        fence.check("results.csv", leftover=tmp)
        os.replace(tmp, run_dir / "results.csv")


class WatchdogHook(HookBase):
    """Every rank's hang watchdog (:mod:`~libreyolo_core.engine.watchdog`), when the
    environment enables it: each finished step restarts its clock, and so does each epoch's
    start; a rank other than 0 suspends it while it waits for rank 0's end of the epoch."""

    def __init__(self) -> None:
        self.dog: Any = None

    def before_train(self) -> None:
        from libreyolo_core.engine.watchdog import from_env

        self.dog = from_env(rank=self.trainer.dist.rank)
        self.trainer.watchdog = self.dog
        if self.dog is not None:
            log.info("hang watchdog on: no step for max(%g x median step, %g s) is a hang",
                     self.dog.factor, self.dog.min_s)
            self.dog.start()

    def before_epoch(self) -> None:
        if self.dog is not None:
            self.dog.alive()

    def after_step(self, finite: bool) -> None:
        if self.dog is not None:
            self.dog.step_done()

    def after_train_epoch(self) -> None:
        if self.dog is not None and not self.trainer.dist.is_main:
            self.dog.suspend()

    def after_train(self) -> None:
        if self.dog is not None:
            self.dog.stop()


class CallbackHook(HookBase):
    """The user's ``callbacks`` (``{event: [fn(trainer), ...]}``, :data:`CALLBACK_EVENTS`),
    rank 0 only."""

    def __init__(self, callbacks: dict[str, list[Callable[[Any], None]]]):
        self.callbacks = callbacks

    def _fire(self, event: str) -> None:
        for fn in self.callbacks.get(event, []):
            fn(self.trainer)

    def before_train(self) -> None:
        self._fire("on_train_start")

    def after_epoch(self) -> None:
        self._fire("on_epoch_end")

    def after_train(self) -> None:
        self._fire("on_train_end")


def default_hooks(trainer: Trainer, callbacks: dict[str, list[Callable[[Any], None]]]) -> list[HookBase]:
    """The hooks of ``trainer``'s process, in calling order; rank 0 alone profiles, saves,
    reports and calls ``callbacks``.

    The order is the contract: the profiler closes a step before anything else is timed;
    validation decides the best epoch before the checkpoint is written, and both come
    before the ``epoch_end`` event and the user's ``on_epoch_end``.
    """
    from libreyolo_core.engine.profile_hook import ProfilerHook
    from libreyolo_core.engine.progress import ProgressHook

    main, cfg = trainer.dist.is_main, trainer.cfg
    hooks: list[HookBase] = [WatchdogHook(), MosaicSwitchHook()]  # first: sees every step
    if main and cfg.profile and not trainer.dist.enabled:
        hooks.append(ProfilerHook())
    validation = ValidationHook()
    hooks.append(validation)
    if main:
        hooks.append(CheckpointHook())
        if getattr(cfg, "export", None):  # best.pt -> weights/best.onnx before run_end and the trackers' artifacts
            from libreyolo_core.export.hook import ExportHook

            hooks.append(ExportHook())
        hooks += [ReportHook(validation), ProgressHook()]
    hooks.append(NonFiniteGuard())
    if main:
        from libreyolo_core.engine.trackers import tracker_hooks

        hooks += tracker_hooks(trainer)  # TensorBoard, MLflow (engine/trackers.py)
        hooks.append(CallbackHook(callbacks))
    for hook in hooks:
        hook.trainer = trainer
    return hooks
