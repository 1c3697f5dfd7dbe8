"""Checkpoints: one dict of tensors and plain values, safe for ``torch.load(weights_only=True)``.

Keys (schema ``1.0``, LibreYOLO 1.x's metadata schema, so LibreYOLO 1.6.0 loads our files):
``schema_version``, ``libreyolo_version``, ``model_family``, ``size``, ``task``, ``nc``,
``names`` ({id: name}), ``imgsz``, ``model`` (EMA weights when EMA is on, else the raw
weights), and for resuming (``last.pt`` only): ``train_model`` (raw weights),
``ema_updates``, ``optimizer``, ``scaler``, ``epoch`` (0-based, last finished),
``best_fitness``, ``best_epoch`` (1-based), ``config`` (the resolved TrainConfig),
``torch_rng``. A lean checkpoint (:func:`lean_state`, ``best.pt``) keeps the metadata and
``model`` in float16 only.

Tensor names in the file are LibreYOLO's (for YOLOv9 they differ from our module names;
:mod:`libreyolo_core.weights.names`): :func:`save_checkpoint` renames on the way out,
:func:`load_checkpoint` back on the way in, so the rest of the engine sees its own names.
Writes are atomic: a temp file in the same folder, then ``os.replace``. A state holding a
NaN or an inf in any floating tensor is never written (:class:`NonFiniteCheckpointError`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from libreyolo_core.engine import fence
from libreyolo_core.engine.nonfinite import nonfinite_tensors
from libreyolo_core.weights.errors import CheckpointError  # defined with the readers, exported here

__all__ = ["SCHEMA_VERSION", "save_checkpoint", "load_checkpoint", "lean_state", "CheckpointError",
           "NonFiniteCheckpointError", "refuse_nonfinite"]

SCHEMA_VERSION = "1.0"
REQUIRED = ("model", "model_family", "size", "nc", "names")
STATE_KEYS = ("model", "train_model")  # state dicts stored under LibreYOLO's names
RESUME_KEYS = ("train_model", "ema_updates", "optimizer", "scaler", "epoch", "best_fitness", "best_epoch",
               "nonfinite_skipped", "history", "config", "torch_rng")  # ``best_metrics`` stays in lean files


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


def lean_state(state: dict[str, Any]) -> dict[str, Any]:
    """The inference part of a checkpoint ``state``: its metadata and ``model`` (the EMA
    weights) in float16, without the training state (about 4 MB for yolo9-t instead of 25).
    A tensor with a value beyond float16's range (65504) stays float32, so the cast never
    makes an inf. Loading casts back to float32."""
    lean = {k: v for k, v in state.items() if k not in RESUME_KEYS}
    lean["model"] = {k: v.half() if _fits_half(v) else v for k, v in state["model"].items()}
    return lean


def _fits_half(t: torch.Tensor) -> bool:
    """True for a floating tensor whose values all fit float16 (empty tensors fit)."""
    if not t.is_floating_point():
        return False
    return t.numel() == 0 or bool(t.detach().abs().max() <= torch.finfo(torch.float16).max)


def save_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    """Write ``state`` to ``path`` atomically (temp file + rename); returns the path.

    ``model`` and ``train_model`` are written under LibreYOLO's tensor names for the
    checkpoint's ``model_family``, in NCHW (contiguous) memory whatever the training
    layout (``channels_last``).

    Raises:
        NonFiniteCheckpointError: a floating tensor of ``state`` holds NaN or inf (nothing
            is written; an existing file at ``path`` is left as it was).
    """
    from libreyolo_core.weights.names import to_libreyolo

    family = str(state.get("model_family", ""))
    # NCHW whatever the training layout (channels_last): a reader may .view() the weights
    state = {k: {n: t.contiguous() for n, t in to_libreyolo(family, v).items()}
             if k in STATE_KEYS and isinstance(v, dict) else v for k, v in state.items()}
    path = Path(path)
    refuse_nonfinite(state, path, "not written")
    fence.check(f"checkpoint {path.name}")  # an attempt given up writes nothing
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
        fence.check(f"checkpoint {path.name}", leftover=tmp)  # again: the save took a while
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load one of our (or a LibreYOLO 1.x) checkpoints with ``weights_only=True``: the dict
    with ``model`` / ``train_model`` under our tensor names and in float32. Used to resume;
    any other weights file goes through :func:`libreyolo_core.weights.load_weights`.

    Raises:
        CheckpointError: missing file, unsafe or unreadable, not a LibreYOLO checkpoint, or
            missing keys.
    """
    from libreyolo_core.weights.names import to_ours
    from libreyolo_core.weights.reader import plain, read_torch_file

    path = Path(path)
    ckpt = read_torch_file(path)
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path}: not a LibreYOLO checkpoint (a {type(ckpt).__name__})")
    missing = [k for k in REQUIRED if k not in ckpt]
    if missing:
        raise CheckpointError(f"{path}: not a LibreYOLO checkpoint, missing keys {missing}")
    ckpt = {k: v if k in STATE_KEYS or k in ("optimizer", "scaler", "torch_rng") else plain(v)
            for k, v in ckpt.items()}
    for key in STATE_KEYS:
        if isinstance(ckpt.get(key), dict):
            ckpt[key] = {k: v.float() if v.is_floating_point() else v
                         for k, v in to_ours(str(ckpt["model_family"]), ckpt[key]).items()}
    ckpt["names"] = {int(k): str(v) for k, v in ckpt["names"].items()}
    return ckpt
