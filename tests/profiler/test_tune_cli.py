"""``libreyolo profile tune`` for real on the CPU: one tune to the end, one stopped by SIGTERM."""

from __future__ import annotations

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


def test_tune_cli_writes_the_table_and_an_answer(small_yaml, tmp_path, capsys):
    project = tmp_path / "tune"
    rc = main(["tune", str(small_yaml), *ARGS, "--repeat", "2", "--max-candidates", "2",
               "--set", "mosaic=1.0", "--project", str(project), "--json"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert res == json.loads((project / "tune.json").read_text())
    assert res["schema"] == "libreyolo.tune/v1" and res["status"] == "complete"
    assert res["device"] == "cpu" and res["verdict"] in ("dataloader", "compute")
    base = res["baseline"]
    assert base["n"] == 2 and len(base["img_per_s_trials"]) == 2 and base["step_ms"] > 0
    assert base["epoch_s"] == pytest.approx(6 * base["step_ms"] / 1e3, rel=1e-3)  # 24 images / 4
    assert 1 <= len(res["candidates"]) <= 2
    for row in res["candidates"]:  # measured, or skipped with the reason
        assert row["skipped"] or (row["n"] == 2 and row["significant"] in (True, False))
        assert row["note"]
        assert not any(k in row["params"] for k in ("amp", "amp_dtype", "cuda_graph"))  # CPU
    assert res["answer"] and res["recommended_params"]["imgsz"] == 64
    assert res["recommended_params"].get("mosaic") == "1.0"
    if res["recommended"] is None:
        assert res["answer"].startswith("no significant lever on this device")
        assert res["expected_epoch_s"] == base["epoch_s"]
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
    assert not list(project.glob("trials/*/weights/last.pt"))  # a stopped trial leaves none
