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
from libreyolo_core.profiler.window import plan_window, ways_out


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


def test_window_too_big_for_one_epoch_is_fitted_into_it(caplog):
    """#28.3: as a tune does, the window shrinks to one epoch (measured steps first), says
    so in one line and marks itself; only a window that cannot fit at all is an error."""
    with caplog.at_level("WARNING", logger="libreyolo_core.profiler.window"):
        prof = TrainingProfiler(cfg(profile_warmup=2, profile_steps=4), batch=4,
                                steps_available=4, images=16)
    assert (prof.window.warmup, prof.window.steps, prof.window.total) == (0, 4, 4)
    assert prof.fitted == ("the profile window was fitted into the first epoch: warmup 0 + 4 "
                           "measured steps (asked 2 + 4; one epoch of 16 images at batch 4 has "
                           "4 steps)")
    assert prof.meta["window_fitted"] == prof.fitted
    assert [r.getMessage() for r in caplog.records] == [
        f"profile: {prof.fitted}; a short window makes a less certain verdict"]
    # accumulation rounding counts too: whole windows of 4 micro-batches fit in 7 steps
    prof = TrainingProfiler(cfg(profile_warmup=2, profile_steps=4), batch=4, accumulate=4,
                            steps_available=7)
    assert (prof.window.warmup, prof.window.steps) == (0, 4)
    with pytest.raises(ProfileWindowError) as info:  # not even 2 measured steps fit
        TrainingProfiler(cfg(profile_warmup=2, profile_steps=4), batch=4, steps_available=1,
                         images=4)
    msg = str(info.value)
    assert "needs 6 steps (2 warm-up + 4 measured)" in msg
    assert "one epoch of 4 images at batch 4 has 1" in msg
    assert info.value.ways[0].startswith("fewer steps cannot help at batch 4")
    assert info.value.ways[1] == ("a smaller batch: --batch 2 (batch=2) gives 2 steps per epoch, "
                                  "where the window is fitted to 0 + 2 steps")
    assert info.value.ways[2] == ("a bigger dataset: at least 8 training images at batch 4 for a "
                                  "fitted window, 24 for the whole 6-step one (this one has 4)")


def test_a_fitted_window_flags_the_verdict():
    from libreyolo_core.profiler.confidence import assess

    steady = [10.0] * 8
    assert assess(steady, [1.0] * 8, None, "compute").reliable
    c = assess(steady, [1.0] * 8, None, "compute", fitted="the window was fitted")
    assert not c.reliable and c.flags == ("short_window",)
    assert "the window was fitted: a short window" in c.reasons[0]


def test_ways_out_keep_the_measured_steps_first():
    w = plan_window(5, 20)
    # 16 images at batch 4 (4 steps): fewer steps fit; no smaller batch reaches 25 steps
    ways = ways_out(needed=25, available=4, batch=4, images=16, window=w)
    assert ways[0].startswith("fewer steps: --warmup 0 --steps 4 ")
    assert ways[1] == ("a smaller batch: --batch 3 (batch=3) gives 5 steps per epoch, where "
                       "the window is fitted to 1 + 4 steps")
    # 22 steps: the 20 measured steps stay, the warm-up shrinks to 2
    assert ways_out(needed=25, available=22, batch=4, images=88, window=w)[0].startswith(
        "fewer steps: --warmup 2 --steps 20 ")
    # a smaller batch is named with the window the profiler fits into its epoch; with
    # nbs it accumulates more and the window grows with it (whole accumulation windows)
    w = plan_window(1, 2)
    assert ways_out(needed=3, available=1, batch=32, images=32, window=w)[1] == (
        "a smaller batch: --batch 16 (batch=16) gives 2 steps per epoch, where the window is "
        "fitted to 0 + 2 steps")
    assert ways_out(needed=2, available=1, batch=32, images=40, window=plan_window(0, 2))[1] == (
        "a smaller batch: --batch 20 (batch=20) gives 2 steps per epoch, enough for the "
        "2-step window")
    assert ways_out(needed=4, available=1, batch=32, images=32, window=plan_window(1, 2, 4),
                    nbs=128)[1] == ("a smaller batch alone cannot: even --batch 1 gives only 32 "
                                    "steps per epoch")


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


class SleepHook:
    """A loader whose batches on ``slow`` steps take ``delay`` seconds more: a noisy window,
    made deterministic (no machine load needed)."""

    def __init__(self, n: int, slow: set[int], delay: float):
        self.n, self.slow, self.delay = n, slow, delay

    def __iter__(self):
        for i in range(self.n):
            if i in self.slow:
                time.sleep(self.delay)
            yield torch.zeros(2, 3)

    def __len__(self):
        return self.n


def test_report_carries_spread_and_load_and_flags_a_noisy_window(tmp_path, capsys):
    # warmup 1, 8 measured (4 unsynced: steps 1-4); unsynced steps 2 and 4 wait 60 ms more
    prof = TrainingProfiler(cfg(profile_warmup=1, profile_steps=8), batch=2, steps_available=9)
    summary, _ = drive(prof, SleepHook(9, {2, 4}, 0.06), 0.01, tmp_path)
    p = json.loads((tmp_path / "profile.json").read_text())
    c = p["confidence"]
    assert c["steps"] == 4 and summary["confidence"] == c
    assert c["step_ms_cv"] > 0.2 and c["dataload_ms_cv"] > 0.2
    assert c["reliable"] is False and "noisy_steps" in c["flags"]
    assert any("step time varies" in r for r in c["reasons"]) and "--repeat" in c["advice"]
    load = p["load"]
    assert load["cpu_count"] >= 1 and load["wall_s"] > 0 and load["source"]
    for key in ("other_cpu_frac", "other_cpu_cores", "own_cpu_s", "loadavg_1m"):
        assert key in load
    assert load["own_cpu_s"] is not None and load["loadavg_1m"] is not None  # Linux
    assert {"reliable", "step_ms_cv", "dataload_ms_cv", "other_cpu_frac", "loadavg_1m"} <= set(
        p["metrics"])
    summary_json = json.loads((tmp_path / "profile_summary.json").read_text())
    assert summary_json["confidence"] == c and summary_json["load"] == load
    out = capsys.readouterr().out
    assert "spread: step time CV" in out and "!! verdict UNRELIABLE" in out
    assert "--repeat 3" in out


def test_steady_window_has_a_low_spread(tmp_path):
    prof = TrainingProfiler(cfg(profile_warmup=1, profile_steps=8), batch=2, steps_available=9)
    drive(prof, SleepHook(9, set(), 0.0), 0.03, tmp_path)
    c = json.loads((tmp_path / "profile.json").read_text())["confidence"]
    assert c["step_ms_cv"] is not None and "noisy_steps" not in c["flags"]
    assert "few_steps" not in c["flags"]


def test_assess_rules():
    from libreyolo_core.profiler.confidence import assess
    from libreyolo_core.profiler.load import WindowLoad

    def load(frac):
        return WindowLoad(wall_s=2.0, cpu_count=4, loadavg_1m_start=1.0, loadavg_1m=3.0,
                          machine_busy_cpu_s=6.0, own_cpu_s=2.0, other_cpu_s=8 * frac,
                          other_cpu_cores=4 * frac, other_cpu_frac=frac, source="test")

    steady = [100.0, 101.0, 99.0, 100.0]
    c = assess(steady, [5.0, 5.0, 6.0, 4.0], load(0.05), "compute")
    assert c.reliable and not c.reasons and c.advice is None
    c = assess(steady, [5.0, 5.0, 6.0, 4.0], load(0.5), "compute")  # another process: 2 cores
    assert not c.reliable and c.flags == ("loaded",) and "50% of the machine's CPU" in c.reasons[0]
    c = assess(steady, [10.0, 30.0, 15.0, 25.0], None, "dataloader")  # 20% ± 4.6%: close call
    assert c.flags == ("close_call",) and c.other_cpu_frac is None
    c = assess(steady[:2], [5.0, 5.0], None, "compute")
    assert c.flags == ("few_steps",) and "more --steps" in c.advice


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
