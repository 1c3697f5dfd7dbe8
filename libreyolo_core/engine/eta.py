"""How long a training run still needs: the ``eta_s`` of its progress events.

The rest of the current epoch comes from this epoch's pace (seconds per step so far). The
epochs after it, and the validations still to run, come from what the run measured: the
mean of its last :data:`RECENT` completed epochs (training and validation timed apart).
Before any epoch has completed, the epochs after this one take this epoch's pace, and a
validation takes the preflight's estimate when the run has one (else it is left out).

Before this module the estimate was ``remaining steps x this epoch's pace`` for every epoch
left, without validation: the first steps of a run (loader start, a slow first batch) made
it too long, and a run that validates every epoch always finished later than it said.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Eta", "eta", "validations_left", "RECENT"]

#: Completed epochs whose mean times the epochs still to come (the latest ones: the last
#: ``no_aug_epochs`` run without mosaic and are faster; a few recent epochs follow that).
RECENT = 3


@dataclass(frozen=True)
class Eta:
    """The estimate, seconds, and what it rests on.

    Attributes:
        seconds: time left (>= 0).
        basis: ``"measured epochs"`` (at least one completed epoch of this run),
            ``"this epoch"`` (none yet), with ``" + preflight validation"`` when the
            validation time is the preflight's estimate.
        epoch_s: the training time assumed for each epoch still to start.
        val_s: the time assumed for each validation still to run (0 when unknown).
    """

    seconds: float
    basis: str
    epoch_s: float
    val_s: float


def validations_left(epoch: int, epochs: int, eval_interval: int, val: bool) -> int:
    """Validations still to run from epoch ``epoch`` (0-based, the current one included)
    to the end: epoch ``e`` validates when ``(e + 1) % eval_interval == 0`` or it is the
    last (the trainer's rule); 0 without validation."""
    if not val:
        return 0
    return sum(1 for e in range(epoch, epochs) if (e + 1) % eval_interval == 0 or e + 1 == epochs)


def eta(*, step: int, steps: int, elapsed_s: float, epochs_after: int, validations: int,
        train_s: Sequence[float] = (), val_s: Sequence[float] = (),
        val_estimate_s: float | None = None) -> Eta:
    """Time left in a run that is at step ``step`` of ``steps`` of its current epoch.

    Args:
        step: steps of the current epoch done (>= 1). steps: steps of one epoch.
        elapsed_s: seconds since the current epoch started.
        epochs_after: epochs still to start after the current one.
        validations: validations still to run, the current epoch's included
            (:func:`validations_left`).
        train_s: training seconds of each completed epoch of this run (oldest first).
        val_s: seconds of each validation this run completed (oldest first).
        val_estimate_s: the preflight's estimate of one validation, used until one ran.

    Returns:
        :class:`Eta`; ``seconds`` = rest of this epoch at its pace + ``epochs_after`` epochs
        + ``validations`` validations (see the module docstring for which times).
    """
    pace = elapsed_s / max(step, 1)
    rest = max(steps - step, 0) * pace
    if train_s:
        epoch_s, basis = statistics.fmean(list(train_s)[-RECENT:]), "measured epochs"
    else:
        epoch_s, basis = steps * pace, "this epoch"
    if val_s:
        one_val = statistics.fmean(list(val_s)[-RECENT:])
    elif val_estimate_s is not None:
        one_val, basis = float(val_estimate_s), basis + " + preflight validation"
    else:
        one_val = 0.0
    total = rest + max(epochs_after, 0) * epoch_s + max(validations, 0) * one_val
    return Eta(seconds=max(total, 0.0), basis=basis, epoch_s=epoch_s, val_s=one_val)
