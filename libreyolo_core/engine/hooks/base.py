"""The hook contract: the points the loop calls, what a hook sees of the trainer, and the
epoch's figures hooks share.

:class:`HookBase` lists the points (the package docstring gives their order); a hook
overrides those it needs. :class:`TrainerView` is the trainer as its hooks see it (a
Protocol: :class:`~libreyolo_core.engine.trainer.Trainer` satisfies it by its shape, so
this module never imports the trainer, which imports the hooks). :class:`EpochMeter` is
the epoch being trained, :class:`EpochOutcome` the epoch just completed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:  # none of these imports the hooks (tests/core/test_import_cycles.py)
    from libreyolo_core.config import TrainConfig
    from libreyolo_core.distributed.context import DistContext
    from libreyolo_core.engine.build import TrainParts
    from libreyolo_core.engine.events import EventLog
    from libreyolo_core.engine.nonfinite import BatchNormGuard
    from libreyolo_core.engine.run import Run
    from libreyolo_core.engine.state import TrainState
    from libreyolo_core.engine.timer import StepTimer
    from libreyolo_core.models.family import Family

__all__ = ["HookBase", "TrainerView", "EpochMeter", "EpochOutcome", "CALLBACK_EVENTS"]


#: The events ``callbacks`` may name (called on rank 0 with the trainer).
CALLBACK_EVENTS = ("on_train_start", "on_epoch_end", "on_train_end")


class TrainerView(Protocol):
    """The trainer as its hooks see it: what they may change (the attributes) and what they
    read (the properties and methods), all of :class:`~libreyolo_core.engine.trainer.Trainer`
    that a hook, a tracker or the export hook uses.

    Attributes:
        timer: times the step's phases (the profiler's hook swaps it in and out).
        preflight: the run's preflight estimate, or None (the progress hook moves its files).
        quiet_progress: a hook reports this epoch's progress itself.
        stop_is_success: a hook's stop ends the run as succeeded (profile-only).
        watchdog: the hang watchdog while it runs, or None.
    """

    timer: StepTimer
    preflight: Any
    quiet_progress: bool
    stop_is_success: bool
    watchdog: Any

    @property
    def cfg(self) -> TrainConfig:
        """The run's config (a resumed run's: the checkpoint's)."""

    @property
    def state(self) -> TrainState:
        """What is saved and resumed (epoch, best, history; hooks update its fields)."""

    @property
    def dist(self) -> DistContext:
        """The process's rank context."""

    @property
    def meter(self) -> EpochMeter:
        """The epoch being trained."""

    @property
    def outcome(self) -> EpochOutcome:
        """The epoch just completed (the ``after_epoch`` hooks fill it in)."""

    @property
    def run(self) -> Run:
        """The prepared run."""

    @property
    def parts(self) -> TrainParts:
        """The run's parts (model, loss_fn, optimizer, ema, loaders, ...)."""

    @property
    def run_dir(self) -> Path:
        """The run directory."""

    @property
    def events(self) -> EventLog:
        """The run's ``events.jsonl`` (a disabled log on ranks other than 0)."""

    @property
    def device(self) -> torch.device:
        """The device this process trains on."""

    @property
    def family(self) -> Family:
        """The model's family."""

    @property
    def size(self) -> str:
        """The model's size code (``"t"``)."""

    @property
    def names(self) -> dict[int, str]:
        """The dataset's classes, id -> name."""

    @property
    def nc(self) -> int:
        """The number of classes."""

    @property
    def bn_guard(self) -> BatchNormGuard:
        """Restores BatchNorm's statistics after a skipped step."""

    @property
    def extra_result(self) -> dict[str, Any]:
        """What hooks add to the run's result (``profile``)."""

    @property
    def stop_requested(self) -> bool:
        """A stop was requested in this process."""

    @property
    def status(self) -> str:
        """How the run ended (``after_train``): succeeded, early_stopped, interrupted, failed."""

    @property
    def error(self) -> str | None:
        """The failure's ``"Type: message"`` when the run failed."""

    def request_stop(self, reason: str = "stop requested") -> None:
        """Finish the current step, save ``last.pt`` and end the run as ``interrupted``."""

    def stopping(self) -> bool:
        """Whether to stop now (under DDP: a request every rank has seen)."""

    def meta(self) -> dict[str, Any]:
        """The checkpoint's model metadata: ``model_family``, ``size``, ``nc``, ``names``, ``imgsz``."""

    def timing(self) -> dict[str, Any]:
        """Where the run's time went (``wall_s``: this process's, set-up included)."""


class HookBase:
    """A hook: override the points it needs (the module docstring gives the order).

    Attributes:
        trainer: the trainer whose loop calls it (set by :func:`default_hooks`), seen
            through :class:`TrainerView`.
    """

    trainer: TrainerView

    def before_train(self) -> None:
        """Set-up is done (parts built, run directory chosen); nothing trained yet."""

    def before_epoch(self) -> None:
        """Epoch ``trainer.state.epoch`` (0-based) is about to start."""

    def wrap_loader(self, loader: Iterable[Any]) -> Iterable[Any]:
        """The loader hook point: the epoch's batches, as this hook passes them on (each
        hook wraps what the one before it returned; the profiler times the waits)."""
        return loader

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
