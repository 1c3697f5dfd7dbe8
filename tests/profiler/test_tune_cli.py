"""``libreyolo profile tune`` for real on the CPU: one tune to the end, one stopped by SIGTERM."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from libreyolo_core.profiler.cli import main

ARGS = ["--imgsz", "64", "--batch", "4", "--workers", "0", "--device", "cpu", "--warmup", "1",
        "--steps", "2"]


@pytest.mark.slow
def test_tune_cli_on_a_loader_bound_run(coco128_dir, tmp_path, capsys):
    """coco128 at imgsz 64, batch 16, no loader workers, mosaic and mixup: each sample
    decodes 8 full-size JPEGs for a tiny network, so the loader levers are tried
    (``cache_recent_mb=0``: by default each image would be decoded once, coco128 at 64 px
    fits the recently-decoded cache, and the run is no longer loader-bound).

    Batch 16 gives 8 steps an epoch, room for a 1 + 6 window: 3 unsynced steps a trial
    (batch 32 gave 1 + 3 and one unsynced step, which a single stall on a busy CI machine
    turned into a compute verdict)."""
    project = tmp_path / "tune"
    rc = main(["tune", str(coco128_dir / "coco128.yaml"), "--imgsz", "64", "--batch", "16",
               "--workers", "0", "--device", "cpu", "--warmup", "1", "--steps", "6",
               "--repeat", "2", "--max-candidates", "2", "--set", "mosaic=1.0",
               "--set", "mixup=1.0", "--set", "cache_recent_mb=0", "--project", str(project), "--json"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert res == json.loads((project / "tune.json").read_text())
    assert res["schema"] == "libreyolo.tune/v1" and res["status"] == "complete"
    base = res["baseline"]
    why = json.loads((project / base["profile"]).read_text())["bound_why"]
    # a trial stalled by another process may read compute; the loader's lever is named anyway
    assert res["device"] == "cpu" and "dataloader" in res["verdicts"], why
    assert res["verdict"] in ("dataloader", "mixed"), why
    assert base["n"] == 2 and len(base["img_per_s_trials"]) == 2 and base["step_ms"] > 0
    assert base["epoch_s"] == pytest.approx(8 * base["step_ms"] / 1e3, rel=1e-3)  # 128 / 16
    assert [r["label"] for r in res["candidates"]] == ["workers 0 -> 2", "cache=ram"]
    for row in res["candidates"]:
        assert row["n"] == 2 and row["significant"] in (True, False) and row["note"]
    assert res["answer"] and res["recommended_params"]["imgsz"] == 64
    assert res["recommended_params"]["mixup"] == "1.0"
    if res["recommended"] is None:  # a loaded machine may leave it undecided, never noise
        assert res["answer"].startswith("no significant lever on this device")
        assert res["expected_epoch_s"] == base["epoch_s"]
    else:
        assert set(res["recommended"]["params"]) <= {"workers", "cache"}
        assert res["recommended"]["significant"] and res["recommended"]["recommendable"]
    assert any("cap of 2" in n for n in res["notes"])  # mixup=0 and batch 32 left out
    for rel in base["trials"]:
        assert (project / rel).is_file()
    assert (project / "trials" / "baseline" / "profile_repeat.json").is_file()


def test_sigterm_stops_a_tune_and_keeps_what_was_measured(small_yaml, tmp_path):
    project = tmp_path / "tune"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "libreyolo_core.cli", "profile", "tune", str(small_yaml), *ARGS,
         "--repeat", "4", "--project", str(project)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    first = project / "trials" / "baseline_1" / "trial.json"
    deadline = time.monotonic() + 180
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first.exists(), "the first trial never finished"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "tune interrupted" in err and "Traceback" not in err
    res = json.loads((project / "tune.json").read_text())
    assert res["status"] == "cancelled" and "cancelled" in res["answer"]
    assert res["trials_run"] >= 1 and res["recommended"] is None
    assert res["baseline"]["img_per_s"] > 0 and res["baseline"]["n"] >= 1  # numbers kept
    assert not list(project.glob("trials/*/weights/last.pt"))  # a stopped trial leaves none


def test_the_time_budget_stops_a_tune_between_trials(small_yaml, tmp_path):
    from libreyolo_core.profiler.tune import TuneOptions, run_tune

    res = run_tune(small_yaml, "yolo9-t", run_dir=tmp_path / "t",
                   base={"imgsz": 64, "batch": 4, "workers": 0, "device": "cpu"},
                   options=TuneOptions(repeat=3, warmup=1, steps=2, budget_s=0.5),
                   stdout=io.StringIO())
    # the set-up (imports, the dataset) may use up the budget already; the second trial at
    # the latest would end past it
    assert res["status"] == "budget" and res["trials_run"] <= 1
    if res["trials_run"] == 0:
        assert res["answer"].startswith("no answer: the baseline was not measured (time budget)")
    else:  # the one baseline trial measured is kept, and nothing is recommended from it
        assert res["answer"].startswith("no answer yet: stopped (budget) before any candidate")
        assert res["baseline"]["img_per_s"] > 0 and res["recommended"] is None
    assert any("time budget of 0.5 s" in n for n in res["notes"])
    assert json.loads((tmp_path / "t" / "tune.json").read_text())["status"] == "budget"
