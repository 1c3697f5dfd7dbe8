"""The window and the hooks, driven by constructed loops (no trainer): verdicts from real timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from libreyolo_core.profiler import ProfileWindowError, TrainingProfiler
from libreyolo_core.profiler.window import plan_window


def cfg(**kw):
    base = dict(profile_warmup=1, profile_steps=4, profile_trace=False, profile_open=False)
    return SimpleNamespace(**{**base, **kw})


class SleepyLoader:
    """``n`` batches, each taking ``delay`` seconds to produce."""

    def __init__(self, n: int, delay: float):
        self.n, self.delay = n, delay

    def __iter__(self):
        for i in range(self.n):
            time.sleep(self.delay)
            yield torch.full((2, 3), float(i))

    def __len__(self):
        return self.n


def drive(prof: TrainingProfiler, loader, compute_s: float, run_dir):
    """A trainer-shaped loop; returns (summary, batches seen in total)."""
    summary, seen = None, 0
    w = torch.randn(8, 8, requires_grad=True)
    for batch in prof.wrap_loader(loader):
        seen += 1
        if summary is not None:
            continue
        with prof.phase("to_device"):
            x = batch.float().sum() * torch.ones(8, 8)
        with prof.phase("forward"):
            time.sleep(compute_s)
            loss = (x @ w).sum()
        with prof.phase("backward"):
            loss.backward()
        with prof.phase("optimizer"):
            w.grad = None
        if prof.step_end():
            summary = prof.finish(run_dir)
    return summary, seen


def test_plan_window_clamps_and_rounds():
    w = plan_window(5, 20)
    assert (w.warmup, w.steps, w.half, w.total) == (5, 20, 10, 25)
    assert plan_window(0, 1).steps == 2
    w = plan_window(5, 20, accumulate=4)
    assert (w.warmup, w.steps, w.half) == (8, 20, 10)
    w = plan_window(2, 3, accumulate=4)
    assert (w.warmup, w.steps) == (4, 4)


def test_window_too_big_for_the_run():
    with pytest.raises(ProfileWindowError) as info:
        TrainingProfiler(cfg(profile_warmup=2, profile_steps=4), batch=4, steps_available=4)
    msg = str(info.value)
    assert "needs 6 steps" in msg and "only has 4" in msg
    assert "bigger dataset" in msg and "fewer --steps" in msg and "smaller --batch" in msg
    # accumulation rounding counts too: warmup 2 -> 4, steps 4 -> 4 with accumulate 4
    with pytest.raises(ProfileWindowError):
        TrainingProfiler(
            cfg(profile_warmup=2, profile_steps=4), batch=4, accumulate=4, steps_available=7
        )


def test_sleeping_loader_gives_dataloader(tmp_path):
    prof = TrainingProfiler(
        cfg(profile_trace=True),
        batch=2,
        steps_available=10,
        meta={"model": "toy", "device": "cpu", "batch": 2},
    )
    summary, seen = drive(prof, SleepyLoader(8, 0.04), 0.005, tmp_path)
    assert seen == 8  # the loader keeps going after the window, unwrapped
    assert summary["verdict"] == "dataloader" and summary["dataload_frac"] > 0.5
    assert "not applicable" in summary["bound_why"]
    assert set(summary["artifacts"]) == {
        "timeline.html",
        "profile.json",
        "profile_summary.json",
        "profile_trace.json.gz",
    }
    for name in summary["artifacts"]:
        assert (tmp_path / name).is_file()
    p = json.loads((tmp_path / "profile.json").read_text())
    kinds = [s["kind"] for s in p["steps"]]
    assert kinds == ["warmup", "unsynced", "unsynced", "synced", "synced"]
    assert p["window"] == {**p["window"], "warmup": 1, "real_steps": 2, "synced_steps": 2}
    assert p["ops"] and p["gpu_util"] is None and p["utilisation"].startswith("not applicable")
    assert {r["phase"] for r in p["phases"]} >= {
        "dataload",
        "to_device",
        "forward",
        "backward",
        "optimizer",
    }
    assert prof.done and prof.phase("forward") is prof.phase("backward")  # shared null context


def test_busy_step_gives_compute(tmp_path):
    prof = TrainingProfiler(cfg(), batch=2, steps_available=10)
    summary, _ = drive(prof, SleepyLoader(6, 0.0), 0.05, tmp_path)
    assert summary["verdict"] == "compute" and summary["dataload_frac"] < 0.2
    assert "profile_trace.json.gz" not in summary["artifacts"]
    p = json.loads((tmp_path / "profile.json").read_text())
    assert p["composition_ms"]["forward"] >= 45
    assert p["img_per_s"] == pytest.approx(2 / (p["step_ms"] / 1e3), rel=1e-2)


def test_trace_failure_never_breaks_training(tmp_path, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("kineto is unhappy")

    monkeypatch.setattr(torch.profiler, "profile", broken)
    prof = TrainingProfiler(cfg(profile_trace=True), batch=2, steps_available=10)
    summary, seen = drive(prof, SleepyLoader(6, 0.0), 0.001, tmp_path)
    assert seen == 6 and summary["verdict"] in ("compute", "dataloader")
    p = json.loads((tmp_path / "profile.json").read_text())
    assert p["trace"] is None and "kineto is unhappy" in p["trace_error"]
    assert any("no trace" in n for n in p["notes"])


def test_window_spans_loader_restarts(tmp_path):
    prof = TrainingProfiler(cfg(profile_warmup=2, profile_steps=4), batch=2, steps_available=6)
    summary = None
    for _epoch in range(3):
        s, _ = drive(prof, SleepyLoader(2, 0.0), 0.001, tmp_path)
        summary = summary or s
    assert summary is not None and len(prof.records) == 6


def test_step_end_is_true_once_and_finish_is_idempotent(tmp_path):
    prof = TrainingProfiler(cfg(profile_warmup=0, profile_steps=2), batch=2, steps_available=2)
    results = []
    for _ in prof.wrap_loader(SleepyLoader(4, 0.0)):
        results.append(prof.step_end())
    assert results == [False, True, False, False]
    assert prof.finish(tmp_path) is prof.finish(tmp_path)


def test_cpu_trace_prints_no_gpu_probe_or_usdt_lines(tmp_path):
    code = (
        "import os, torch\n"
        "from torch.profiler import ProfilerActivity, profile\n"
        "from libreyolo_core.profiler.window import quiet_kineto\n"
        "quiet_kineto(cuda=False)\n"
        "with profile(activities=[ProfilerActivity.CPU]):\n"
        "    x = torch.randn(32, 32); (x @ x).sum()\n"
        "print('traced')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "traced", out.stderr
    assert "gpuGetDeviceCount" not in out.stderr and "USDT:" not in out.stderr, out.stderr
