"""The global batch and its split over ranks (docs/architecture.md, Multi-device). Torch-free: the API process
uses it to reject a bad job before it is queued."""

from __future__ import annotations

__all__ = ["BatchSizeError", "nearest_valid_batches", "per_rank_batch"]


class BatchSizeError(ValueError):
    """A global batch that cannot be split evenly over the ranks (or is not positive)."""


def nearest_valid_batches(batch: int, world_size: int) -> list[int]:
    """The multiples of ``world_size`` just below and above ``batch`` (the lower one only
    when it is positive), e.g. ``(6, 4) -> [4, 8]``, ``(3, 4) -> [4]``."""
    lower = batch // world_size * world_size
    return [b for b in (lower, lower + world_size) if b > 0]


def per_rank_batch(batch: int, world_size: int) -> int:
    """Images per rank for the **global** ``batch``.

    Raises:
        BatchSizeError: ``batch < 1``, or ``batch`` not divisible by ``world_size``; the
            message names both numbers and the nearest valid global batches.
    """
    if batch < 1:
        raise BatchSizeError(f"batch={batch}: use a positive global batch size, or -1 for autobatch")
    if batch % world_size:
        choices = " or ".join(f"batch={b}" for b in nearest_valid_batches(batch, world_size))
        raise BatchSizeError(
            f"batch={batch} is the GLOBAL batch size and must be divisible by world_size={world_size} "
            f"(each of the {world_size} ranks loads batch/world_size images; a silent round-down would "
            f"train on fewer images than asked). Use {choices}."
        )
    return batch // world_size
