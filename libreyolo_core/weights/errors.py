"""The error of a weights or checkpoint file that cannot be used.

It lives here, with the readers that raise it first, so that ``weights/`` needs nothing
from the engine; :mod:`libreyolo_core.engine.checkpoint` re-exports it (and derives
``NonFiniteCheckpointError`` from it).
"""

from __future__ import annotations

__all__ = ["CheckpointError"]


class CheckpointError(ValueError):
    """A checkpoint file that is missing, unreadable or lacks required keys."""
