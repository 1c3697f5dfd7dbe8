"""The step's phase timer: null by default, so the step path names no profiler.

The trainer wraps each phase of a step (``to_device``, ``forward``, ``backward``,
``optimizer``, ``ema``) in ``trainer.timer.phase(name)``. Outside a profile window the timer
is :data:`NULL_TIMER`, whose ``phase`` returns one shared null context: no call into the
profiler, no object built. The profiler's hook
(:class:`~libreyolo_core.engine.hooks.profile.ProfilerHook`) swaps its
:class:`~libreyolo_core.profiler.window.TrainingProfiler` in for the window and the null
timer back when the window is over.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import Any, Protocol

__all__ = ["StepTimer", "NullTimer", "NULL_TIMER"]

_NULL = contextlib.nullcontext()


class StepTimer(Protocol):
    """Times the phases of a step."""

    def phase(self, name: str) -> AbstractContextManager[Any]:
        """A context around phase ``name`` of the current step."""
        ...


class NullTimer:
    """The timer that times nothing (a shared null context for every phase)."""

    def phase(self, name: str) -> AbstractContextManager[Any]:  # noqa: ARG002 - the protocol's
        """The shared null context."""
        return _NULL


#: The timer of every step outside a profile window.
NULL_TIMER = NullTimer()
