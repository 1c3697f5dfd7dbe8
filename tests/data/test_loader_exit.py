"""A process whose persistent loader workers outlive ``train()`` still exits.

Regression: loader workers once ignored SIGTERM, and ``multiprocessing``'s exit handler
(SIGTERM to daemonic children, then ``join``) waited for them forever, so a script that
kept its trainer alive never exited (it hung the CI run after the last test passed).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest


def test_leaked_persistent_workers_do_not_hang_exit():
    code = textwrap.dedent("""
        import os, torch
        from torch.utils.data import DataLoader, TensorDataset
        from libreyolo_core.data.loader import seed_worker

        loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=4, num_workers=2,
                            persistent_workers=True, worker_init_fn=seed_worker)
        it = iter(loader)
        [next(it) for _ in range(4)]  # batches from both workers: both have run worker_init
        KEEP = [loader, it]          # alive at interpreter exit, as a kept trainer would be
        pids = [w.pid for w in it._workers]
        assert all(os.getpgid(p) == p for p in pids), "workers did not leave the parent's group"
        print("ready", *pids, flush=True)
        """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"the process hung at exit with its loader workers alive: {out!r}")
    assert proc.returncode == 0, out
    pids = [int(p) for p in out.split()[1:]]
    assert len(pids) == 2
    for pid in pids:                  # and the workers are gone, not orphaned
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        os.kill(pid, signal.SIGKILL)
        pytest.fail(f"loader worker {pid} outlived its process")
