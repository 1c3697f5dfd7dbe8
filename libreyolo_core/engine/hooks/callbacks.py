"""The user's ``callbacks``, called on rank 0 with the trainer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from libreyolo_core.engine.hooks.base import HookBase

__all__ = ["CallbackHook"]


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
