"""Where a dataset path given to the API (``/v1/datasets/register``, a job's ``data``) may
point: under ``Settings.dataset_roots`` when set, never inside the artifact root or the
upload root (other users' runs and uploads are reached by id only)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["path_refusal"]


def path_refusal(path: Path, settings) -> str | None:
    """Why ``path`` may not be used as a dataset path, or None when it may.

    Symlinks are resolved first, so a link cannot lead into a refused folder.
    """
    real = Path(os.path.realpath(path))
    state = [Path(os.path.realpath(p)) for p in (settings.artifact_root, settings.upload_root)]
    for folder in state:
        if real.is_relative_to(folder):
            return (f"{str(path)!r} lies in the service's own storage ({folder}); use an uploaded "
                    "dataset by its id")
    roots = settings.dataset_roots
    if roots and not any(real.is_relative_to(r) for r in roots):
        return (f"{str(path)!r} is not under the configured dataset roots "
                f"({', '.join(str(r) for r in roots)}; setting dataset_roots / LIBREYOLO_DATASET_ROOTS)")
    return None
