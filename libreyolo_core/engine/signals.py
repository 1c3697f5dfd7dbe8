"""SIGTERM while a piece of work runs: one handler, chained to the one it replaces.

A training run can be nested in a longer job (a tune's trials, a preflight's trials, the
spawn launcher's parent): each level installs its own SIGTERM handler for the time it
runs. :func:`install_sigterm` puts ``on_term`` in place and, with ``chain``, calls the
Python handler it replaced after it, so the outer level learns of the stop too (even when
``on_term`` raises); the returned ``restore`` puts the previous handler back. Signals
reach Python's main thread only, so off it nothing is installed.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["install_sigterm", "sigterm"]


def install_sigterm(on_term: Callable[[], None], *, chain: bool = True) -> Callable[[], None]:
    """Make SIGTERM call ``on_term()`` (main thread only).

    Args:
        on_term: called with no arguments when SIGTERM arrives; it may raise (the exception
            leaves the interrupted frame, after the chained handler ran).
        chain: also call the Python handler this one replaces (``handler(signum, frame)``),
            once, after ``on_term``; ``SIG_DFL`` / ``SIG_IGN`` are not called.

    Returns:
        ``restore()``: puts the previous handler back; idempotent, and a no-op when nothing
        was installed (off the main thread).
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: FrameType | None) -> None:
        try:
            on_term()
        finally:
            if chain and callable(previous):
                previous(signum, frame)

    signal.signal(signal.SIGTERM, handler)
    restored = False

    def restore() -> None:
        nonlocal restored
        if not restored:
            restored = True
            if previous is not None:  # None: a handler not installed from Python
                signal.signal(signal.SIGTERM, previous)

    return restore


@contextmanager
def sigterm(on_term: Callable[[], None], *, chain: bool = True) -> Iterator[None]:
    """:func:`install_sigterm` for the duration of a ``with`` block (restored on exit,
    whatever the block raised)."""
    restore = install_sigterm(on_term, chain=chain)
    try:
        yield
    finally:
        restore()
