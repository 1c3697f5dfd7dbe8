"""``loader=gpu``: workers read file bytes, the device decodes and augments the batch.

Pipeline of one batch (:class:`GPULoader`):

1. loader workers (:class:`~libreyolo_core.data.gpu_plan.EncodedDataset`): the sample's
   random draws and final boxes (the CPU pipeline's functions) and the encoded bytes of the
   tiles the warp can see;
2. this process, on the device: one batched ``torchvision.io.decode_jpeg(list,
   device=dev)`` (nvjpeg on CUDA), an antialiased resize per image (longest side ``S``),
   the tiles pasted on ``2S x 2S`` canvases, ONE ``grid_sample`` warp per canvas with
   placement, random affine/perspective and flips composed into one matrix, the mixup blend
   and the HSV shift (:mod:`libreyolo_core.data.gpu_augment`);
3. a :class:`~libreyolo_core.data.loader.Batch` with uint8 images ``(B, 3, S, S)`` and the
   targets already on the device, as the trainer consumes it.

Step 2 runs in a background thread, one batch ahead (``prefetch=1``), so the training
step waits for the loader only when it falls behind; on CUDA its work goes to a side
stream that the consumer's stream then waits on (an event per batch), so a synchronising
call inside the loader (a decode, a copy) never waits for the training step queued before
it. Files nvjpeg should not decode (grey, CMYK or RGB-coded JPEGs, PNG,
truncated or EXIF-rotated JPEGs) are decoded on the host by the CPU path's decoder (said once).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.profiler import record_function
from torch.utils.data import DataLoader, DistributedSampler

from libreyolo_core.data import gpu_augment as G
from libreyolo_core.data.dataset import YOLODataset
from libreyolo_core.data.gpu_plan import EncodedBatch, EncodedDataset, collate_encoded
from libreyolo_core.data.loader import Batch, YOLODataLoader, check_loader_args, seed_worker
from libreyolo_core.data.workers import usable_cpus

__all__ = ["GPUAugmenter", "GPULoader", "build_gpu_dataloader"]

log = logging.getLogger(__name__)


class GPUAugmenter:
    """Render an :class:`~libreyolo_core.data.gpu_plan.EncodedBatch` on ``device``.

    Args:
        imgsz: the output side ``S``.
        device: where decode and augmentation run (a CPU device runs the same tensor code).
    """

    def __init__(self, imgsz: int, device: torch.device | str) -> None:
        self.imgsz = int(imgsz)
        self.device = torch.device(device)
        self.host_decoded = 0  # tiles decoded on the host so far (the first one is logged)

    def __call__(self, eb: EncodedBatch, dataset: YOLODataset) -> Batch:
        """The batch's images and targets on the device.

        Returns:
            :class:`Batch`: ``images`` uint8 ``(B, 3, S, S)`` RGB and ``targets`` float32
            ``(N, 6)`` ``[batch_idx, cls, x1, y1, x2, y2]`` on ``device``; ``metas`` on the host.
        """
        s, dev = self.imgsz, self.device
        tiles = self._tiles(eb, dataset)
        layers: list[list[tuple[torch.Tensor, int, int, int, int, int, int]]] = []
        ms = []
        for plan in eb.plans:
            for layer in plan.layers:
                layers.append([(tiles[j], x1a, y1a, x2a, y2a, x1b, y1b)
                               for j, x1a, y1a, x2a, y2a, x1b, y1b in layer.tiles])
                ms.append(layer.m)
        canvas = G.build_canvases(layers, 2 * s, dev)
        out = G.warp(canvas, G.inverse_matrices(ms, dev), s)
        del canvas
        first = np.cumsum([0] + [len(p.layers) for p in eb.plans])[:-1]
        imgs = out[self._index(first)] if len(out) != len(eb.plans) else out
        mixed = np.array([k for k, p in enumerate(eb.plans) if len(p.layers) == 2], np.int64)
        if len(mixed):
            ratio = G.to_device(np.array([eb.plans[k].ratio for k in mixed]), dev)
            imgs[self._index(mixed)] = G.blend(out[self._index(first[mixed])],
                                               out[self._index(first[mixed] + 1)], ratio)
        jitter = np.array([k for k, p in enumerate(eb.plans) if p.hsv is not None], np.int64)
        if len(jitter):
            deltas = G.to_device(np.array([eb.plans[k].hsv for k in jitter]), dev)
            idx = self._index(jitter)
            imgs[idx] = G.apply_hsv(imgs[idx], deltas)
        targets = [np.concatenate([np.full((len(p.labels), 1), k, np.float32), p.labels], 1)
                   for k, p in enumerate(eb.plans)]
        target = G.to_device(np.concatenate(targets, 0).reshape(-1, 6), dev)
        return Batch(imgs.to(torch.uint8), target, [p.meta for p in eb.plans])

    def _tiles(self, eb: EncodedBatch, dataset: YOLODataset) -> dict[int, torch.Tensor]:
        """Every tile of the batch decoded and resized on the device: float ``(3, h, w)``."""
        jpeg = [j for j, (kind, _, _) in eb.tiles.items() if kind == "jpeg"]
        decoded = G.decode_jpegs([eb.tiles[j][1] for j in jpeg], self.device)
        out: dict[int, torch.Tensor] = {}
        for j, img in zip(jpeg, decoded, strict=True):
            hw = dataset._target_hw(j)
            if img is None:  # the device decoder refused it: the CPU path's decoder
                self._say_host(dataset, j, "the device decoder refused it")
                out[j] = self._upload(dataset.load_image(j))
            else:
                out[j] = G.resize_to(img, hw)
        for j, (kind, pixels, reason) in eb.tiles.items():
            if kind == "pixels":
                if reason is not None:
                    self._say_host(dataset, j, reason)
                out[j] = self._upload(pixels.numpy())
        return out

    def _index(self, idx: np.ndarray) -> torch.Tensor:
        """Host indices as a long tensor on the device (no wait: pinned, asynchronous)."""
        return G.to_device(np.asarray(idx, np.int64), self.device, torch.long)

    def _upload(self, img: np.ndarray) -> torch.Tensor:
        """A host-decoded ``(h, w, 3)`` uint8 tile as float ``(3, h, w)`` on the device."""
        return G.to_device(img, self.device, torch.uint8).permute(2, 0, 1).float()

    def _say_host(self, dataset: YOLODataset, j: int, reason: str) -> None:
        if self.host_decoded == 0:
            log.warning("loader=gpu: %s is decoded on the host (%s), and so is every other "
                        "such file (said once)", dataset.records[j].im_file, reason)
        self.host_decoded += 1


class GPULoader:
    """An iterable of device-side :class:`Batch` objects: a worker ``DataLoader`` over an
    :class:`EncodedDataset` plus a :class:`GPUAugmenter`. Has what the trainer reads of a
    loader: ``len()``, ``sampler`` (``set_epoch``), ``num_workers``, ``batch_size``,
    ``dataset`` (the wrapped :class:`YOLODataset`).

    Args:
        prefetch: batches rendered ahead by a background thread (on CUDA, on a side stream)
            while the consumer works on the current one; 0 renders each batch inside
            ``next()``. The consumer waits (the profiler's ``dataload``) only when the
            loader falls behind; the thread's work is labelled ``loader/gpu_augment`` in a
            torch.profiler trace.
    """

    def __init__(self, loader: DataLoader, dataset: YOLODataset, augmenter: GPUAugmenter,
                 prefetch: int = 1) -> None:
        if prefetch < 0:
            raise ValueError(f"prefetch={prefetch} must be >= 0")
        self.loader, self.dataset, self.augmenter = loader, dataset, augmenter
        self.sampler = loader.sampler
        self.num_workers = loader.num_workers
        self.batch_size = loader.batch_size
        self.device = augmenter.device
        self.prefetch = int(prefetch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Batch]:
        side = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        if self.prefetch == 0:
            for eb in self.loader:
                batch, event = self._render(eb, side)
                yield self._hand_over(batch, event, side)
            return
        yield from self._prefetched(side)

    def _render(self, eb: EncodedBatch, side: Any) -> tuple[Batch, Any]:
        """Render one batch (on ``side`` when given); returns it and an event recorded
        after its last kernel (None on the CPU)."""
        ctx = torch.cuda.stream(side) if side is not None else contextlib.nullcontext()
        with ctx, torch.no_grad(), record_function("loader/gpu_augment"):
            batch = self.augmenter(eb, self.dataset)
            event = None
            if side is not None:
                event = torch.cuda.Event()
                event.record(side)
        return batch, event

    def _hand_over(self, batch: Batch, event: Any, side: Any) -> Batch:
        """Make the consumer's stream wait for the batch, and keep its memory alive for it."""
        if side is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            batch.images.record_stream(current)
            batch.targets.record_stream(current)
        return batch

    def _prefetched(self, side: Any) -> Iterator[Batch]:
        """Batches rendered by a background thread, ``prefetch`` ahead. Closing the
        generator (a loop that breaks) stops the thread and waits for it, so the next
        epoch's iterator never shares the worker loader with it."""
        q: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def put(item: tuple[str, Any]) -> bool:
            return _put_unless_stopped(q, item, stop)

        def produce() -> None:
            try:
                for eb in batches:
                    if not put(("batch", self._render(eb, side))):
                        return
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
                put(("error", exc))
                return
            put(("end", None))

        # the worker processes fork here, in the consumer's thread, not in the producer
        batches = iter(self.loader)
        thread = threading.Thread(target=produce, name="gpu-loader", daemon=True)
        thread.start()
        try:
            while True:
                kind, item = q.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise item
                batch, event = item
                yield self._hand_over(batch, event, side)
        finally:
            stop.set()
            thread.join(timeout=120)
            if thread.is_alive():
                log.warning("loader=gpu: the prefetch thread did not stop within 120 s")


def _put_unless_stopped(q: queue.Queue[tuple[str, Any]], item: tuple[str, Any],
                        stop: threading.Event) -> bool:
    """Put ``item`` on the full-able queue ``q``, retrying every 0.1 s; ``False`` (not put) once
    ``stop`` is set."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def build_gpu_dataloader(dataset: YOLODataset, batch_size: int, workers: int, device: torch.device | str,
                         seed: int = 0, rank: int = 0, world_size: int = 1,
                         drop_last: bool = False, prefetch: int = 1) -> GPULoader:
    """The ``loader=gpu`` training loader for one rank (same sampler, seeding and epoch
    protocol as :func:`~libreyolo_core.data.loader.build_dataloader`, shuffled).

    Args:
        dataset: an augmenting :class:`YOLODataset` without a mosaic buffer.
        batch_size: images per batch on this rank. workers: file-reading worker processes
            (clamped to the usable CPUs; 0 reads in this process).
        device: where decoding and augmentation run (the training device).
        prefetch: batches rendered ahead in a background thread (:class:`GPULoader`).

    Raises:
        ValueError: a non-augmenting dataset, a mosaic buffer, ``batch_size < 1``,
            ``workers < 0`` or a rank outside ``[0, world_size)``.
    """
    check_loader_args(batch_size, workers, rank, world_size)
    encoded = EncodedDataset(dataset)
    workers = min(workers, usable_cpus())
    sampler: DistributedSampler[int] = DistributedSampler(encoded, num_replicas=world_size, rank=rank,
                                                          shuffle=True, seed=seed)
    generator = torch.Generator()
    generator.manual_seed(seed * 1000 + rank)
    loader = YOLODataLoader(encoded, batch_size=batch_size, sampler=sampler, num_workers=workers,
                            collate_fn=collate_encoded, pin_memory=False, drop_last=drop_last,
                            persistent_workers=workers > 0,
                            worker_init_fn=functools.partial(seed_worker, seed=seed, rank=rank),
                            generator=generator)
    return GPULoader(loader, dataset, GPUAugmenter(dataset.imgsz, device), prefetch=prefetch)
