"""Published and foreign weight files: read them safely, say what they are.

:func:`inspect_weights` is the one question the service asks of an uploaded file (run in a
child process with a time limit: ``python -m libreyolo_core.weights inspect PATH``).
"""

from libreyolo_core.weights.inspect import WeightsInfo, inspect_weights

__all__ = ["WeightsInfo", "inspect_weights"]
