"""What a run tells its reader: ``events.jsonl``'s run and epoch events, printed lines,
tqdm bars. Rank 0 only: :func:`~libreyolo_core.engine.hooks.policy.default_hooks` puts the
hook that reports (:class:`~libreyolo_core.engine.hooks.progress.ProgressHook`) in rank 0's
list alone, so nothing here asks for the rank.

Progress comes at every ``log_interval`` steps, at the epoch's last step and at least every
:data:`PROGRESS_EVERY_S` seconds; a tqdm bar when stderr is a terminal, printed lines when
it is not (the worker reads those and the events).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from libreyolo_core.engine.events import EventLog
from libreyolo_core.records.events import ProgressEvent

__all__ = ["PROGRESS_EVERY_S", "progress_bar", "validation_progress"]

#: Wall-clock seconds between progress events (and log lines) at most, whatever
#: ``log_interval`` says: long steps, a small dataset or validation never go quiet.
PROGRESS_EVERY_S = 2.0


def progress_bar(total: int, desc: str):
    """A tqdm bar of ``total`` batches when stderr is a terminal, else None."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="batch", dynamic_ncols=True, leave=True)


def validation_progress(events: EventLog, epoch: int, epochs: int) -> Callable[[int, int], None]:
    """``on_batch(k, n)`` for :func:`~libreyolo_core.eval.validate.validate` (rank 0): a
    ``progress`` event with ``phase: "validating"``, ``val_batch`` and ``val_batches`` (and
    a printed line) at the first and last batch and at most every :data:`PROGRESS_EVERY_S`
    seconds between; ``epoch`` is 1-based."""
    last = [0.0]

    def on_batch(k: int, n: int) -> None:
        now = time.perf_counter()
        if k not in (1, n) and now - last[0] < PROGRESS_EVERY_S:
            return
        last[0] = now
        events.write(ProgressEvent(phase="validating", epoch=epoch, epochs=epochs, val_batch=k,
                                   val_batches=n))
        print(f"epoch {epoch}/{epochs} validating {k}/{n}", flush=True)

    return on_batch
