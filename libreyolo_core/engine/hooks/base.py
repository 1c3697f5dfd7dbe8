"""The hook contract: the points the loop calls, and the epoch's figures hooks share.

:class:`HookBase` lists the points (the package docstring gives their order); a hook
overrides those it needs. :class:`EpochMeter` is the epoch being trained,
:class:`EpochOutcome` the epoch just completed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from libreyolo_core.engine.trainer import Trainer

__all__ = ["HookBase", "EpochMeter", "EpochOutcome", "CALLBACK_EVENTS"]


#: The events ``callbacks`` may name (called on rank 0 with the trainer).
CALLBACK_EVENTS = ("on_train_start", "on_epoch_end", "on_train_end")


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
