"""The decoded-image caches' shared parts: one memory block for ``cache=ram``, the memory /
disk estimate made before either cache is filled, and the bounded cache of recently decoded
images that every loader process keeps (``cache_recent_mb``).

``cache=ram`` keeps every image decoded and resized once, as uint8, in ONE anonymous
shared memory mapping (``mmap(-1, n)``: ``MAP_SHARED | MAP_ANONYMOUS``). Loader workers
forked after it was filled read the very same pages: the cache is in memory once per
rank, not once per worker (a Python list of arrays is also shared after a fork, until
reference counting and the allocator start copying the pages it touches). Where workers
are spawned instead of forked (macOS, Windows), pickling moves the block into a torch
shared-memory tensor once, and every worker maps that.
"""

from __future__ import annotations

import mmap
import os
import shutil
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CacheEstimate", "RecentImages", "SharedImageCache", "available_memory",
           "estimate_cache"]

#: The RAM cache may take at most this share of the memory available when it starts (the
#: rest is for the model, the optimizer, the loader's batches and everything else).
RAM_SHARE = 0.5
#: The disk cache may take at most this share of the free space of its folder.
DISK_SHARE = 0.9


def available_memory() -> int | None:
    """Bytes of memory available to new allocations (psutil), ``None`` when unknown."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # psutil missing or unsupported platform
        return None


@dataclass(frozen=True)
class CacheEstimate:
    """What a cache needs and what this machine has, in bytes.

    Attributes:
        images: images cached; ``imgsz``: their longest side.
        need: bytes of decoded pixels per copy (``sum(h * w * 3)``).
        copies: copies in memory (one per rank on this machine, none for ``disk``).
        available: bytes available (memory for ``ram``, free disk for ``disk``), or None.
        share: the share of ``available`` the cache may take.
    """

    mode: str
    images: int
    imgsz: int
    need: int
    copies: int
    available: int | None
    share: float

    @property
    def fits(self) -> bool:
        """True when ``need * copies`` is within ``share`` of ``available`` (or unknown)."""
        return self.available is None or self.need * max(self.copies, 1) <= self.share * self.available

    def describe(self) -> str:
        """One line: what the cache needs and what is available."""
        where = "memory" if self.mode == "ram" else "disk space"
        need = _size(self.need)
        if self.copies > 1:
            need += f" x {self.copies} ranks = {_size(self.need * self.copies)}"
        have = ("unknown" if self.available is None
                else f"{_size(self.available)} {where} available, {self.share:.0%} usable")
        return f"cache={self.mode}: {self.images} images at imgsz {self.imgsz} need {need}; {have}"


def _size(nbytes: int) -> str:
    """``nbytes`` in GiB (2 decimals) from 1 GiB on, else in MiB (1 decimal)."""
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def estimate_cache(mode: str, shapes: Sequence[tuple[int, int]], imgsz: int, copies: int = 1,
                   folder: Path | None = None) -> CacheEstimate:
    """The estimate of ``mode`` (``"ram"`` or ``"disk"``) for images of ``shapes`` ``(h, w)``
    (already resized). ``folder``: where the disk cache goes (its free space)."""
    need = int(sum(h * w * 3 for h, w in shapes))
    if mode == "ram":
        return CacheEstimate("ram", len(shapes), imgsz, need, copies, available_memory(), RAM_SHARE)
    free = None
    if folder is not None:
        try:
            free = shutil.disk_usage(folder).free
        except OSError:
            free = None
    return CacheEstimate("disk", len(shapes), imgsz, need + 128 * len(shapes), 1, free, DISK_SHARE)


class SharedImageCache:
    """Images of known shapes in one shared uint8 block (see the module docstring).

    Args:
        shapes: ``(h, w)`` of each image (3 channels).

    ``cache[i]`` is a read-only ``(h, w, 3)`` view into the block.
    """

    def __init__(self, shapes: Sequence[tuple[int, int]]) -> None:
        self.shapes = [(int(h), int(w)) for h, w in shapes]
        sizes = np.array([h * w * 3 for h, w in self.shapes], np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.nbytes = int(self.offsets[-1])
        self._map: Any = mmap.mmap(-1, max(self.nbytes, 1))
        self._flat = np.frombuffer(self._map, np.uint8)

    def fill(self, load: Callable[[int], np.ndarray], threads: int | None = None) -> None:
        """Decode every image with ``load(i)`` (in ``threads`` threads) into the block.

        Raises:
            ValueError: ``load(i)`` returned another shape than ``shapes[i]``.
        """
        def put(i: int) -> None:
            img = load(i)
            want = (*self.shapes[i], 3)
            if img.shape != want or img.dtype != np.uint8:
                raise ValueError(f"image {i}: got {img.shape} {img.dtype}, cache expects {want} uint8")
            self._flat[self.offsets[i] : self.offsets[i + 1]] = img.reshape(-1)

        n = threads or min(8, os.cpu_count() or 1)
        with ThreadPoolExecutor(max_workers=max(1, n)) as pool:
            list(pool.map(put, range(len(self.shapes))))

    def __len__(self) -> int:
        return len(self.shapes)

    def __getitem__(self, i: int) -> np.ndarray:
        h, w = self.shapes[i]
        view = self._flat[self.offsets[i] : self.offsets[i + 1]].reshape(h, w, 3)
        view.flags.writeable = False
        return view

    def address(self) -> int:
        """Address of the block in this process (tests: workers map the same pages)."""
        return int(self._flat.ctypes.data)

    def __getstate__(self) -> dict[str, Any]:
        # spawned workers: hand the block over as a torch shared-memory tensor (fd passing)
        import torch

        block = getattr(self, "_tensor", None)
        if block is None:
            block = torch.from_numpy(self._flat.copy()).share_memory_()
            self._tensor = block
        return {"shapes": self.shapes, "offsets": self.offsets, "nbytes": self.nbytes, "tensor": block}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.shapes, self.offsets, self.nbytes = state["shapes"], state["offsets"], state["nbytes"]
        self._tensor = state["tensor"]
        self._map = None
        self._flat = self._tensor.numpy()


class RecentImages:
    """The decoded, resized images a process used last, up to ``budget`` bytes (LRU).

    An image is decoded again only after it has dropped out: the least recently used one
    goes first when a new one does not fit. What is cached is exactly what decoding returns,
    so samples do not change (no draw depends on it, unlike ``mosaic_buffer``); only their
    cost does. With uniformly drawn mosaic partners a set of ``n`` images whose pixels fit
    the budget is decoded once per process; a larger set hits about ``budget / need`` of the
    time. Ultralytics keeps a comparable store (``BaseDataset.buffer``: the last
    ``min(n, 8 x batch, 1000)`` images each worker decoded), from which it also draws the
    mosaic partners.

    Args:
        budget: bytes of pixels kept at most (``0`` keeps nothing).

    Cached arrays are read-only (``flags.writeable`` is False): whoever changes one works on
    a copy. A pickled cache (a spawned loader worker) arrives empty, with the same budget.
    """

    def __init__(self, budget: int) -> None:
        if budget < 0:
            raise ValueError(f"recent-image cache budget {budget} must be >= 0 bytes")
        self.budget = int(budget)
        self.nbytes = 0
        self.hits = self.misses = 0
        self._images: OrderedDict[int, np.ndarray] = OrderedDict()

    def get(self, i: int, load: Callable[[int], np.ndarray]) -> np.ndarray:
        """Image ``i``, uint8 ``(h, w, 3)``: from the cache (read-only; now the most recent),
        else ``load(i)``, then kept if it fits the budget (the least recently used dropped
        first to make room; one larger than the whole budget is returned, not kept).

        Raises:
            whatever ``load(i)`` raises (nothing is kept then).
        """
        img = self._images.get(i)
        if img is not None:
            self._images.move_to_end(i)
            self.hits += 1
            return img
        self.misses += 1
        img = load(i)
        if img.nbytes > self.budget:
            return img
        while self.nbytes + img.nbytes > self.budget:
            self.nbytes -= self._images.popitem(last=False)[1].nbytes
        img.flags.writeable = False
        self._images[i] = img
        self.nbytes += img.nbytes
        return img

    def __len__(self) -> int:
        return len(self._images)

    def __reduce__(self) -> tuple[type[RecentImages], tuple[int]]:
        return (RecentImages, (self.budget,))
