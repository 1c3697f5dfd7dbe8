"""Shared fixtures: the synthetic sample dataset and a writable copy of coco128."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
COCO128 = Path(os.environ.get("COCO128", REPO.parent / "shared" / "datasets" / "coco128"))
#: the test-only reference ``libreyolo==1.6.0``, installed by ``make setup`` beside the venv
#: (``pip install --target``) so that its ``libreyolo`` command never replaces ours.
REFERENCE = Path(os.environ.get("LIBREYOLO_REFERENCE", REPO / ".venv" / "reference"))


def pytest_configure(config) -> None:
    """Make the reference library importable by the equivalence tests (appended last, so
    nothing of ours is ever shadowed by it)."""
    if REFERENCE.is_dir() and str(REFERENCE) not in sys.path:
        sys.path.append(str(REFERENCE))


@pytest.fixture(scope="session")
def sample_yaml(tmp_path_factory) -> Path:
    """A small synthetic dataset (shapes on textures), generated once per session."""
    from libreyolo_core.data.sample import generate_sample_dataset

    return generate_sample_dataset(tmp_path_factory.mktemp("sample"), n_train=16, n_val=8, imgsz=160, seed=0)


@pytest.fixture(scope="session")
def coco128_dir(tmp_path_factory) -> Path:
    """A writable copy of coco128 (the shared copy is read-only)."""
    if not (COCO128 / "coco128.yaml").is_file():
        pytest.skip(f"coco128 not found at {COCO128}")
    dst = tmp_path_factory.mktemp("coco") / "coco128"
    shutil.copytree(COCO128, dst)
    return dst


#: skip-reason keyword -> (group, how to enable it); the first match names the group.
SKIP_GROUPS = (
    (("chromium", "playwright"), "browser",
     "apt-get install chromium (as .ci/run does) and the dev extra (playwright)"),
    (("docker-compose",), "compose", "apt-get install --no-install-recommends docker-compose"),
    (("coco128",), "coco128", f"put coco128 at {COCO128} or set COCO128=/path/to/coco128"),
    (("slurm", "munge"), "slurm",
     "apt-get install slurm-wlm munge and run as root (.ci/run does; tests/slurm/slurm_cluster.py checks it)"),
    (("test-only reference",), "reference",
     "make setup (installs libreyolo==1.6.0 into .venv/reference; or set LIBREYOLO_REFERENCE)"),
    (("cuda", "gpu", "bfloat16", "pinned memory", "mps"), "gpu",
     "a GPU machine (make gpu-check runs them all)"),
    (("redis", "postgres"), "servers", "start PostgreSQL and Redis on 127.0.0.1 (.ci/run does)"),
)


def skip_groups(reasons: list[str]) -> dict[str, tuple[int, str]]:
    """``{group: (skips, how to enable)}`` for the skip reasons of a session (#28.12)."""
    out: dict[str, tuple[int, str]] = {}
    for reason in reasons:
        low = reason.lower()  # a key starts a word: "mps" is not the end of "dumps"
        group, how = next(((g, h) for keys, g, h in SKIP_GROUPS
                           if any(re.search(rf"\b{re.escape(k)}", low) for k in keys)),
                          ("other", "see `pytest -rs` for the reasons"))
        out[group] = (out.get(group, (0, how))[0] + 1, how)
    return out


#: how to run the tests marked ``slow`` when ``--no-slow`` (``make test``) left them out
SLOW_HOW = "make test-slow runs them, make test-all runs everything; .ci/run runs make test and make test-slow"


def pytest_addoption(parser) -> None:
    parser.addoption("--no-slow", action="store_true", default=False,
                     help="leave out the tests marked slow (make test); the closing line counts them")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items) -> None:
    """``--no-slow``: leave out the tests marked ``slow``. It runs after ``-k`` and ``-m``
    have deselected theirs, so the closing line counts only the slow tests that this option
    alone left out."""
    if not config.getoption("no_slow"):
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]
        config.hook.pytest_deselected(items=slow)
        config._slow_left_out = len(slow)


def closing_line(groups: dict[str, tuple[int, str]], slow_left_out: int) -> str | None:
    """The run's closing line: each group of skipped tests and how to enable it, then the
    tests marked ``slow`` that ``--no-slow`` left out; None when nothing was (#28.12)."""
    parts = []
    if groups:
        parts.append("skipped groups: " + "; ".join(f"{g} ({n} skipped: {how})"
                                                    for g, (n, how) in sorted(groups.items())))
    if slow_left_out:
        tests = "test" if slow_left_out == 1 else "tests"
        parts.append(f"not selected: slow ({slow_left_out} {tests} marked slow: real training, DDP, Slurm, "
                     f"worker recoveries; {SLOW_HOW})")
    return "; ".join(parts) or None


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """One closing line naming each group of skipped tests (and the slow tests ``--no-slow``
    left out) and how to enable it, so that a run in a plain clone does not quietly cover
    less."""
    reasons = []
    for rep in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(rep, "longrepr", None)
        reasons.append(str(longrepr[2] if isinstance(longrepr, tuple) else longrepr or ""))
    # printed last, after pytest's own summary line (pytest_unconfigure)
    config._skip_groups_line = closing_line(skip_groups(reasons), getattr(config, "_slow_left_out", 0))


def pytest_unconfigure(config) -> None:
    line = getattr(config, "_skip_groups_line", None)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if line and reporter is not None:
        reporter.write_line(line, yellow=True)
