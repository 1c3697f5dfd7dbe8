"""What a run has done so far, and the one place it is saved to and loaded from a checkpoint.

:class:`TrainState` holds the counters and records of a run (epoch, best fitness, the
results history, the non-finite counts, the measured epoch and validation times).
:meth:`TrainState.checkpoint` writes it, with the weights, EMA, optimizer, scaler, config
and torch RNG of the run's parts, into the checkpoint dict of
:mod:`libreyolo_core.engine.checkpoint`; :meth:`TrainState.load` reads the same keys back.
Saving and resuming therefore read one thing, and a round trip is a test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from libreyolo_core.engine.checkpoint import CheckpointError, refuse_nonfinite
from libreyolo_core.engine.ema import unwrap
from libreyolo_core.version import __version__

__all__ = ["TrainState", "fitness"]


def fitness(metrics: dict[str, float]) -> float:
    """Model selection score: ``0.1 * mAP50 + 0.9 * mAP50-95`` (Ultralytics' convention)."""
    return 0.1 * metrics.get("mAP50", 0.0) + 0.9 * metrics.get("mAP50-95", 0.0)


@dataclass
class TrainState:
    """The run's progress (one per process; under DDP rank 0's best values are shared).

    Attributes:
        epoch: the epoch being trained, 0-based; ``start_epoch`` the first this process trains.
        best_fitness, best_epoch (1-based), best_metrics: the best validated epoch so far
            (``best_fitness`` -1 before one).
        metrics: the last validation's metrics.
        history: one ``results.csv`` row per completed epoch.
        nonfinite_skipped: steps skipped for a non-finite loss or fp32 gradient, the whole
            run; ``nonfinite_streak`` consecutive ones (across epochs); ``amp_skipped`` steps
            the fp16 ``GradScaler`` skipped; ``steps_applied`` optimizer steps taken.
        train_s, val_s: seconds of each completed epoch's training and of each validation
            (the ETA's inputs; a resumed run's earlier epochs included).
    """

    epoch: int = 0
    start_epoch: int = 0
    best_fitness: float = -1.0
    best_epoch: int = 0
    best_metrics: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    nonfinite_skipped: int = 0
    nonfinite_streak: int = 0
    amp_skipped: int = 0
    steps_applied: int = 0
    train_s: list[float] = field(default_factory=list)
    val_s: list[float] = field(default_factory=list)

    def checkpoint(self, epoch: int, parts: Any, *, meta: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        """The checkpoint dict after ``epoch`` (0-based, the last completed; -1 none).

        Args:
            epoch: the epoch the state is saved at.
            parts: the run's :class:`~libreyolo_core.engine.build.TrainParts` (``model``,
                possibly DDP-wrapped, ``ema``, ``optimizer``, ``amp``).
            meta: ``model_family``, ``size``, ``nc``, ``names``, ``imgsz``.
            config: the resolved config, ``TrainConfig.model_dump(mode="json")``.

        Returns:
            The dict :func:`~libreyolo_core.engine.checkpoint.save_checkpoint` writes;
            ``model`` holds the EMA weights when EMA is on, ``train_model`` the raw ones.
        """
        model, ema, scaler = unwrap(parts.model), parts.ema, parts.amp.scaler
        return {
            "libreyolo_version": __version__,
            "model_family": meta["model_family"],
            "size": meta["size"],
            "task": "detect",
            "nc": meta["nc"],
            "names": meta["names"],
            "imgsz": meta["imgsz"],
            "model": (ema.module if ema is not None else model).state_dict(),
            "train_model": model.state_dict(),
            "ema_updates": ema.updates if ema is not None else 0,
            "optimizer": parts.optimizer.state_dict(),
            "scaler": scaler.state_dict() if scaler.is_enabled() else {},
            "epoch": epoch,
            "best_fitness": self.best_fitness,
            "best_epoch": self.best_epoch,
            "best_metrics": self.best_metrics,
            "nonfinite_skipped": self.nonfinite_skipped,
            "history": self.history,
            "config": config,
            "torch_rng": torch.get_rng_state(),
        }

    def load(self, ckpt: dict[str, Any], parts: Any, *, path: str | Path, title: str,
             restore_rng: bool = True) -> None:
        """Restore the run from a resume checkpoint (what :meth:`checkpoint` wrote).

        Loads the raw weights into ``parts.model`` (not yet DDP-wrapped), the EMA weights
        and update count into ``parts.ema`` (when there is one), the optimizer and the fp16
        scaler, the torch RNG (``restore_rng``: rank 0; other ranks keep ``seed + rank``),
        and this state's counters; ``start_epoch`` is the epoch after the saved one. Only
        the ``history`` rows up to it are kept (a resume from an earlier ``epoch_N.pt``
        trains the later epochs again).

        Args:
            ckpt: the loaded checkpoint (:func:`~libreyolo_core.engine.checkpoint.load_checkpoint`).
            parts: the run's freshly built parts.
            path: the checkpoint's file and ``title`` the model's name, for messages.
            restore_rng: whether to set the torch RNG from ``torch_rng``.

        Raises:
            NonFiniteCheckpointError: its weights or optimizer state hold NaN/inf.
            CheckpointError: its weights do not fit the model.
        """
        refuse_nonfinite({k: ckpt[k] for k in ("model", "train_model", "optimizer") if k in ckpt},
                         path, "cannot resume")
        try:
            unwrap(parts.model).load_state_dict(ckpt.get("train_model", ckpt["model"]))
        except RuntimeError as exc:
            detail = str(exc).splitlines()[0][:300]
            raise CheckpointError(f"{path}: its weights do not fit {title} ({detail})") from None
        parts.optimizer.load_state_dict(ckpt["optimizer"])
        if parts.ema is not None and "model" in ckpt:
            parts.ema.module.load_state_dict(ckpt["model"])
            parts.ema.updates = int(ckpt.get("ema_updates", 0))
        if ckpt.get("scaler"):
            parts.amp.scaler.load_state_dict(ckpt["scaler"])
        if "torch_rng" in ckpt and restore_rng:
            torch.set_rng_state(ckpt["torch_rng"])
        self.start_epoch = int(ckpt["epoch"]) + 1
        self.best_fitness = float(ckpt.get("best_fitness", -1.0))
        self.best_epoch = int(ckpt.get("best_epoch", 0))
        self.best_metrics = dict(ckpt.get("best_metrics", {}))
        self.nonfinite_skipped = int(ckpt.get("nonfinite_skipped", 0))
        self.history = [r for r in ckpt.get("history", []) if r["epoch"] <= self.start_epoch]
        self.train_s = [float(r["epoch_time_s"]) for r in self.history if r.get("epoch_time_s")]
        self.val_s = [float(r["val_time_s"]) for r in self.history
                      if r.get("validated") and r.get("val_time_s")]

    def timing(self, wall_s: float | None) -> dict[str, Any]:
        """Where the run's time went, seconds: ``epochs`` completed, ``epoch_time_s`` (mean
        training time of an epoch), ``train_s`` and ``val_s`` (sums over the completed
        epochs, a resumed run's earlier ones included) and ``wall_s`` (given: this
        process, set-up included; None before training started)."""
        n = len(self.train_s)
        return {"epochs": n,
                "epoch_time_s": round(sum(self.train_s) / n, 3) if n else None,
                "train_s": round(sum(self.train_s), 3), "val_s": round(sum(self.val_s), 3),
                "wall_s": None if wall_s is None else round(wall_s, 3)}
