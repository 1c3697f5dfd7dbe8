"""Published and foreign weight files: read them safely, say what they are, load them.

* :func:`load_weights` — the one loader (ours, LibreYOLO 1.x, upstream YOLOv9, Megvii YOLOX;
  Ultralytics files refused with the reason) -> :class:`LoadedWeights` (``build()`` gives
  our model).
* :func:`inspect_weights` — the one question the service asks of an uploaded file (run in a
  child process with a time limit: ``python -m libreyolo_core.weights inspect PATH``).
* :func:`transfer_weights` — start a model with another class count from those weights.
"""

from libreyolo_core.weights.inspect import WeightsInfo, inspect_weights
from libreyolo_core.weights.load import LoadedWeights, build_from_state, detect_model, load_weights
from libreyolo_core.weights.transfer import TransferReport, compact_names, transfer_weights

__all__ = [
    "WeightsInfo",
    "inspect_weights",
    "LoadedWeights",
    "load_weights",
    "build_from_state",
    "detect_model",
    "TransferReport",
    "transfer_weights",
    "compact_names",
]
