"""Loader workers and threads sized to the machine: the automatic worker count from the
CPU affinity and the ranks, one OpenCV/torch thread in each worker, the training
process's own threads capped, and the one log line."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from libreyolo_core.config import resolve_config
from libreyolo_core.data import generate_sample_dataset, load_data_config, scan_split
from libreyolo_core.data.loader import build_dataloader
from libreyolo_core.data.workers import (
    AUTO_MAX_WORKERS,
    local_ranks,
    plan_workers,
    resolved_workers,
    single_threaded_cv2,
    usable_cpus,
)
from libreyolo_core.distributed.context import DistContext

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("cpus", "ranks", "workers"), [
    (1, 1, 0), (2, 1, 1), (4, 1, 3), (16, 1, AUTO_MAX_WORKERS), (16, 2, 7), (16, 4, 3), (2, 2, 0),
    (64, 1, AUTO_MAX_WORKERS),
])
def test_auto_workers_from_cpus_and_ranks(cpus: int, ranks: int, workers: int) -> None:
    plan = plan_workers(-1, ranks, cpus=cpus, current_threads=64)
    assert plan.workers == workers
    # the training process keeps the CPUs its workers leave it, at least one
    assert plan.threads == max(1, cpus // ranks - workers)
    assert "auto" in plan.describe() and f"{cpus} usable CPU" in plan.describe()


def test_explicit_workers_capped_and_threads_never_raised() -> None:
    plan = plan_workers(8, 1, cpus=2, current_threads=4)
    assert plan.workers == 2 and plan.threads == 1 and "capped" in plan.describe()
    assert plan_workers(0, 1, cpus=8, current_threads=2).threads == 2  # never more than it had
    assert plan_workers(0, 1, cpus=8, current_threads=16).threads == 8
    assert plan_workers(3, 1, cpus=8, current_threads=16).describe().startswith(
        "loader: 3 worker(s) per rank (as asked)")
    with pytest.raises(ValueError, match="workers=-2"):
        plan_workers(-2)
    with pytest.raises(ValueError, match="ranks=0"):
        plan_workers(-1, 0)


def test_local_ranks_and_resolved(monkeypatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert local_ranks(8) == 4
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert local_ranks(2) == 2
    assert resolved_workers(3) == 3
    assert resolved_workers(-1, ranks=1) == min(AUTO_MAX_WORKERS, usable_cpus() - 1)


def test_affinity_not_cpu_count_decides() -> None:
    """A process pinned to one CPU (``taskset``, a container's CPU set) gets no workers
    even on a machine with more cores."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    code = textwrap.dedent("""
        import os
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
        from libreyolo_core.data.workers import plan_workers, usable_cpus
        p = plan_workers(-1, 1, current_threads=4)
        print(usable_cpus(), p.workers, p.threads)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert out.stdout.split() == ["1", "0", "1"]


class _Threads(Dataset):
    """Each item reports the OpenCV and torch thread counts of the process that made it."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        # a parallel OpenCV op in the worker: would hang on a pool broken by the fork
        cv2.resize(np.zeros((256, 256, 3), np.uint8), (128, 128))
        info = torch.tensor([cv2.getNumThreads(), torch.get_num_threads(), os.getpid()])
        return torch.zeros(3, 8, 8, dtype=torch.uint8), torch.zeros(0, 5), {"t": info}


def test_workers_run_single_threaded_after_a_multithreaded_parent() -> None:
    before = cv2.getNumThreads()
    cv2.setNumThreads(2)
    try:
        cv2.resize(np.zeros((512, 512, 3), np.uint8), (300, 300))  # the parent's pool is live
        loader = build_dataloader(_Threads(), 2, 2, shuffle=False)
        infos = [m["t"].tolist() for batch in loader for m in batch.metas]
        assert cv2.getNumThreads() == 2  # the parent's setting is put back
    finally:
        cv2.setNumThreads(before)
    assert {(c, t) for c, t, _ in infos} == {(1, 1)}
    assert os.getpid() not in {pid for _, _, pid in infos}
    with single_threaded_cv2():
        assert cv2.getNumThreads() == 1


def test_training_build_logs_the_choice_once_and_caps_threads(tmp_path: Path, caplog) -> None:
    from libreyolo_core.engine.build import _loaders

    cfg_data = load_data_config(generate_sample_dataset(tmp_path, n_train=4, n_val=2, imgsz=64, seed=0))
    report = scan_split(cfg_data, "train", cache=False)
    cfg = resolve_config(model="yolo9-t", imgsz=64)
    assert cfg.workers == -1  # the default is automatic, for every family
    threads = torch.get_num_threads()
    try:
        with caplog.at_level(logging.INFO, logger="libreyolo_core.engine.build"):
            _, loader, val = _loaders(cfg, report, report, DistContext(), 2, torch.device("cpu"))
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("loader:")]
        assert len(lines) == 1, lines
        want = plan_workers(-1, 1, current_threads=threads)
        assert loader.num_workers == want.workers and val.num_workers == min(want.workers, 2)
        assert torch.get_num_threads() == want.threads
    finally:
        torch.set_num_threads(threads)
