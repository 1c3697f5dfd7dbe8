"""Batching and the training/validation ``DataLoader``.

Epoch protocol (every world size, every worker count)::

    loader = build_dataloader(ds, batch_size=16, workers=4, shuffle=True, seed=cfg.seed,
                              rank=rank, world_size=world)
    for epoch in range(start_epoch, epochs):
        if epoch == epochs - no_aug_epochs:
            ds.close_mosaic()
        ds.set_epoch(epoch)              # augmentation seed (shared with workers)
        loader.sampler.set_epoch(epoch)  # shuffle order
        for batch in loader:             # iter() AFTER both set_epoch calls
            ...

Both ``set_epoch`` calls (and ``close_mosaic``) must happen before the epoch's iterator is
created: persistent workers start prefetching as soon as ``iter(loader)`` is called.
"""

from __future__ import annotations

import functools
import os
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from libreyolo_core.data.workers import single_threaded_cv2, usable_cpus

__all__ = ["Batch", "YOLODataLoader", "batch_targets", "build_dataloader", "check_loader_args", "collate",
           "seed_worker"]


@dataclass
class Batch:
    """One collated batch.

    Attributes:
        images: ``torch.uint8 (B, 3, S, S)`` RGB.
        targets: ``torch.float32 (N, 6)`` rows ``[batch_idx, cls, x1, y1, x2, y2]``, boxes in
            pixels of the ``S x S`` canvas; ``N`` = boxes in the whole batch.
        metas: per-image meta dicts (see ``YOLODataset``).
    """

    images: torch.Tensor
    targets: torch.Tensor
    metas: list[dict[str, Any]]

    def pin_memory(self) -> Batch:
        """Page-locked copy (called by ``DataLoader(pin_memory=True)``)."""
        return Batch(self.images.pin_memory(), self.targets.pin_memory(), self.metas)

    def to(self, device: torch.device | str, non_blocking: bool = True) -> Batch:
        """Copy tensors to ``device`` (metas stay on the host)."""
        return Batch(
            self.images.to(device, non_blocking=non_blocking),
            self.targets.to(device, non_blocking=non_blocking),
            self.metas,
        )

    def __len__(self) -> int:
        return int(self.images.shape[0])


def batch_targets(labels: list[torch.Tensor]) -> torch.Tensor:
    """Per-image ``(n_i, 5)`` labels -> the batch's ``float32 (N, 6)`` targets
    ``[batch_idx, cls, x1, y1, x2, y2]``."""
    return torch.cat([
        torch.cat([torch.full((len(lab), 1), float(i)), lab.reshape(-1, 5).float()], 1)
        for i, lab in enumerate(labels)
    ], 0)


def collate(samples: list[tuple[torch.Tensor, torch.Tensor, dict[str, Any]]] | Batch) -> Batch:
    """Stack ``YOLODataset`` samples into a :class:`Batch`; a :class:`Batch` (what
    ``YOLODataset.__getitems__`` already built) is returned as it is.

    Args:
        samples: ``[(image (3, S, S) uint8, labels (n_i, 5) float32, meta), ...]``, all
            images the same size.

    Raises:
        ValueError: empty list or images of different shapes.
    """
    if isinstance(samples, Batch):
        return samples
    if not samples:
        raise ValueError("collate() got no samples")
    images, labels, metas = zip(*samples, strict=True)
    shapes = {tuple(im.shape) for im in images}
    if len(shapes) != 1:
        raise ValueError(f"collate() needs equal image shapes, got {sorted(shapes)}")
    return Batch(torch.stack(images, 0), batch_targets(list(labels)), list(metas))


def seed_worker(worker_id: int, seed: int = 0, rank: int = 0) -> None:
    """``worker_init_fn``: seed torch, numpy and ``random`` from ``(seed, rank, worker_id)``.

    Samples do not depend on these (``YOLODataset`` seeds each sample itself); this only
    makes any other randomness in a worker reproducible and distinct per worker and rank.
    (OpenCV's thread count is deliberately NOT changed here: ``cv2.setNumThreads`` in a
    forked child whose parent already ran a parallel cv2 op can deadlock.)

    A worker leaves its parent's process group (``setpgid``): the process that owns the
    loader owns its shutdown. A SIGTERM sent to the whole group (a supervisor's
    ``kill -- -PGID``, torchrun stopping a rank's session with ``killpg``) would otherwise
    kill the worker under a rank that is still finishing its step to save ``last.pt``, and
    the loader would raise "DataLoader worker is killed by signal: Terminated". SIGTERM
    itself keeps its default action, so ``multiprocessing``'s exit handler, which
    terminates and then joins daemonic children, still ends workers that outlive their
    loader (ignoring SIGTERM made that join wait forever). Workers also end with their
    loader, and exit by themselves when the main process dies (torch's parent watchdog).
    """
    os.setpgid(0, 0)
    state = np.random.SeedSequence([seed, rank, worker_id]).generate_state(2)
    torch.manual_seed(int(state[0]) << 32 | int(state[1]))
    np.random.seed(int(state[0]))
    random.seed(int(state[1]))


class YOLODataLoader(DataLoader):
    """``DataLoader`` whose worker processes start with OpenCV at one thread (set in the
    parent around their fork, :func:`~libreyolo_core.data.workers.single_threaded_cv2`);
    torch already runs one intra-op thread in each worker."""

    def _get_iterator(self) -> Any:
        if self.num_workers == 0:
            return super()._get_iterator()
        with single_threaded_cv2():
            return super()._get_iterator()


def check_loader_args(batch_size: int, workers: int, rank: int, world_size: int) -> None:
    """The arguments every training loader shares (CPU and ``loader=gpu``).

    Raises:
        ValueError: ``batch_size < 1``, ``workers < 0``, or ``rank`` not in
            ``[0, world_size)``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    if workers < 0:
        raise ValueError(f"workers={workers} must be >= 0")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")


def build_dataloader(
    dataset: Dataset,
    batch_size: int,
    workers: int,
    shuffle: bool,
    seed: int = 0,
    rank: int = 0,
    world_size: int = 1,
    drop_last: bool = False,
    pin_memory: bool | None = None,
) -> DataLoader:
    """A ``DataLoader`` over ``dataset`` for one rank, yielding :class:`Batch` objects.

    Always uses ``DistributedSampler(num_replicas=world_size, rank=rank, shuffle=shuffle,
    seed=seed)`` (also for one process), so shuffles are deterministic per epoch and equal
    across restarts. Callers must call ``dataset.set_epoch(e)`` and
    ``loader.sampler.set_epoch(e)`` before iterating epoch ``e`` (see module docstring).
    With ``world_size > 1`` the sampler pads the index list by repeating samples so every
    rank gets the same count.

    Args:
        dataset: usually a ``YOLODataset``.
        batch_size: images per batch on THIS rank.
        workers: loader worker processes (clamped to the CPUs this process may use); ``0``
            loads in the main process. Each worker runs OpenCV and torch single-threaded. Workers are persistent (``persistent_workers=workers > 0``).
        shuffle: shuffle each epoch (training) or keep order (validation).
        seed, rank, world_size: sampler and worker seeding.
        drop_last: drop the last incomplete batch.
        pin_memory: page-locked batches; default ``torch.cuda.is_available()``.

    Raises:
        ValueError: ``batch_size < 1``, ``workers < 0``, ``rank`` not in
            ``[0, world_size)``.
    """
    check_loader_args(batch_size, workers, rank, world_size)
    check_batch = getattr(dataset, "check_batch_size", None)  # YOLODataset's (no import circle)
    if check_batch is not None:
        check_batch(batch_size)
    workers = min(workers, usable_cpus())
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    sampler: DistributedSampler[int] = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed
    )
    generator = torch.Generator()
    generator.manual_seed(seed * 1000 + rank)
    return YOLODataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate,
        pin_memory=pin_memory,
        drop_last=drop_last,
        persistent_workers=workers > 0,
        worker_init_fn=functools.partial(seed_worker, seed=seed, rank=rank),
        generator=generator,
    )
