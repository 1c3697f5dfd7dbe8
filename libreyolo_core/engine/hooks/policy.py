"""The policy: which hooks a process runs, in which order, on which rank."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from libreyolo_core.engine.hooks.base import HookBase, TrainerView
from libreyolo_core.engine.hooks.callbacks import CallbackHook
from libreyolo_core.engine.hooks.checkpoint import CheckpointHook
from libreyolo_core.engine.hooks.guard import NonFiniteGuard
from libreyolo_core.engine.hooks.mosaic import MosaicSwitchHook
from libreyolo_core.engine.hooks.profile import ProfilerHook
from libreyolo_core.engine.hooks.progress import ProgressHook
from libreyolo_core.engine.hooks.report import ReportHook
from libreyolo_core.engine.hooks.validation import ValidationHook
from libreyolo_core.engine.hooks.watchdog import WatchdogHook

__all__ = ["default_hooks"]


def default_hooks(trainer: TrainerView, callbacks: dict[str, list[Callable[[Any], None]]]) -> list[HookBase]:
    """The hooks of ``trainer``'s process, in calling order; rank 0 alone profiles, saves,
    reports and calls ``callbacks``.

    The order is the contract: the profiler closes a step before anything else is timed;
    validation decides the best epoch before the checkpoint is written, and both come
    before the ``epoch_end`` event and the user's ``on_epoch_end``. The export and tracker
    hooks are imported here, when asked for (they are optional and import heavier modules);
    their modules import the contract (:mod:`.base`), whose package does not import this
    policy, so no import circle.
    """
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
