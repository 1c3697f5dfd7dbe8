"""The hang watchdog alone: its limit, its suspension, and a real process that it ends
with every thread's stack in stderr, exit 5 and the error file (no torch)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from libreyolo_core.engine.watchdog import EXIT_HANG, HangWatchdog, from_env

REPO = Path(__file__).resolve().parents[2]


def test_the_limit_is_k_times_the_median_step_or_t():
    dog = HangWatchdog(4, 0.5, on_hang=lambda m: None)
    assert dog.limit_s() == 0.5  # no step yet: T
    for _ in range(5):
        dog._last = time.monotonic() - 0.3  # a 0.3 s step
        dog.step_done()
    assert dog.limit_s() == pytest.approx(1.2, rel=0.05)
    with pytest.raises(ValueError):
        HangWatchdog(1, 5)


def test_it_fires_on_silence_and_not_while_suspended():
    fired: list[str] = []
    dog = HangWatchdog(10, 0.3, rank=3, poll_s=0.05, on_hang=fired.append)
    dog.start()
    dog.suspend()
    time.sleep(0.6)
    assert not fired  # a wait another rank bounds
    dog.alive()
    deadline = time.monotonic() + 5
    while not fired and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fired and fired[0].startswith("hang: rank 3: no step finished for")
    assert "(no step finished yet)" in fired[0]


def test_from_env_needs_t():
    assert from_env(env={}) is None
    dog = from_env(rank=1, env={"LIBREYOLO_HANG_FACTOR": "3", "LIBREYOLO_HANG_MIN_S": "7"})
    assert (dog.factor, dog.min_s, dog.rank) == (3, 7, 1)


HANGS = r'''
import time
from libreyolo_core.engine.watchdog import HangWatchdog
def stuck_in_a_collective():
    time.sleep(3600)
HangWatchdog(10, 1.0, rank=0, poll_s=0.1).start()
stuck_in_a_collective()
'''


def test_a_hung_process_dumps_its_stacks_and_exits_5(tmp_path):
    err = tmp_path / "engine_error.json"
    out = subprocess.run([sys.executable, "-c", HANGS], capture_output=True, text=True,
                         timeout=60, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin",
                                          "LIBREYOLO_ERROR_FILE": str(err)})
    assert out.returncode == EXIT_HANG, out
    assert "error: hang: rank 0: no step finished for" in out.stderr
    assert "stuck_in_a_collective" in out.stderr and "Thread 0x" in out.stderr
    record = json.loads(err.read_text())
    assert record["exit_code"] == EXIT_HANG and record["error"].startswith("hang: rank 0")



def test_under_ddp_a_fired_rank_waits_the_peer_grace_before_it_exits():
    """With world_size 2 the rank whose watchdog fired dumps and records at once, then
    waits :func:`peer_grace_s` (5 s here) before its exit, so that the peers silent behind
    the same hang fire and dump too (tests/worker/test_worker_hang.py runs real ranks)."""
    from libreyolo_core.engine.watchdog import peer_grace_s

    ddp = HANGS.replace("rank=0, poll_s=0.1", "rank=1, world_size=2, poll_s=0.1")
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", ddp], capture_output=True, text=True,
                         timeout=60, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    took = time.monotonic() - t0
    assert out.returncode == EXIT_HANG and "error: hang: rank 1" in out.stderr, out
    assert took >= 1.0 + peer_grace_s(1.0, 0.1), took  # the 1 s limit, then the grace
    assert peer_grace_s(1.0, 0.1) == 5.0 and peer_grace_s(2000.0, 1.0) == 60.0
    assert from_env(rank=1, world_size=2, env={"LIBREYOLO_HANG_MIN_S": "7"}).world_size == 2
