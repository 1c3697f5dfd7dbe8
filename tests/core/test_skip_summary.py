"""#28.12: a run that skips whole groups (no Chromium, no docker-compose, no coco128) ends
with one line naming each group and how to enable it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _conftest():
    spec = importlib.util.spec_from_file_location("root_conftest", REPO / "tests" / "conftest.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_skip_reasons_are_grouped_with_how_to_enable_them():
    groups = _conftest().skip_groups([
        "/usr/bin/chromium not installed (apt-get install chromium)",
        "/usr/bin/chromium not installed (apt-get install chromium)",
        "docker-compose not installed (apt-get install docker-compose)",
        "coco128 not found at /nowhere", "needs a CUDA device", "something else",
        "Slurm is not installed (no munged; apt-get install slurm-wlm munge)",
        "the private Slurm did not start: slurmd n2 did not register",
        "test-only reference: `make setup` installs libreyolo==1.6.0", "json dumps differ here"])
    assert {g: n for g, (n, _) in groups.items()} == {
        "browser": 2, "compose": 1, "coco128": 1, "gpu": 1, "slurm": 2, "reference": 1, "other": 2}
    assert "slurm-wlm" in groups["slurm"][1] and "make setup" in groups["reference"][1]
    assert "apt-get install chromium" in groups["browser"][1]


def _pytest(*args: str) -> list[str]:
    """The output lines of a real pytest run, free of the caller's PYTEST_ADDOPTS and colours."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--color=no", *args],
                         cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    return out.stdout.strip().splitlines()


def test_the_closing_line_is_last(tmp_path):
    """A real pytest run of a compose test where docker-compose may be missing: when it
    skips, the last line of the output names the group."""
    lines = _pytest("tests/service/test_service_compose.py")
    if "1 skipped" in lines[-2]:  # docker-compose is missing here
        assert lines[-1].startswith("skipped groups: compose (1 skipped: apt-get install"), lines
    else:
        assert "passed" in lines[-1] and not any("skipped groups" in line for line in lines), lines


def test_the_closing_line_counts_the_slow_tests_left_out():
    line = _conftest().closing_line({"gpu": (2, "a GPU machine")}, 3)
    assert line == ("skipped groups: gpu (2 skipped: a GPU machine); not selected: slow (3 tests marked slow: "
                    "real training, DDP, Slurm, worker recoveries; make test-slow runs them, make test-all runs "
                    "everything; .ci/run runs make test and make test-slow)")
    assert _conftest().closing_line({}, 3).startswith("not selected: slow (3 tests marked slow")
    assert _conftest().closing_line({}, 0) is None


def test_no_slow_counts_only_the_slow_tests_it_left_out():
    """`make test`'s `--no-slow` on test_finetune.py (one slow test of three): it counts the
    slow one; a slow test that `-k` or `-m` already left out is not counted, and a run
    without `--no-slow` names no slow tests."""
    lines = _pytest("--no-slow", "-k", "config or across", "tests/engine/test_finetune.py")
    assert "1 passed, 2 deselected" in lines[-2], lines
    assert lines[-1].startswith("not selected: slow (1 test marked slow: real training, DDP, Slurm, worker "
                                "recoveries; make test-slow"), lines
    lines = _pytest("--no-slow", "-k", "config", "tests/engine/test_finetune.py")
    assert "1 passed, 2 deselected" in lines[-1], lines  # the slow test went to -k: nothing to name
    lines = _pytest("-m", "slow", "-k", "nothing_matches_this", "tests/engine/test_finetune.py")
    assert "3 deselected" in lines[-1], lines
