"""engine/signals.py: one SIGTERM handler, chained once to the one it replaced, restored after."""

from __future__ import annotations

import os
import signal

import pytest

from libreyolo_core.engine.signals import install_sigterm, sigterm


@pytest.fixture
def outer():
    """A Python SIGTERM handler standing for an enclosing job (a tune, a preflight)."""
    calls: list[str] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append("outer"))
    yield calls
    signal.signal(signal.SIGTERM, before)


def test_chains_once_after_its_own_and_restores(outer):
    handler_before = signal.getsignal(signal.SIGTERM)
    restore = install_sigterm(lambda: outer.append("inner"))
    os.kill(os.getpid(), signal.SIGTERM)
    assert outer == ["inner", "outer"]
    restore()
    restore()  # idempotent
    assert signal.getsignal(signal.SIGTERM) is handler_before
    os.kill(os.getpid(), signal.SIGTERM)
    assert outer == ["inner", "outer", "outer"]


def test_a_raising_handler_still_chains(outer):
    class Stop(Exception):
        pass

    def stop() -> None:
        outer.append("inner")
        raise Stop

    with pytest.raises(Stop), sigterm(stop):
        os.kill(os.getpid(), signal.SIGTERM)
    assert outer == ["inner", "outer"]


def test_chain_false_does_not_call_the_previous_one(outer):
    with sigterm(lambda: outer.append("inner"), chain=False):
        os.kill(os.getpid(), signal.SIGTERM)
    assert outer == ["inner"]
