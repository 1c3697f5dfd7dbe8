"""LibreYOLO core: the training engine (YOLOv9 / YOLOX), importable without side effects.

``LibreYOLO`` (the facade) imports torch, so it is loaded lazily on first access; the
config and the model registry stay torch-free for the API process.
"""

from typing import Any

from libreyolo_core.version import __version__

__all__ = ["LibreYOLO", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "LibreYOLO":
        from libreyolo_core.facade import LibreYOLO

        return LibreYOLO
    raise AttributeError(f"module 'libreyolo_core' has no attribute {name!r}")
