"""The engine's process tree: start it in a session of its own, stop it, kill what is left.

The stop sequence (cancel, worker shutdown, the wall-clock budget, a lost lease) is
:class:`EngineProcess`: SIGTERM to the engine's main process only (the engine, or
torchrun's agent, which passes it on to its ranks); the ranks finish the step, save
``last.pt``, emit ``run_end interrupted`` and exit 143. Loader workers are never signalled
here: the main process owns their shutdown. Whatever is still alive after ``grace_s`` (the
main process, torchrun's ranks, which run in sessions of their own, their loader workers)
is SIGKILLed as a tree, and the engine's process group with it. See ``docs/architecture.md``
(*How a job flows*, step 3).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

import psutil

from libreyolo_core.distributed.parent import die_with_parent

__all__ = ["EngineProcess", "kill_leftovers", "kill_tree", "signal_group", "spawn_engine"]

log = logging.getLogger(__name__)


def _pdeathsig() -> None:  # runs in the child after setsid()
    die_with_parent(signal.SIGKILL)  # die with the worker (kill -9)


def spawn_engine(argv: Sequence[str], *, cwd: Path, log_file: IO[bytes],
                 env: Mapping[str, str]) -> subprocess.Popen:
    """Start the engine in a new session (its pid is its process group id) that dies with
    this process (``PR_SET_PDEATHSIG`` SIGKILL); stdout and stderr go to ``log_file``.

    Raises:
        OSError: when the command cannot be started.
    """
    return subprocess.Popen(list(argv), cwd=cwd, stdout=log_file, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=dict(env), start_new_session=True,
                            preexec_fn=_pdeathsig)


def _pgid_members(pgid: int) -> list[int]:
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def kill_leftovers(pgid: int | None, job_dir: Path) -> int:
    """SIGKILL processes of an earlier attempt's group that still run in ``job_dir``.

    Only processes whose working directory is inside ``job_dir`` are signalled, so a
    reused pid never hits an unrelated process. Returns how many were signalled.
    """
    if not pgid or not Path("/proc").is_dir():
        return 0
    n, root = 0, job_dir.resolve()
    for pid in _pgid_members(pgid):
        try:
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            continue
        if cwd == root or root in cwd.parents:
            try:
                os.kill(pid, signal.SIGKILL)
                n += 1
            except ProcessLookupError:
                pass
    return n


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pgid``; a group that is gone is no error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def kill_tree(pid: int) -> int:
    """SIGKILL ``pid``, every descendant (torchrun's ranks live in sessions of their own,
    so their group is not the engine's) and the engine's process group. Returns how many
    processes of the tree were signalled."""
    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.Error:
        procs = []
    n = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
            n += 1
    signal_group(pid, signal.SIGKILL)
    return n


class EngineProcess:
    """A running engine and its stop sequence: one SIGTERM, SIGKILL after a grace period.

    Args:
        proc: the engine, started by :func:`spawn_engine`.
        job_id: named in log lines.
    """

    def __init__(self, proc: subprocess.Popen, job_id: str):
        self.proc, self.job_id = proc, job_id
        self.stop_reason: str | None = None  #: why it was told to stop (first reason wins)
        self._term_at: float | None = None  # time.monotonic() of the SIGTERM
        self._killed = False

    @property
    def pid(self) -> int:
        """The engine's pid, also its process group id."""
        return self.proc.pid

    def poll(self) -> int | None:
        """The exit code (negative: killed by that signal), or None while it runs."""
        return self.proc.poll()

    def terminate(self, reason: str) -> None:
        """The documented stop: SIGTERM to the engine's main process (or torchrun's agent,
        which forwards it to the ranks) and never to the whole group, so loader workers are
        not killed under a rank that is still finishing its step. Only the first call
        signals and sets :attr:`stop_reason`."""
        if self._term_at is None:
            log.info("job %s: SIGTERM to the engine (pid %d): %s", self.job_id, self.pid, reason)
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            self._term_at, self.stop_reason = time.monotonic(), reason

    def kill_if_overdue(self, *, now: float, grace_s: float, rc: int | None) -> None:
        """SIGKILL the process tree once, when it still runs (``rc`` None) more than
        ``grace_s`` seconds after the SIGTERM (``now`` from ``time.monotonic()``)."""
        if self._term_at is not None and not self._killed and now - self._term_at > grace_s \
                and rc is None:
            log.warning("job %s: grace period (%g s) over; SIGKILL to the engine's process tree",
                        self.job_id, grace_s)
            kill_tree(self.pid)
            self._killed = True

    def kill_group(self) -> None:
        """SIGKILL the engine's process group: loader workers or ranks left behind."""
        signal_group(self.pid, signal.SIGKILL)
