"""``make gpu-check`` (bench/gpu_check.py): a clean skip without a GPU, and its list of
CUDA-only tests kept complete."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_gpu_is_a_clean_skip(tmp_path):
    out = tmp_path / "report.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True,
                          text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("no GPU: skipped") and "Traceback" not in proc.stderr
    report = json.loads(out.read_text())
    assert report["status"] == "skipped" and report["reason"] == "no GPU"
    assert report["checks"] == {}


def test_every_cuda_only_test_file_is_run_by_gpu_check():
    listed = set(_module().GPU_TESTS)
    cuda_only = re.compile(r"mark\.gpu\b|reason=\"[^\"]*needs (a )?CUDA")
    found = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
             if p.name != "test_gpu_check.py" and cuda_only.search(p.read_text(encoding="utf-8"))}
    assert found - listed == set(), "CUDA-only tests that make gpu-check would not run"
    assert all((ROOT / p).is_file() for p in listed)


def test_make_target_runs_the_script():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    target = re.search(r"^gpu-check:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert target and "bench/gpu_check.py" in target.group(1)
    assert re.search(r"^\.PHONY:.*\bgpu-check\b", makefile, re.M)
