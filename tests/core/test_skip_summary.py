"""#28.12: a run that skips whole groups (no Chromium, no docker-compose, no coco128) ends
with one line naming each group and how to enable it."""

from __future__ import annotations

import importlib.util
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
        "test-only reference: `make setup` installs libreyolo==1.6.0"])
    assert {g: n for g, (n, _) in groups.items()} == {
        "browser": 2, "compose": 1, "coco128": 1, "gpu": 1, "slurm": 2, "reference": 1, "other": 1}
    assert "slurm-wlm" in groups["slurm"][1] and "make setup" in groups["reference"][1]
    assert "apt-get install chromium" in groups["browser"][1]


def test_the_closing_line_is_last(tmp_path):
    """A real pytest run of a compose test where docker-compose may be missing: when it
    skips, the last line of the output names the group."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/service/test_service_compose.py"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    last = out.stdout.strip().splitlines()[-1]
    if "1 skipped" in out.stdout:  # docker-compose is missing here
        assert last.startswith("skipped groups: compose (1 skipped: apt-get install"), out.stdout
    else:
        assert "passed" in last and "skipped groups" not in out.stdout


def test_the_closing_line_counts_the_slow_tests_left_out():
    line = _conftest().closing_line({"gpu": (2, "a GPU machine")}, 3)
    assert line == ("skipped groups: gpu (2 skipped: a GPU machine); slow (3 not selected, real training "
                    "runs: make test-slow runs them, make test-all runs everything; .ci/run runs make test "
                    "and make test-slow)")
    assert _conftest().closing_line({}, 0) is None


def test_make_tests_marker_expression_names_the_slow_tests_it_left_out():
    """A real run with `make test`'s `-m "not slow"`: of the three tests, the slow one is left
    out by the marker (counted) and one by `-k` (not slow: not counted)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                          "-k", "config or across", "tests/engine/test_finetune.py"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    last = out.stdout.strip().splitlines()[-1]
    assert "1 passed, 2 deselected" in out.stdout, out.stdout
    assert last.startswith("skipped groups: slow (1 not selected, real training runs: make test-slow"), out.stdout
