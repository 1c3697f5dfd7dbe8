"""The trainer's hooks: everything around the step that is not the step.

The loop (:class:`~libreyolo_core.engine.trainer.Trainer`) calls each hook point on every
hook of its list, in list order (:func:`default_hooks` builds the list once, when the
process's rank is known, so "rank 0 only" is decided there and nowhere else; it lives in
:mod:`.policy`, which this package does not import)::

    before_train
    for each epoch:
        before_epoch
        wrap_loader(batches)                                    (each hook wraps the loader)
        for each micro-batch:  step, then after_step(finite)   (True: leave the epoch)
        after_train_epoch                                       (every epoch, profile-only too)
        on_interrupt                                            (a stop was agreed: save)
        after_epoch                                             (validate, save, report)
    after_train                                                 (always, in ``finally``)

A hook reads and changes the run through ``self.trainer`` (set when the list is built),
typed as :class:`~.base.TrainerView`: the part of the trainer hooks may use.
The shape follows detectron2's ``HookBase`` (engine/hooks.py) with YOLOX's epoch points;
``after_train_epoch`` is ours: the step-level hooks close their epoch before validation,
which a profile-only run never reaches.

The package: :mod:`.base` is the contract (:class:`HookBase`, the epoch's
:class:`EpochMeter` and :class:`EpochOutcome`); one module per hook (:mod:`.watchdog`,
:mod:`.mosaic`, :mod:`.profile`, :mod:`.validation`, :mod:`.checkpoint`, :mod:`.report`,
:mod:`.progress`, :mod:`.guard`, :mod:`.callbacks`; the trackers' in
:mod:`libreyolo_core.engine.trackers`, the export's in :mod:`libreyolo_core.export.hook`);
:mod:`.policy` is :func:`default_hooks`, the only place that decides which hooks run, in
which order, on which rank. A hook module imports the contract, never the policy or the
trainer, not even for types: :class:`~.base.TrainerView` stands for it.

This ``__init__`` imports the contract and the hooks, not the policy (import
``default_hooks`` from :mod:`libreyolo_core.engine.hooks.policy`): the policy imports the
tracker and export hooks, whose modules import :mod:`.base` and so run this ``__init__``;
importing the policy here made that a circle.
"""

from libreyolo_core.engine.hooks.base import (
    CALLBACK_EVENTS,
    EpochMeter,
    EpochOutcome,
    HookBase,
    TrainerView,
)
from libreyolo_core.engine.hooks.callbacks import CallbackHook
from libreyolo_core.engine.hooks.checkpoint import CheckpointHook
from libreyolo_core.engine.hooks.guard import MAX_NONFINITE_STREAK, NonFiniteGuard
from libreyolo_core.engine.hooks.mosaic import MosaicSwitchHook
from libreyolo_core.engine.hooks.profile import ProfilerHook
from libreyolo_core.engine.hooks.progress import ProgressHook
from libreyolo_core.engine.hooks.report import ReportHook
from libreyolo_core.engine.hooks.validation import ValidationHook
from libreyolo_core.engine.hooks.watchdog import WatchdogHook

__all__ = ["HookBase", "TrainerView", "EpochMeter", "EpochOutcome", "MosaicSwitchHook", "NonFiniteGuard", "ValidationHook",
           "ReportHook", "CheckpointHook", "CallbackHook", "WatchdogHook", "ProfilerHook", "ProgressHook",
           "CALLBACK_EVENTS", "MAX_NONFINITE_STREAK"]
