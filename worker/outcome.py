"""From the engine's exit to the job's final status and error (pure functions; and the
reader of the engine's error file).

:func:`after_exit` says what the runner does once the engine has exited (report the lease
lost, hand the job back, or finish it); :func:`exit_outcome` gives a finish its status,
error and event from the exit code, why the runner stopped the engine (if it did), the
engine's ``run_end`` event and its error file (:func:`read_engine_error`).

Exit codes: the engine's own (``EXIT_REASONS``: 1 runtime error, 2 bad config, 3 data
error, 4 model or checkpoint error), 143 after a SIGTERM it handled, a negative code for
the signal that killed it (``subprocess`` convention), 137 for a SIGKILL seen through a
shell. torchrun's agent exits 1 whatever its rank's code was, so the rank's code and error
line come from the file it wrote (``$LIBREYOLO_ERROR_FILE``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from libreyolo_core.records.events import RunEndEvent
from service.ends import INFRASTRUCTURE, JOB, USER
from service.lifecycle import JobStatus

__all__ = ["CANCEL", "DISK_FULL", "ENGINE_ERROR_FILE", "EXIT_FENCED", "EXIT_HANG",
           "EXIT_REASONS", "LEASE_LOST", "TIME_BUDGET", "WORKER_SHUTDOWN", "EngineError",
           "Outcome", "after_exit", "classify", "exit_outcome", "exit_reason",
           "read_engine_error"]

EXIT_REASONS = {
    1: "runtime error", 2: "bad config", 3: "data error", 4: "model or checkpoint error",
    5: "hang (no step finished; the watchdog ended the engine)",
    6: "fenced (a newer attempt of the job took over)",
    143: "terminated (SIGTERM)",
    -15: "terminated (SIGTERM)", -9: "killed (SIGKILL)", 137: "killed (SIGKILL)",
}
#: What the engine writes when it fails (``$LIBREYOLO_ERROR_FILE``): its exit code and
#: error line, which a torchrun launcher (always exit 1) would hide.
ENGINE_ERROR_FILE = "engine_error.json"

# Why the runner stopped the engine (``EngineProcess.stop_reason``).
CANCEL = "cancel"                    #: the job's owner asked (status ``cancelling``)
WORKER_SHUTDOWN = "worker shutdown"  #: the job is handed back to the queue
TIME_BUDGET = "time budget"          #: the job's ``time_budget_s`` ran out
LEASE_LOST = "lease lost"            #: the reaper (or another worker) took the job


@dataclass(frozen=True)
class EngineError:
    """The engine's error file: its exit code, error line and the rank that failed."""

    exit_code: int
    error: str
    rank: int = 0


#: the engine's exit code after its hang watchdog fired (libreyolo_core.engine.watchdog)
EXIT_HANG = 5
#: the engine's exit code when its attempt was fenced off (a newer attempt took over)
EXIT_FENCED = 6
#: what a full disk looks like in an error line or the log
DISK_FULL = ("No space left on device", "Errno 28", "ENOSPC")


@dataclass(frozen=True)
class Outcome:
    """How a job ends: ``status`` (``succeeded``, ``failed`` or ``cancelled``), the
    ``error`` stored on the row (None unless failed), the status event's payload, and the
    end's class (:mod:`service.ends`: ``infrastructure``, ``job``, ``user``; None for a
    success) with why. A ``failed`` outcome of class ``infrastructure`` is re-queued by the
    runner (:func:`service.job_store.requeue_infra`) instead of finished."""

    status: JobStatus
    error: dict[str, Any] | None
    event: dict[str, Any]
    end_class: str | None = None
    why: str | None = None


def exit_reason(code: int) -> str:
    """A readable reason for exit code ``code`` (``"exit code 7"`` for an unknown one)."""
    return EXIT_REASONS.get(code, f"exit code {code}")


def after_exit(*, lost: bool, stop_reason: str | None) -> Literal["lost", "hand back", "finish"]:
    """What the runner does once the engine has exited.

    Args:
        lost: this worker no longer holds the job's lease (a heartbeat or an event write
            found it taken); nothing more may be written for the job.
        stop_reason: why the runner stopped the engine, or None when it exited by itself.

    Returns:
        ``"lost"``; ``"hand back"`` after a worker shutdown (the job is re-queued to resume
        from ``last.pt``; if that fails, the runner finishes it as :func:`exit_outcome`
        says, cancelled); otherwise ``"finish"``.
    """
    if lost:
        return "lost"
    if stop_reason == WORKER_SHUTDOWN:
        return "hand back"
    return "finish"


def exit_outcome(rc: int, *, stop_reason: str | None, run_end: RunEndEvent | None,
                 engine_error: EngineError | None, log_tail: list[str],
                 time_budget_s: float | None) -> Outcome:
    """The final status, error and event of a job whose engine exited with ``rc``.

    Args:
        rc: the engine's (or torchrun's) exit code; negative: killed by signal ``-rc``.
        stop_reason: why the runner stopped the engine (:data:`CANCEL`,
            :data:`WORKER_SHUTDOWN`, :data:`TIME_BUDGET`), or None.
        run_end: the engine's ``run_end`` event (its ``status``, maybe an ``error``).
        engine_error: the engine's error file, if it left one.
        log_tail: the last lines of ``train.log``, kept in a failure's error.
        time_budget_s: the job's wall-clock budget, seconds (named when it ran out).

    Returns:
        A cancel or worker shutdown: ``cancelled`` whatever the code. The time budget:
        ``failed``. Exit 0 with a ``run_end`` not ``failed``/``interrupted``:
        ``succeeded``. Anything else: ``failed`` with ``reason`` from the exit code, or
        from the engine's own code when its error file says another one than ``rc``
        (then ``launcher_exit_code`` is ``rc``), plus ``engine_error`` and ``failed_rank``.
    """
    if stop_reason in (CANCEL, WORKER_SHUTDOWN):
        return Outcome(JobStatus.CANCELLED, None, {"reason": "cancelled by request", "exit_code": rc},
                       USER, "cancelled by request")
    if stop_reason == TIME_BUDGET:
        reason = f"time budget of {time_budget_s:g} s exceeded"
        return Outcome(JobStatus.FAILED, {"reason": reason, "exit_code": rc, "log_tail": log_tail},
                       {"reason": reason, "exit_code": rc}, JOB, reason)
    if rc == 0 and (run_end.status if run_end is not None else None) not in ("failed", "interrupted"):
        return Outcome(JobStatus.SUCCEEDED, None, {"exit_code": 0})
    error: dict[str, Any] = {"reason": exit_reason(rc), "exit_code": rc, "log_tail": log_tail}
    if run_end is not None and run_end.error:
        error["engine_error"] = run_end.error
    if engine_error is not None:
        if engine_error.exit_code != rc:  # torchrun's 1 hides the engine's code
            error.update(reason=exit_reason(engine_error.exit_code),
                         exit_code=engine_error.exit_code, launcher_exit_code=rc)
        error["engine_error"] = engine_error.error
        error["failed_rank"] = engine_error.rank
    end_class, why = classify(error, stop_reason=stop_reason, log_tail=log_tail)
    return Outcome(JobStatus.FAILED, error, {"reason": error["reason"], "exit_code": error["exit_code"]},
                   end_class, why)


def classify(error: dict[str, Any], *, stop_reason: str | None,
             log_tail: list[str]) -> tuple[str, str]:
    """The class (:mod:`service.ends`) and why of a failed engine's end, from its error
    (``exit_code``: the engine's own when it wrote its error file; ``engine_error``).

    ``infrastructure``: a hang (exit 5, the watchdog), a full disk ("No space left on
    device" in the error or the log's last lines), a SIGKILL the worker did not send (the
    host's OOM killer, most likely). ``job``: everything else (a config, data, model or
    code error, a non-finite loss, a crash).
    """
    code, text = error.get("exit_code"), str(error.get("engine_error") or "")
    if code == EXIT_HANG:
        return INFRASTRUCTURE, text or "hang: no step finished"
    if any(mark in text for mark in DISK_FULL) or any(
            mark in line for line in log_tail[-20:] for mark in DISK_FULL):
        return INFRASTRUCTURE, f"disk full ({text or 'No space left on device'})"
    if code in (-9, 137) and stop_reason is None:
        return INFRASTRUCTURE, ("killed by SIGKILL that the worker did not send (the host's "
                                "OOM killer, most likely)")
    why = str(error.get("reason") or "failed")
    return JOB, f"{why}: {text}" if text else why


def read_engine_error(path: Path) -> EngineError | None:
    """The engine's error record at ``path`` (see :data:`ENGINE_ERROR_FILE`); None when
    it is missing or malformed."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        return EngineError(exit_code=int(record["exit_code"]), error=str(record["error"]),
                           rank=int(record.get("rank", 0)))
    except (OSError, ValueError, KeyError, TypeError):
        return None
