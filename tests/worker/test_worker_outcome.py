"""The engine's exit -> the job's status and error (worker.outcome), with no database."""

from __future__ import annotations

import json

import pytest

from libreyolo_core.records.events import RunEndEvent
from worker.outcome import (
    CANCEL,
    LEASE_LOST,
    TIME_BUDGET,
    WORKER_SHUTDOWN,
    EngineError,
    Outcome,
    after_exit,
    exit_outcome,
    read_engine_error,
)

TAIL = ["epoch 1/3", "Traceback ..."]


def outcome(rc, stop_reason=None, run_end=None, engine_error=None, time_budget_s=None,
            log_tail=None):
    run_end = RunEndEvent.model_validate(run_end) if run_end is not None else None
    return exit_outcome(rc, stop_reason=stop_reason, run_end=run_end, engine_error=engine_error,
                        log_tail=TAIL if log_tail is None else log_tail,
                        time_budget_s=time_budget_s)


@pytest.mark.parametrize(("lost", "stop_reason", "action"), [
    (True, None, "lost"),
    (True, LEASE_LOST, "lost"),
    (True, CANCEL, "lost"),              # a cancel that raced the reaper: nothing to write
    (True, WORKER_SHUTDOWN, "lost"),     # no hand-back of a job this worker no longer holds
    (False, WORKER_SHUTDOWN, "hand back"),
    (False, None, "finish"),
    (False, CANCEL, "finish"),
    (False, TIME_BUDGET, "finish"),
])
def test_after_exit(lost, stop_reason, action):
    assert after_exit(lost=lost, stop_reason=stop_reason) == action


@pytest.mark.parametrize("run_end", [None, {"status": "completed"}, {"status": "early_stopped"}])
def test_exit_zero_succeeds(run_end):
    assert outcome(0, run_end=run_end) == Outcome("succeeded", None, {"exit_code": 0})


@pytest.mark.parametrize("end_status", ["failed", "interrupted"])
def test_exit_zero_after_a_failed_or_interrupted_run_end_fails(end_status):
    out = outcome(0, run_end={"status": end_status})
    assert out.status == "failed"
    assert out.error == {"reason": "exit code 0", "exit_code": 0, "log_tail": TAIL}
    assert out.event == {"reason": "exit code 0", "exit_code": 0}


@pytest.mark.parametrize(("rc", "reason"), [
    (1, "runtime error"), (2, "bad config"), (3, "data error"),
    (4, "model or checkpoint error"),
    (143, "terminated (SIGTERM)"), (-15, "terminated (SIGTERM)"),
    (-9, "killed (SIGKILL)"), (137, "killed (SIGKILL)"),
    (7, "exit code 7"), (-11, "exit code -11"),
])
def test_a_nonzero_exit_fails_with_its_reason(rc, reason):
    out = outcome(rc, run_end={"status": "completed"})
    # a SIGKILL the worker did not send: the host's OOM killer, an infrastructure end
    end = ("infrastructure", "killed by SIGKILL that the worker did not send (the host's OOM "
           "killer, most likely)") if rc in (-9, 137) else ("job", reason)
    assert out == Outcome("failed", {"reason": reason, "exit_code": rc, "log_tail": TAIL},
                          {"reason": reason, "exit_code": rc}, *end)


@pytest.mark.parametrize(("error", "tail", "want"), [
    (EngineError(5, "hang: rank 1: no step finished for 31.0 s", 1), [], "infrastructure"),
    (EngineError(1, "OSError: [Errno 28] No space left on device", 0), [], "infrastructure"),
    (None, ["RuntimeError: write failed", "OSError: No space left on device"], "infrastructure"),
    (EngineError(1, "NonFiniteLossError: 10 non-finite losses in a row", 0), [], "job"),
    (EngineError(2, "ConfigError: batch must be positive", 0), [], "job"),
    (EngineError(3, "DatasetError: no labels", 0), [], "job"),
])
def test_every_failure_is_classified(error, tail, want):
    """A hang, a full disk and an OOM kill are the infrastructure's fault (re-queued on
    their own budget); a config, data or code error and a non-finite loss are the job's."""
    out = outcome(1, engine_error=error, log_tail=tail)
    assert out.status == "failed" and out.end_class == want, out
    assert out.why
    if error is not None and error.exit_code == 5:
        assert out.why.startswith("hang: rank 1")


@pytest.mark.parametrize("stop_reason", [CANCEL, WORKER_SHUTDOWN])  # shutdown: hand-back failed
@pytest.mark.parametrize("rc", [0, 143, -15, -9, 1])
def test_a_cancel_or_shutdown_is_cancelled_whatever_the_exit(stop_reason, rc):
    out = outcome(rc, stop_reason=stop_reason, run_end={"status": "interrupted"},
                  engine_error=EngineError(1, "boom"))
    assert out == Outcome("cancelled", None, {"reason": "cancelled by request", "exit_code": rc},
                          "user", "cancelled by request")


@pytest.mark.parametrize("rc", [143, -9, 0])
def test_the_time_budget_fails_the_job(rc):
    out = outcome(rc, stop_reason=TIME_BUDGET, time_budget_s=2.5)
    reason = "time budget of 2.5 s exceeded"
    assert out == Outcome("failed", {"reason": reason, "exit_code": rc, "log_tail": TAIL},
                          {"reason": reason, "exit_code": rc}, "job", reason)


def test_run_end_error_is_kept():
    out = outcome(1, run_end={"status": "failed", "error": "CUDA out of memory"})
    assert out.error["engine_error"] == "CUDA out of memory"
    assert "launcher_exit_code" not in out.error


def test_engine_error_file_names_the_code_torchrun_hid():
    out = outcome(1, run_end={"status": "failed", "error": "from run_end"},
                  engine_error=EngineError(exit_code=3, error="no labels found", rank=2))
    assert out.error == {"reason": "data error", "exit_code": 3, "launcher_exit_code": 1,
                         "log_tail": TAIL, "engine_error": "no labels found", "failed_rank": 2}
    assert out.event == {"reason": "data error", "exit_code": 3}


def test_engine_error_file_with_the_same_code_adds_its_line_and_rank():
    out = outcome(2, engine_error=EngineError(exit_code=2, error="epochs: must be > 0"))
    assert out.error == {"reason": "bad config", "exit_code": 2, "log_tail": TAIL,
                         "engine_error": "epochs: must be > 0", "failed_rank": 0}


def test_read_engine_error(tmp_path):
    path = tmp_path / "engine_error.json"
    assert read_engine_error(path) is None  # missing
    for bad in ("not json", "[1, 2]", json.dumps({"error": "no code"}),
                json.dumps({"exit_code": "x", "error": "e"})):
        path.write_text(bad)
        assert read_engine_error(path) is None, bad
    path.write_text(json.dumps({"exit_code": 4, "error": "bad checkpoint", "rank": 1}))
    assert read_engine_error(path) == EngineError(4, "bad checkpoint", 1)
    path.write_text(json.dumps({"exit_code": "3", "error": "data"}))
    assert read_engine_error(path) == EngineError(3, "data", 0)
