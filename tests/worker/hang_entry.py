"""The engine (``libreyolo train spec=...``) with a hook that sleeps for ever at a step: a
stand-in for a deadlocked loader or a stuck collective.

``HANG_AT_STEP`` (global step, 1-based, default 5) and ``HANG_RANK`` (the rank that hangs,
default 0) pick where; only a run that does not resume hangs, so the re-queued attempt
(resuming from last.pt) runs through. Used by tests/worker/test_worker_hang.py as the
engine command (directly, or as torchrun's script).
"""

from __future__ import annotations

import os
import time

from libreyolo_core.engine.trainer import Trainer

_step = Trainer._step
_count = {"n": 0}


def _hanging_step(self, i, batch):  # type: ignore[no-untyped-def]
    _count["n"] += 1
    hang_at = int(os.environ.get("HANG_AT_STEP", "5"))
    if (self.resume is None and _count["n"] == hang_at
            and self.dist.rank == int(os.environ.get("HANG_RANK", "0"))):
        print(f"test hook: rank {self.dist.rank} sleeps for ever at step {hang_at}", flush=True)
        while True:
            time.sleep(3600)
    return _step(self, i, batch)


Trainer._step = _hanging_step  # type: ignore[method-assign]

if __name__ == "__main__":
    from libreyolo_core.cli import main

    main()
