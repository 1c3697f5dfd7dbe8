"""Every rank's hang watchdog, fed by the loop's steps."""

from __future__ import annotations

import logging
from typing import Any

from libreyolo_core.engine.hooks.base import HookBase

__all__ = ["WatchdogHook"]

log = logging.getLogger(__name__)


class WatchdogHook(HookBase):
    """Every rank's hang watchdog (:mod:`~libreyolo_core.engine.watchdog`), when the
    environment enables it: each finished step restarts its clock, and so does each epoch's
    start; a rank other than 0 suspends it while it waits for rank 0's end of the epoch."""

    def __init__(self) -> None:
        self.dog: Any = None

    def before_train(self) -> None:
        from libreyolo_core.engine.watchdog import from_env

        dist = self.trainer.dist
        self.dog = from_env(rank=dist.rank, world_size=dist.world_size)
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
