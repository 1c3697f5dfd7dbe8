"""The command line's own error, in a module of its own so that the modules the CLI runs
(:mod:`libreyolo_core.predict_job`) can raise it without importing :mod:`libreyolo_core.cli`."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(ValueError):
    """Bad command line: unknown command or key, malformed argument."""
