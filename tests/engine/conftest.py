"""Fixtures of the engine tests: one intra-op thread for the in-process training runs."""

from __future__ import annotations

import os

import pytest
import torch

#: modules whose learning thresholds were measured with torch's default thread count (a
#: different thread count changes the summation order, and these tiny from-scratch runs
#: are chaotic: see their comments); they keep it
DEFAULT_THREADS = {"test_overfit", "test_finetune"}


@pytest.fixture(autouse=True)
def _one_thread(request):
    """Single intra-op thread, as tests/models does: these runs train on 64-128 px images
    in batches of 2-8 inside the pytest process, and on a shared 2-core machine (load
    average 6-16) two spinning OpenMP threads made their steps many times slower (an
    eager 3-step epoch at 64 px took 130 s at load 16). The engine itself caps threads
    only downwards (libreyolo_core.data.workers.apply_threads), so 1 stays 1."""
    before = torch.get_num_threads()
    if request.module.__name__.rsplit(".", 1)[-1] in DEFAULT_THREADS:
        # torch's own default (one thread per usable CPU), whatever an earlier module left:
        # a tiny run from scratch is chaotic, and the thread count changes its sums (yolox-t
        # diverged at epoch 9 when it inherited 1 thread in the suite, passed with 2)
        torch.set_num_threads(len(os.sched_getaffinity(0)))
    else:
        torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
