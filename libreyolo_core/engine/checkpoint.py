"""Checkpoints: one dict of tensors and plain values, safe for ``torch.load(weights_only=True)``.

Keys (schema ``1``): ``schema_version``, ``libreyolo_version``, ``model_family``, ``size``,
``task``, ``nc``, ``names`` ({id: name}), ``imgsz``, ``model`` (EMA weights when EMA is on,
else the raw weights), and for resuming: ``train_model`` (raw weights), ``ema_updates``,
``optimizer``, ``scaler``, ``epoch`` (0-based, last finished), ``best_fitness``,
``best_epoch`` (1-based), ``config`` (the resolved TrainConfig), ``torch_rng``.
Writes are atomic: a temp file in the same folder, then ``os.replace``. A state holding a
NaN or an inf in any floating tensor is never written (:class:`NonFiniteCheckpointError`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from libreyolo_core.engine.nonfinite import nonfinite_tensors

__all__ = ["SCHEMA_VERSION", "save_checkpoint", "load_checkpoint", "CheckpointError",
           "NonFiniteCheckpointError", "refuse_nonfinite"]

SCHEMA_VERSION = "1"
REQUIRED = ("model", "model_family", "size", "nc", "names")


class CheckpointError(ValueError):
    """A checkpoint file that is missing, unreadable or lacks required keys."""


class NonFiniteCheckpointError(CheckpointError):
    """A state to save (or a checkpoint to resume) holds NaN/inf tensors; ``keys`` names them."""

    def __init__(self, message: str, keys: list[str] | tuple = ()):
        super().__init__(message)
        self.keys = list(keys)


def refuse_nonfinite(state: dict[str, Any], path: str | Path, verb: str) -> None:
    """Raise :class:`NonFiniteCheckpointError` (``"{path}: {verb}: N tensor(s) hold NaN or
    inf (keys...)"``) when a floating tensor of ``state`` is not finite."""
    bad = nonfinite_tensors(state)
    if bad:
        shown = ", ".join(bad[:5]) + (f", ... ({len(bad) - 5} more)" if len(bad) > 5 else "")
        raise NonFiniteCheckpointError(
            f"{path}: {verb}: {len(bad)} tensor(s) hold NaN or inf ({shown})", bad)


def save_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    """Write ``state`` to ``path`` atomically (temp file + rename); returns the path.

    Raises:
        NonFiniteCheckpointError: a floating tensor of ``state`` holds NaN or inf (nothing
            is written; an existing file at ``path`` is left as it was).
    """
    path = Path(path)
    refuse_nonfinite(state, path, "not written")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save({"schema_version": SCHEMA_VERSION, **state}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the usual file mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True`` (no arbitrary code from the file).

    Raises:
        CheckpointError: missing file, not a LibreYOLO checkpoint, or missing keys.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is a bad file
        raise CheckpointError(f"{path}: cannot be loaded safely ({type(exc).__name__}: {exc})") from exc
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path}: not a LibreYOLO checkpoint (a {type(ckpt).__name__})")
    missing = [k for k in REQUIRED if k not in ckpt]
    if missing:
        raise CheckpointError(f"{path}: not a LibreYOLO checkpoint, missing keys {missing}")
    ckpt["names"] = {int(k): str(v) for k, v in ckpt["names"].items()}
    return ckpt
