"""Resume checks that run before any work: a resumed run must train the classes it
started with.

``resume`` continues one run (same weights, optimizer, schedule, classes); training a
checkpoint's weights on a dataset with other classes is fine-tuning, a new run started
with ``model=<checkpoint>``. :func:`check_resume_classes` says so before the dataset is
scanned.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from libreyolo_core.data.config import DataConfig
from libreyolo_core.engine.checkpoint import CheckpointError

__all__ = ["check_resume_classes"]

log = logging.getLogger(__name__)


def _names(names: dict[int, str], limit: int = 12) -> str:
    shown = [names[i] for i in sorted(names)][:limit]
    return "[" + ", ".join(shown) + (", ..." if len(names) > limit else "") + "]"


def check_resume_classes(ckpt: dict[str, Any], path: str | Path, data: DataConfig) -> None:
    """Compare a resume checkpoint's classes with the dataset yaml's.

    Args:
        ckpt: the loaded checkpoint (``nc``, ``names``).
        path: its file, for messages.
        data: the loaded dataset yaml (not yet scanned).

    Raises:
        CheckpointError: the class counts differ (the message gives both counts and names
            and says that ``model=<path>`` fine-tunes). Same count, other names: a warning.
    """
    nc, names = int(ckpt["nc"]), {int(k): str(v) for k, v in ckpt["names"].items()}
    if nc != data.nc:
        raise CheckpointError(
            f"{path}: cannot resume on {data.yaml_path}: the checkpoint has nc={nc} {_names(names)}, "
            f"the dataset yaml has nc={data.nc} {_names(data.names)}. resume continues a run with "
            f"its own classes; to train these weights on this dataset, start a new run with "
            f"model={path} (fine-tuning: the head is rebuilt for {data.nc} classes) and no resume")
    if names != data.names:
        changed = [f"{i}: {names[i]!r} -> {data.names[i]!r}" for i in sorted(names) if names[i] != data.names[i]]
        log.warning("%s: resuming with renamed classes (%s%s); the run continues, the new names are used",
                    path, ", ".join(changed[:5]), " ..." if len(changed) > 5 else "")
