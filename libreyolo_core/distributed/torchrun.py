"""``python -m libreyolo_core.distributed.torchrun [torchrun args]``: torchrun, stopped quietly.

The same launcher as ``python -m torch.distributed.run`` (same arguments), except for a
SIGTERM (or SIGINT/SIGHUP) to the agent: torchrun passes it to the ranks, which finish their
step, save ``last.pt`` and exit 143, then re-raises it as a ``SignalException`` whose
traceback ends the log of a cleanly stopped run. Here that becomes one line and the exit
code ``128 + signal`` (143 for SIGTERM), like the single-process engine. Every other
outcome (success, a failed rank's ``ChildFailedError``) is torchrun's own.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run torchrun on ``argv`` (default ``sys.argv[1:]``); returns 0, or ``128 + signal``
    when the agent was stopped by a signal."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(list(sys.argv[1:] if argv is None else argv))
    except SignalException as exc:
        print(f"torchrun: stopped by signal {int(exc.sigval)}; the ranks were told to stop "
              "(each saves last.pt when it can)", file=sys.stderr, flush=True)
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
