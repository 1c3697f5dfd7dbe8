"""A training run's result as a typed record: :class:`TrainResult`.

:meth:`Trainer.train <libreyolo_core.engine.trainer.Trainer.train>` builds it;
:func:`~libreyolo_core.engine.train_run.train_run` returns it (a spawned DDP run's rank 0
hands it over as JSON: :meth:`TrainResult.of` reads that back); :meth:`LibreYOLO.train
<libreyolo_core.facade.LibreYOLO.train>` and the engine CLI use :meth:`TrainResult.to_dict`,
the flat dict the public API has always returned. Torch-free (pydantic only), frozen. Values
are kept as given (the class names of a spawned run keep their JSON string keys), so
``TrainResult.of(d).to_dict() == d`` for every dict a run returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["TrainResult"]

#: the keys of :meth:`TrainResult.to_dict` beside the metrics, in their order
FIELDS = ("fitness", "best_epoch", "epochs_completed", "save_dir", "best_checkpoint",
          "last_checkpoint", "names", "nonfinite_skipped", "amp_skipped", "timing")
#: keys present only when the run had them
OPTIONAL = ("profile", "preflight")


class TrainResult(BaseModel):
    """What one training run ended with.

    Attributes:
        metrics: the best validated epoch's metrics (the last epoch's when none was best;
            empty without validation): ``precision``, ``recall``, ``mAP50``, ``mAP50-95``
            (fractions in [0, 1]), ``per_class_AP`` (class id -> mAP50-95), ...
        fitness: the best epoch's fitness (-1.0 before one was validated).
        best_epoch: 1-based; 0 when no epoch was validated.
        epochs_completed: epochs that ended, those of a resumed checkpoint included.
        save_dir: the run directory. best_checkpoint, last_checkpoint: its ``weights/best.pt``
            and ``weights/last.pt`` (which may not exist: a profile-only run saves none).
        names: class id -> name (the keys of ``per_class_AP``).
        nonfinite_skipped, amp_skipped: optimizer steps skipped for a non-finite loss or
            gradient, and by the fp16 scaler.
        timing: where the run's time went, seconds (``TrainState.timing``).
        profile: the profile window's summary (``profile=True``), else unset.
        preflight: the preflight estimate (``preflight=True``), else unset.
    """

    model_config = ConfigDict(frozen=True)

    metrics: dict[str, Any]
    fitness: float
    best_epoch: int
    epochs_completed: int
    save_dir: str
    best_checkpoint: str
    last_checkpoint: str
    names: dict[int | str, str]
    nonfinite_skipped: int
    amp_skipped: int
    timing: dict[str, Any]
    profile: dict[str, Any] | None = None
    preflight: dict[str, Any] | None = None

    @classmethod
    def of(cls, result: Mapping[str, Any]) -> TrainResult:
        """Read a run's flat result dict (:meth:`to_dict`'s form): every key that is not a
        field is a metric.

        Raises:
            pydantic.ValidationError: a field is missing or of the wrong type.
        """
        named = set(FIELDS) | set(OPTIONAL)
        return cls(metrics={k: v for k, v in result.items() if k not in named},
                   **{k: v for k, v in result.items() if k in named})

    def to_dict(self) -> dict[str, Any]:
        """The flat dict :meth:`LibreYOLO.train <libreyolo_core.facade.LibreYOLO.train>`
        returns: the metrics, then the fields in :data:`FIELDS` order, then ``profile`` and
        ``preflight`` when set."""
        return {**self.metrics, **{k: getattr(self, k) for k in FIELDS},
                **{k: getattr(self, k) for k in OPTIONAL if k in self.model_fields_set}}
