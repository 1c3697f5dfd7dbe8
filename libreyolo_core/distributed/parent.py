"""Child processes that end with their parent (Linux ``PR_SET_PDEATHSIG``).

``libreyolo-service up`` and the worker's runner start long-lived children in sessions of
their own; a ``kill -9`` of the parent would otherwise leave them running as orphans (an
API still holding the port, a worker still claiming jobs). torchrun's ranks run in sessions
of their own too: a rank whose agent died would go on training with the other nodes of a
multi-node job, so each rank started by torchrun ends with its agent
(:func:`libreyolo_core.distributed.context.init_distributed`).
``prctl(PR_SET_PDEATHSIG, sig)`` asks the kernel to send ``sig`` to the child when its
parent thread exits.
"""

from __future__ import annotations

import ctypes
import os
import signal

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM, parent: int | None = None) -> None:
    """In a child (a ``preexec_fn``): receive ``sig`` when the parent exits.

    Args:
        sig: the signal (SIGTERM lets the child stop gracefully; SIGKILL for an engine).
        parent: the parent's pid as the parent saw it before the fork: when the parent is
            already gone by the time this runs, the child sends ``sig`` to itself.

    Does nothing where ``prctl`` is unavailable (not Linux).
    """
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        return
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)
