"""Training profiler: measure a window of real steps, give one verdict, write artifacts.

``TrainingProfiler`` (the hooks the trainer calls), ``ProfileWindowError`` (the first epoch
cannot hold the window). Modules: ``window`` (measurement), ``load`` (the machine's load
during the window), ``confidence`` (how sure a verdict is), ``analysis`` (trace mining),
``verdict`` (thresholds and rules), ``artifacts`` / ``timeline`` (files), ``report`` (text,
``compare``), ``trial`` (one profile trial as data), ``cli`` (``libreyolo profile ...``).
Imported lazily, so the readers never load torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TrainingProfiler", "ProfileWindowError"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from libreyolo_core.profiler import window

        return getattr(window, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
