"""The hang watchdog: a step that never ends is detected, explained and ended.

Every rank runs one (:class:`HangWatchdog`, a hook of the trainer, enabled by the
environment the service's worker sets: ``LIBREYOLO_HANG_FACTOR`` = k and
``LIBREYOLO_HANG_MIN_S`` = T). When no training step has finished for
``max(k x median step time, T)`` seconds (T alone until a step has finished), the rank

1. writes one line saying so, then the stacks of every thread of the process into its
   stderr (the job's ``train.log``): :func:`faulthandler.dump_traceback`, and ``py-spy
   dump`` (native frames too) when py-spy is installed;
2. records ``{"exit_code": 5, "error": "hang: ..."}`` in ``$LIBREYOLO_ERROR_FILE`` (the
   first rank to fail writes it; torchrun's own exit code is always 1);
3. ends its process (``os._exit(EXIT_HANG)``), at once in a one-process run; under DDP
   (``world_size`` > 1) after :func:`peer_grace_s`, so that the ranks silent behind the
   same hang fire their own watchdogs and dump their stacks before this rank's exit breaks
   their collective (without it, a peer's "connection closed by peer" ended it first and
   only one rank's stacks reached the log on a loaded machine). Its process group's loader workers
   follow it, torchrun stops the other ranks, and the worker kills what is left of the tree
   and re-queues the attempt as ``infrastructure: hang``, to resume from ``last.pt``.

Under DDP every rank stuck behind the hung one (waiting in a collective) also goes silent,
so every rank's stacks reach the log. The other ranks' wait while rank 0 validates and
saves is not a hang: those ranks suspend their watchdog from the end of their epoch until
the next one starts, and rank 0's validation batches count as signs of life.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from libreyolo_core.engine import fence

__all__ = ["EXIT_HANG", "FACTOR_ENV", "MIN_S_ENV", "HangWatchdog", "from_env"]

#: the engine's exit code after a hang (``worker.outcome`` reads it as an infrastructure end)
EXIT_HANG = 5
FACTOR_ENV = "LIBREYOLO_HANG_FACTOR"
MIN_S_ENV = "LIBREYOLO_HANG_MIN_S"
#: step durations the median is taken over
WINDOW = 200


class HangWatchdog:
    """A daemon thread that ends the process when no step finished for too long.

    Args:
        factor: k of ``max(k x median step, min_s)``; > 1.
        min_s: T, seconds: the shortest silence called a hang.
        rank: this process's global rank (named in the log and the error file).
        world_size: ranks in the run; above 1 the fired rank waits :func:`peer_grace_s`
            before it exits.
        poll_s: how often the thread looks, seconds (default ``min(1, min_s / 10)``).
        on_hang: what to do instead of the default report-and-exit (tests); called with
            the message.

    Raises:
        ValueError: ``factor <= 1`` or ``min_s <= 0``.
    """

    def __init__(self, factor: float, min_s: float, *, rank: int = 0, world_size: int = 1,
                 poll_s: float | None = None, on_hang: Callable[[str], None] | None = None):
        if not factor > 1 or not min_s > 0:
            raise ValueError(f"hang watchdog: factor must be > 1 and min_s > 0 (got factor="
                             f"{factor!r}, min_s={min_s!r})")
        self.factor, self.min_s, self.rank = float(factor), float(min_s), rank
        self.world_size = world_size
        self.poll_s = poll_s if poll_s is not None else min(1.0, self.min_s / 10)
        self.on_hang = on_hang
        self._steps: deque[float] = deque(maxlen=WINDOW)
        self._last = time.monotonic()
        self._suspended = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired: str | None = None  #: the message, once it fired

    # -- what the trainer says ---------------------------------------------------------
    def step_done(self) -> None:
        """A training step finished: its duration joins the median; the clock restarts."""
        now = time.monotonic()
        with self._lock:
            if not self._suspended:
                self._steps.append(now - self._last)
            self._last, self._suspended = now, False

    def alive(self) -> None:
        """A sign of life that is not a step (a validation batch, an epoch start)."""
        with self._lock:
            self._last, self._suspended = time.monotonic(), False

    def suspend(self) -> None:
        """Stop counting until the next :meth:`alive` or :meth:`step_done` (a wait that
        another rank bounds, e.g. the barrier while rank 0 validates)."""
        with self._lock:
            self._suspended = True

    def limit_s(self) -> float:
        """The silence called a hang now: ``max(k x median step, T)`` (T before any step)."""
        with self._lock:
            median = statistics.median(self._steps) if self._steps else 0.0
        return max(self.factor * median, self.min_s)

    # -- the thread ----------------------------------------------------------------------
    def start(self) -> HangWatchdog:
        """Start watching (the clock starts now)."""
        self.alive()
        self._thread = threading.Thread(target=self._run, name="hang-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (the run is over)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            with self._lock:
                silent, suspended = time.monotonic() - self._last, self._suspended
                median = statistics.median(self._steps) if self._steps else None
            limit = self.limit_s()
            if suspended or silent < limit:
                continue
            how = (f"max({self.factor:g} x median step {median:.3g} s, {self.min_s:g} s)"
                   if median is not None else f"{self.min_s:g} s (no step finished yet)")
            self.fired = (f"hang: rank {self.rank}: no step finished for {silent:.1f} s "
                          f"(limit {how} = {limit:.1f} s)")
            if self.on_hang is not None:
                self.on_hang(self.fired)
                return
            self._report_and_exit(self.fired)

    def _report_and_exit(self, message: str) -> None:
        err = sys.stderr
        with contextlib.suppress(Exception):
            err.write(f"error: {message}; the stacks of every thread of rank {self.rank} "
                      f"(pid {os.getpid()}) follow\n")
            err.flush()
        with contextlib.suppress(Exception):
            faulthandler.dump_traceback(file=err, all_threads=True)
        spy = shutil.which("py-spy")
        if spy:  # native frames too (a stuck collective inside C++)
            with contextlib.suppress(Exception):
                out = subprocess.run([spy, "dump", "--native", "--pid", str(os.getpid())],
                                     capture_output=True, text=True, timeout=30)
                err.write(out.stdout + out.stderr)
        _record(message, self.rank)
        with contextlib.suppress(Exception):
            err.flush()
        if self.world_size > 1:
            time.sleep(peer_grace_s(self.limit_s(), self.poll_s))
        os._exit(EXIT_HANG)


def peer_grace_s(limit_s: float, poll_s: float) -> float:
    """Seconds a DDP rank waits after its watchdog fired, before it exits: the other ranks
    stopped at the same collective, so their watchdogs fire within a poll or two and a
    spread of their limits (the medians differ by a few per cent); 5 s covers a loaded
    machine's scheduling delays. ``max(5, 2 x poll_s, 0.1 x limit_s)``, at most 60."""
    return min(max(5.0, 2 * poll_s, 0.1 * limit_s), 60.0)


def _record(message: str, rank: int) -> None:
    """The error file (``$LIBREYOLO_ERROR_FILE``), as the CLI writes it: first writer wins."""
    path = os.environ.get("LIBREYOLO_ERROR_FILE")
    if not path:
        return
    fence.check("the error file")  # a given-up attempt's hang is not the newer attempt's
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump({"exit_code": EXIT_HANG, "error": message, "rank": rank}, fh)


def from_env(rank: int = 0, env: Any = None, world_size: int = 1) -> HangWatchdog | None:
    """The watchdog the environment asks for (:data:`FACTOR_ENV`, :data:`MIN_S_ENV`), not
    started; None when :data:`MIN_S_ENV` is not set (a run outside the service).

    Raises:
        ValueError: a value that is not a number, or out of range.
    """
    env = os.environ if env is None else env
    raw_min = env.get(MIN_S_ENV)
    if not raw_min:
        return None
    try:
        factor, min_s = float(env.get(FACTOR_ENV) or 10.0), float(raw_min)
    except ValueError as exc:
        raise ValueError(f"{FACTOR_ENV}/{MIN_S_ENV}: not a number ({exc})") from None
    return HangWatchdog(factor, min_s, rank=rank, world_size=world_size)
