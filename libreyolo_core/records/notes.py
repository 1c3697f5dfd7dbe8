"""Sentences about a finished run that its numbers alone do not say (torch-free: the
engine's CLI and the service's pages print them)."""

from __future__ import annotations

from typing import Any

__all__ = ["LEARNED_NOTHING_MAP50", "SCRATCH_EPOCHS", "learned_nothing"]

#: Below this mAP50 a run has learned nothing to speak of.
LEARNED_NOTHING_MAP50 = 0.05
#: About how many epochs from-scratch training needs on a small set (the demo's 30).
SCRATCH_EPOCHS = 30


def learned_nothing(metrics: dict[str, Any] | None, epochs: int | None,
                    from_scratch: bool) -> str | None:
    """``"mAP50 0.004 after 5 epochs from scratch: too short to learn; ..."`` when a
    validated run's mAP50 is below :data:`LEARNED_NOTHING_MAP50`, else None.

    Args:
        metrics: the run's final metrics (``mAP50``). epochs: epochs it trained.
        from_scratch: it started from a model name, not from weights.
    """
    m = (metrics or {}).get("mAP50")
    if not isinstance(m, int | float) or m >= LEARNED_NOTHING_MAP50:
        return None
    after = f" after {epochs} epoch{'s' if epochs != 1 else ''}" if epochs else ""
    if from_scratch:
        return (f"mAP50 {m:.3f}{after} from scratch: too short to learn. From-scratch "
                f"training needs about {SCRATCH_EPOCHS} epochs or more (epochs={SCRATCH_EPOCHS}), "
                "or start from a trained model (model=<model id or weights file>)")
    return (f"mAP50 {m:.3f}{after}: the model learned next to nothing on this data; check the "
            "labels (libreyolo checks data=...) and train longer")
