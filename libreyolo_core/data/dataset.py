"""``YOLODataset``: images + boxes -> fixed-size uint8 samples, with YOLO augmentation.

``dataset[i] -> (image, labels, meta)``:

- ``image``: ``torch.uint8 (3, S, S)`` RGB, contiguous;
- ``labels``: ``torch.float32 (n, 5)`` ``[cls, x1, y1, x2, y2]`` in pixels of the ``S x S``
  canvas;
- ``meta``: ``{"path": str, "orig_shape": (h0, w0), "ratio": float, "pad": (left, top),
  "mosaic": bool}``; ``ratio``/``pad`` are the letterbox geometry (a canvas point maps to
  the original image as ``x0 = (x - left) / ratio``) and are exact for non-augmented
  samples; ``mosaic`` says whether this sample is a mosaic.

Without augmentation a sample is the image resized (longest side ``S``) and letterboxed
(centred, pad 114). With augmentation (training): mosaic of 4 images + random affine
(probability ``aug.mosaic``) or letterbox, then mixup (``aug.mixup``, keeps both
label sets), HSV jitter, vertical and horizontal flips. Family-specific normalisation
(RGB/255, BGR) happens on the device in the family's ``preprocess``, not here.

Determinism: the randomness of sample ``i`` is ``np.random.default_rng([seed, rank, epoch,
i])``, so loader workers, resumed runs and DDP ranks produce identical samples regardless
of worker count or order. ``epoch`` and the mosaic switch live in a shared-memory tensor:
``set_epoch(e)`` / ``close_mosaic()`` in the main process are seen by persistent loader
workers (set them BEFORE creating the epoch's iterator, i.e. before ``iter(loader)``).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import cv2
import numpy as np
import torch
from torch.utils.data import Dataset

from libreyolo_core.config import AugmentConfig
from libreyolo_core.data import augment as A
from libreyolo_core.data.image import (
    load_image_fast as load_image,  # Pillow-exact, OpenCV for JPEGs
)
from libreyolo_core.data.image_cache import RecentImages, SharedImageCache, estimate_cache
from libreyolo_core.data.loader import Batch, batch_targets
from libreyolo_core.data.report import DatasetWarning, ImageRecord, ScanReport
from libreyolo_core.data.scan_cache import writable_dir
from libreyolo_core.data.workers import local_ranks, usable_cpus

__all__ = ["BatchPartners", "MosaicBuffer", "YOLODataset"]

logger = logging.getLogger(__name__)

#: Boxes narrower or lower than this (pixels) are dropped from augmented samples.
MIN_BOX_SIDE = 1.0
#: ``mosaic_partners="batch"`` applies to batches of at least this many samples.
MIN_BATCH_PARTNERS = 8

CacheMode = Literal[False, "ram", "disk"]


@dataclass
class _MosaicPlan:
    """One mosaic's draws: tile indices (the sample's own first), centre, warp, scale."""

    idx: list[int]
    centre: tuple[int, int]
    m: np.ndarray
    scale: float


class MosaicBuffer:
    """Ultralytics' mosaic buffer (``aug.mosaic_buffer > 0``; off by default).

    The sample's own image is pushed into a FIFO of the last ``size`` images this process
    loaded for mosaics, whose decoded pixels it keeps; the mosaic's other three tiles are
    drawn uniformly from that FIFO instead of from the whole dataset, so about one image is
    decoded per mosaic instead of four (Ultralytics ``BaseDataset.buffer``, at most
    ``min(n, 8 x batch, 1000)`` there).

    Effect on randomness (why it is a setting and not the default): the three partner
    tiles come from the ``size`` images this worker loaded last, not from the whole
    dataset, so partners are correlated with the sampler order, and a sample depends on
    what its worker loaded before it. Samples are therefore no longer a pure function of
    ``(seed, rank, epoch, index)``: they change with the number of workers and differ
    between a run and its resume. Memory: ``size`` decoded images per worker.
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"mosaic buffer size {size} must be >= 1")
        self.size = int(size)
        self.order: deque[int] = deque()
        self.images: dict[int, np.ndarray] = {}

    def draw(self, i: int, rng: np.random.Generator) -> list[int]:
        """Push image ``i``, then draw the three partner tiles from the buffer."""
        if i not in self.images and i not in self.order:
            self.order.append(i)
            while len(self.order) > self.size:
                self.images.pop(self.order.popleft(), None)
        return [self.order[int(p)] for p in rng.integers(0, len(self.order), size=3)]

    def image(self, j: int, load: Callable[[int], np.ndarray]) -> np.ndarray:
        """Image ``j``'s pixels, decoded once while ``j`` is in the buffer."""
        img = self.images.get(j)
        if img is None:
            img = load(j)
            if j in self.order:
                self.images[j] = img
        return img


class BatchPartners:
    """``aug.mosaic_partners="batch"``: a mosaic's three partner tiles (and a mixup's
    partner) are drawn from the other samples of the same batch, whose images the batch
    decodes anyway, instead of from the whole dataset; each image is decoded once per batch.

    Effect on randomness: a sample still depends only on ``(seed, rank, epoch, index)`` and
    the batch it is in, which the seeded sampler fixes, so samples stay the same for any
    number of workers, across a resume and on every rank; what differs from the default is
    which images meet in a mosaic (images of one shuffled batch, not of the whole set).
    Batches of fewer than :data:`MIN_BATCH_PARTNERS` samples (a small ``batch``, the last
    partial batch) draw from the dataset as by default.
    """

    def __init__(self, indices: Sequence[int]) -> None:
        self.indices = [int(i) for i in indices]
        self.pos = 0
        self.images: dict[int, np.ndarray] = {}

    def draw(self, rng: np.random.Generator, k: int) -> list[int]:
        """``k`` partner indices for the sample at :attr:`pos`, uniform over the others."""
        others = self.indices[: self.pos] + self.indices[self.pos + 1 :]
        return [others[int(p)] for p in rng.integers(0, len(others), size=k)]

    def image(self, j: int, load: Callable[[int], np.ndarray]) -> np.ndarray:
        """Image ``j``'s pixels, decoded once per batch."""
        img = self.images.get(j)
        if img is None:
            img = self.images[j] = load(j)
        return img


class YOLODataset(Dataset):
    """YOLO detection dataset over scanned records (see module docstring for the sample).

    Args:
        records_or_report: a :class:`ScanReport` (from ``scan_images``) or a sequence of
            :class:`ImageRecord`.
        imgsz: output side ``S`` in pixels.
        augment: training augmentation on/off (off = letterbox only, for validation).
        aug: the augmentation recipe (:class:`~libreyolo_core.config.AugmentConfig`, already
            validated; a training run passes ``cfg.augment``); ``None`` takes its defaults.
            Unused when ``augment`` is False.
        cache: ``False``; ``"ram"`` (images decoded and resized once at construction into
            one shared memory block, :class:`~libreyolo_core.data.image_cache.SharedImageCache`,
            that loader workers read without copying); ``"disk"`` (``<image>.<S>.npy`` next
            to each image, written on first use, reused while newer than the image). The
            memory or disk needed is estimated and logged first; a RAM cache that does not
            fit falls back to disk, a disk cache that does not fit (or a read-only folder)
            is disabled, each with one warning.
        seed, rank: part of every sample's random seed (see module docstring).
        cache_dir: with ``cache="disk"``, keep the ``.npy`` files in
            ``<cache_dir>/images/`` (named by the image's path, size and mtime) instead of
            next to the images: nothing is written into the dataset's folders.
        cache_recent_mb: MiB of recently decoded (or disk-cached) images this process keeps
            (:class:`~libreyolo_core.data.image_cache.RecentImages`; each loader worker its
            own); ``0`` (the default here; training passes ``TrainConfig.cache_recent_mb``)
            keeps none. Unused with ``cache="ram"``. Samples are the same either way.

    Raises:
        ValueError: empty records, ``imgsz < 32`` or a bad ``cache`` value.
    """

    def __init__(
        self,
        records_or_report: ScanReport | Sequence[ImageRecord],
        imgsz: int,
        augment: bool,
        aug: AugmentConfig | None = None,
        cache: CacheMode | bool | str | None = False,
        seed: int = 0,
        rank: int = 0,
        cache_dir: str | Path | None = None,
        cache_recent_mb: float = 0,
    ) -> None:
        self.cache_dir = None if cache_dir is None else Path(cache_dir) / "images"
        if isinstance(records_or_report, ScanReport):
            self.records = list(records_or_report.records)
            self.names: dict[int, str] | None = dict(records_or_report.names)
        else:
            self.records = list(records_or_report)
            self.names = None
        if not self.records:
            raise ValueError("YOLODataset needs at least one image record")
        if int(imgsz) < 32:
            raise ValueError(f"imgsz={imgsz} must be >= 32")
        if seed < 0 or rank < 0:
            raise ValueError(f"seed={seed} and rank={rank} must be >= 0")
        if cache_recent_mb < 0:
            raise ValueError(f"cache_recent_mb={cache_recent_mb} must be >= 0")
        self.imgsz = int(imgsz)
        self.augment = bool(augment)
        self.aug = aug if aug is not None else AugmentConfig()
        self.seed, self.rank = int(seed), int(rank)
        # [epoch, mosaic_closed]; shared memory so persistent workers see updates.
        self._state = torch.zeros(2, dtype=torch.int64).share_memory_()
        self.cache = _parse_cache(cache)
        self._ram: SharedImageCache | None = None
        buffer = min(int(getattr(self.aug, "mosaic_buffer", 0)), len(self.records))
        self._buffer = MosaicBuffer(buffer) if self.augment and buffer > 0 else None
        self._partners: BatchPartners | None = None  # set while __getitems__ builds a batch
        self._canvas: np.ndarray | None = None  # mosaic canvas scratch, per process (not pickled)
        if self.cache == "ram":
            self._fill_ram_cache()
        budget = int(cache_recent_mb * 2**20)
        self._recent = RecentImages(budget) if budget > 0 and self._ram is None else None
        if self.cache == "disk":
            self._check_disk_cache()

    # ------------------------------------------------------------------ state
    def set_epoch(self, epoch: int) -> None:
        """Set the epoch used in the per-sample seed (call before iterating the epoch)."""
        if epoch < 0:
            raise ValueError(f"epoch={epoch} must be >= 0")
        self._state[0] = int(epoch)

    @property
    def epoch(self) -> int:
        """Current epoch (as set by :meth:`set_epoch`)."""
        return int(self._state[0])

    def close_mosaic(self) -> None:
        """Turn mosaic AND mixup off for the rest of training (the last ``no_aug_epochs``)."""
        self._state[1] = 1

    @property
    def mosaic_enabled(self) -> bool:
        """False after :meth:`close_mosaic`."""
        return int(self._state[1]) == 0

    # ------------------------------------------------------------------ loading
    def __len__(self) -> int:
        return len(self.records)

    def _target_hw(self, i: int) -> tuple[int, int]:
        h0, w0 = self.records[i].shape
        r = self.imgsz / max(h0, w0)
        return max(1, round(h0 * r)), max(1, round(w0 * r))

    def _decode_resized(self, i: int) -> np.ndarray:
        rec = self.records[i]
        img = load_image(rec.im_file, max_side=self.imgsz, truncated_ok=True)
        h, w = self._target_hw(i)
        if img.shape[:2] != (h, w):
            shrink = h * w < img.shape[0] * img.shape[1]
            interp = cv2.INTER_AREA if shrink else cv2.INTER_LINEAR
            img = cv2.resize(img, (w, h), interpolation=interp)
        return img

    def load_image(self, i: int) -> np.ndarray:
        """Image ``i`` resized so its longest side is ``S``: uint8 ``(h, w, 3)`` RGB.

        INTER_AREA when shrinking, INTER_LINEAR when growing; served from the cache if on,
        else from the recently decoded images (``cache_recent_mb``). Read-only when cached.
        """
        if self._ram is not None:
            return self._ram[i]
        load = self._load_disk if self.cache == "disk" else self._decode_resized
        if self._recent is not None:
            return self._recent.get(i, load)
        return load(i)

    def load_labels(self, i: int) -> np.ndarray:
        """Boxes of image ``i`` as float32 ``(n, 5)`` ``[cls, x1, y1, x2, y2]`` in pixels of
        the resized image returned by :meth:`load_image`."""
        lab = self.records[i].labels
        h, w = self._target_hw(i)
        out = np.empty((len(lab), 5), np.float32)
        out[:, 0] = lab[:, 0]
        out[:, 1] = (lab[:, 1] - lab[:, 3] / 2) * w
        out[:, 2] = (lab[:, 2] - lab[:, 4] / 2) * h
        out[:, 3] = (lab[:, 1] + lab[:, 3] / 2) * w
        out[:, 4] = (lab[:, 2] + lab[:, 4] / 2) * h
        return out

    def _disk_path(self, i: int) -> Path:
        f = self.records[i].im_file
        if self.cache_dir is not None:
            try:
                st = f.stat()
                stamp = f"{st.st_size}\0{st.st_mtime_ns}"
            except OSError:
                stamp = ""
            key = hashlib.sha256(f"{os.path.realpath(f)}\0{stamp}".encode()).hexdigest()[:40]
            return self.cache_dir / f"{key}.{self.imgsz}.npy"
        return f.with_name(f"{f.name}.{self.imgsz}.npy")

    def _disk_writable(self) -> bool:
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        dirs = [str(self.cache_dir)] if self.cache_dir is not None else \
            sorted({str(r.im_file.parent) for r in self.records})
        bad = [d for d in dirs if not writable_dir(Path(d))]
        if bad:
            warnings.warn(
                f"{bad[0]}: folder is not writable; disk image cache disabled "
                f"({len(bad)} read-only folder(s)), images will be decoded every time",
                DatasetWarning,
                stacklevel=3,
            )
            return False
        return True

    def _load_disk(self, i: int) -> np.ndarray:
        src, npy = self.records[i].im_file, self._disk_path(i)
        try:
            if npy.stat().st_mtime_ns >= src.stat().st_mtime_ns:
                img = np.load(npy, allow_pickle=False)
                if img.dtype == np.uint8 and img.shape == (*self._target_hw(i), 3):
                    return img
        except (OSError, ValueError):
            pass  # missing or corrupt: rebuild below
        img = self._decode_resized(i)
        tmp = npy.with_name(f".{npy.name}.{os.getpid()}.tmp.npy")
        try:
            np.save(tmp, img, allow_pickle=False)
            os.replace(tmp, npy)
        except OSError as e:
            logger.debug("cannot write disk cache %s: %s", npy, e)
            tmp.unlink(missing_ok=True)
        return img

    def _recent_need(self) -> int:
        """Bytes of every image's decoded pixels (what the recent store would need)."""
        return estimate_cache("ram", self._shapes(), self.imgsz).need

    def recent_fits(self) -> bool | None:
        """Whether every image fits the store of recently decoded images
        (``cache_recent_mb``), so each is decoded once per loader process; ``None``
        without the store."""
        return None if self._recent is None else self._recent_need() <= self._recent.budget

    def describe_recent(self) -> str | None:
        """One line on the recently decoded images each loader process keeps
        (``cache_recent_mb``): the budget, what the whole set needs, and whether it fits;
        ``None`` when there is no such cache."""
        if self._recent is None:
            return None
        mib = 2**20
        need = self._recent_need()
        fits = ("all fit: each image is decoded once per loader process" if need <= self._recent.budget
                else f"about {min(99, int(100 * self._recent.budget / need))}% of decodes are saved")
        return (f"cache_recent_mb={self._recent.budget // mib}: recently decoded images kept per "
                f"loader process; the {len(self)} images at imgsz {self.imgsz} need "
                f"{need / mib:.0f} MiB, {fits}")

    def _shapes(self) -> list[tuple[int, int]]:
        return [self._target_hw(i) for i in range(len(self))]

    def _disk_folder(self) -> Path:
        """Where the disk cache's ``.npy`` files go (for the free-space estimate)."""
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            return self.cache_dir
        return self.records[0].im_file.parent

    def _check_disk_cache(self) -> None:
        """Refuse ``cache=disk`` (one warning, images decoded every time) where a folder is
        read-only or the estimate does not fit the free space; else log the estimate."""
        if not self._disk_writable():
            self.cache = False
            return
        est = estimate_cache("disk", self._shapes(), self.imgsz, folder=self._disk_folder())
        if not est.fits:
            warnings.warn(f"{est.describe()}: it does not fit; disk image cache disabled, images "
                          "will be decoded every time", DatasetWarning, stacklevel=4)
            self.cache = False
            return
        logger.info(est.describe())

    def _fill_ram_cache(self) -> None:
        """Estimate, say, then decode every image once into shared memory; fall back to
        ``cache=disk`` (or no cache) with one warning when the estimate does not fit."""
        shapes = self._shapes()
        est = estimate_cache("ram", shapes, self.imgsz, copies=local_ranks())
        if not est.fits:
            disk = estimate_cache("disk", shapes, self.imgsz, folder=self._disk_folder())
            to_disk = disk.fits and self._disk_writable()
            where = "next to the images" if self.cache_dir is None else "in the cache folder"
            then = (f"falling back to cache=disk (.npy files {where})" if to_disk
                    else "caching disabled, images will be decoded every time")
            warnings.warn(f"{est.describe()}: it does not fit; {then}", DatasetWarning, stacklevel=4)
            self.cache = "disk" if to_disk else False
            return
        logger.info(est.describe())
        cache = SharedImageCache(shapes)
        cache.fill(self._decode_resized, threads=usable_cpus())
        self._ram = cache
        logger.info("cached %d images in shared memory (%.2f GiB)", len(self), cache.nbytes / 2**30)

    # ------------------------------------------------------------------ samples
    def _letterboxed(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        img, lab, _, _ = A.letterbox(self.load_image(i), self.imgsz, self.load_labels(i))
        assert lab is not None
        return img, lab

    def _mosaic_plan(self, i: int, rng: np.random.Generator) -> _MosaicPlan:
        """The draws of one mosaic + affine (tiles, centre, matrix), in the order the
        pipeline has always made them; no pixels are touched yet."""
        h, s = self.aug, self.imgsz
        if self._buffer is not None:
            others = self._buffer.draw(i, rng)
        elif self._partners is not None:
            others = self._partners.draw(rng, 3)
        else:
            others = [int(j) for j in rng.integers(0, len(self), size=3)]
        idx = [i, *others]
        centre = A.mosaic_centre(rng, s)
        m, scale = A.affine_matrix(rng, 2 * s, 2 * s, s, degrees=h.degrees, translate=h.translate,
                                   scale=h.scale, shear=h.shear, perspective=h.perspective)
        return _MosaicPlan(idx, centre, m, scale)

    def _render_mosaic(self, plan: _MosaicPlan, flip: np.ndarray,
                       out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Pixels and boxes of a planned mosaic, mirrored by ``flip`` in the same warp.

        Only the part of the canvas the warp reads is built, and only the tiles that part
        shows are decoded (:func:`~libreyolo_core.data.augment.mosaic_crop`): the result is
        what the full canvas + warp + flips give (see ``warp_mosaic`` on rotations). The
        warp writes into ``out`` (a batch slot) when given; the canvas is built in this
        process's scratch."""
        s, persp = self.imgsz, self.aug.perspective
        rects = A.mosaic_rects([self._target_hw(j) for j in plan.idx], s, plan.centre)
        m = flip @ plan.m
        crop, needed = A.mosaic_crop(rects, m, s, s, persp)
        tiles = [self._tile(j) if need else None for j, need in zip(plan.idx, needed, strict=True)]
        if self._canvas is None:
            self._canvas = np.empty(4 * s * s * 3, np.uint8)
        img = A.warp_mosaic(tiles, rects, crop, m, s, persp, out=out, scratch=self._canvas)
        labels = A.mosaic_labels([self.load_labels(j) for j in plan.idx], rects)
        return img, A.warp_boxes(labels, m, plan.scale, s, persp)

    def _tile(self, j: int) -> np.ndarray:
        if self._buffer is not None:
            return self._buffer.image(j, self.load_image)
        if self._partners is not None:
            return self._partners.image(j, self.load_image)
        return self.load_image(j)

    def _partner(self, rng: np.random.Generator) -> int:
        """One partner index (a mixup's): from the batch with ``mosaic_partners="batch"``."""
        if self._partners is not None:
            return self._partners.draw(rng, 1)[0]
        return int(rng.integers(0, len(self)))

    def _augmented(self, i: int, rng: np.random.Generator,
                   out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, bool]:
        """Sample ``i`` augmented: image, labels, whether it is a mosaic. A mosaic is rendered
        into ``out`` (then returned as the image) when given; other samples are not."""
        h = self.aug
        mosaic_on = self.mosaic_enabled
        use_mosaic = mosaic_on and h.mosaic > 0 and rng.random() < h.mosaic
        if not use_mosaic:
            img, lab = self._letterboxed(i)
            if mosaic_on and h.mixup > 0 and rng.random() < h.mixup:
                img2, lab2 = self._letterboxed(self._partner(rng))
                img, lab = A.mixup(img, lab, img2, lab2, rng)
            if h.hsv_prob > 0 and rng.random() < h.hsv_prob:
                img = A.augment_hsv(img, rng, h.hsv_h, h.hsv_s, h.hsv_v)
            if h.flipud > 0 and rng.random() < h.flipud:
                img, lab = A.flipud(img, lab)
            if h.fliplr > 0 and rng.random() < h.fliplr:
                img, lab = A.fliplr(img, lab)
        else:
            # every draw first (none depends on pixels), then one warp per mosaic with the
            # flips folded in; the draws are the ones, in the order, of mosaic4 ->
            # random_affine -> mixup -> augment_hsv -> flipud -> fliplr
            plan = self._mosaic_plan(i, rng)
            plan2, ratio = None, 0.0
            if h.mixup > 0 and rng.random() < h.mixup:
                plan2 = self._mosaic_plan(self._partner(rng), rng)
                ratio = float(rng.beta(32.0, 32.0))
            hsv = (A.hsv_deltas(rng, h.hsv_h, h.hsv_s, h.hsv_v)
                   if h.hsv_prob > 0 and rng.random() < h.hsv_prob else None)
            ud = h.flipud > 0 and rng.random() < h.flipud
            lr = h.fliplr > 0 and rng.random() < h.fliplr
            flip = A.flip_matrix(self.imgsz, lr, ud)
            # img is a new array or out: either way this sample's own, changed in place
            img, lab = self._render_mosaic(plan, flip, out)
            if plan2 is not None:
                img2, lab2 = self._render_mosaic(plan2, flip)
                img = A.blend(img, img2, ratio, inplace=True)
                lab = np.concatenate([lab, lab2], 0).astype(np.float32)
            if hsv is not None:
                img = A.apply_hsv(img, *hsv, inplace=True)
        keep = (lab[:, 3] - lab[:, 1] > MIN_BOX_SIDE) & (lab[:, 4] - lab[:, 2] > MIN_BOX_SIDE)
        return img, lab[keep], use_mosaic

    def _sample(self, index: int, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """Sample ``index`` before it becomes tensors: ``(H, W, 3)`` uint8 RGB, ``(n, 5)``
        labels, meta. A mosaic is written into ``out`` (``(S, S, 3)`` uint8) when given, and
        ``out`` returned as the image; otherwise the image is a new array."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} images")
        index = index % len(self)
        rec = self.records[index]
        h0, w0 = rec.shape
        nh, nw = self._target_hw(index)
        meta: dict[str, Any] = {
            "path": str(rec.im_file),
            "orig_shape": (h0, w0),
            "ratio": self.imgsz / max(h0, w0),
            "pad": ((self.imgsz - nw) // 2, (self.imgsz - nh) // 2),
            "mosaic": False,
        }
        if self.augment:
            rng = np.random.default_rng([self.seed, self.rank, self.epoch, index])
            img, lab, meta["mosaic"] = self._augmented(index, rng, out)
        else:
            img, lab = self._letterboxed(index)
        return img, np.ascontiguousarray(lab, dtype=np.float32).reshape(-1, 5), meta

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Sample ``index`` (see the module docstring for shapes and units)."""
        img, lab, meta = self._sample(index)
        image = torch.empty((3, *img.shape[:2]), dtype=torch.uint8)
        _to_chw(img, image.numpy())
        return image, torch.from_numpy(lab), meta

    def check_batch_size(self, batch_size: int) -> None:
        """One :class:`DatasetWarning` when ``mosaic_partners="batch"`` cannot apply: this
        rank's batches hold fewer than :data:`MIN_BATCH_PARTNERS` samples (a global
        ``batch`` is split among the ranks). Called by ``build_dataloader``."""
        if self.augment and self.aug.mosaic_partners == "batch" and batch_size < MIN_BATCH_PARTNERS:
            warnings.warn(f"mosaic_partners=batch needs batches of {MIN_BATCH_PARTNERS} or more; this "
                          f"rank's batches hold {batch_size}, so mosaic partners are drawn from the "
                          "whole dataset (as mosaic_partners=dataset)", DatasetWarning, stacklevel=4)

    def __getitems__(self, indices: list[int]) -> Batch:
        """A whole batch (``DataLoader`` calls this instead of ``__getitem__`` per index):
        the same samples, in the same order, but each image is written straight into its
        slot of one ``uint8 (B, 3, S, S)`` tensor in channels-last memory (strides of
        ``(B, S, S, 3)``: a mosaic's warp writes its slot directly, then mixup and HSV
        change it in place; other samples are one copy, no transpose), so no per-sample
        image tensor is made and the collate does not copy them again with ``torch.stack``;
        a channels-last network (``channels_last``) reads it without a reorder. In a loader worker
        the batch tensor is allocated in shared memory, as ``default_collate`` does, so
        sending it to the training process does not copy it either. With
        ``aug.mosaic_partners="batch"`` the mosaics draw their partners from this batch
        (:class:`BatchPartners`).

        Raises:
            IndexError: an index out of range. ValueError: no indices.
        """
        if not len(indices):
            raise ValueError("__getitems__() got no indices")
        s = self.imgsz
        hwc = _batch_tensor((len(indices), s, s, 3))
        labels, metas = [], []
        if self.augment and self.aug.mosaic_partners == "batch" and len(indices) >= MIN_BATCH_PARTNERS:
            self._partners = BatchPartners([i % len(self) for i in indices])
        try:
            for k, index in enumerate(indices):
                if self._partners is not None:
                    self._partners.pos = k
                slot = hwc[k].numpy()
                img, lab, meta = self._sample(index, slot)
                if img is not slot:
                    _to_hwc(img, slot)
                labels.append(torch.from_numpy(lab))
                metas.append(meta)
        finally:
            self._partners = None
        return Batch(hwc.permute(0, 3, 1, 2), batch_targets(labels), metas)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (spawned loader workers, DDP ranks) without the per-process canvas scratch."""
        state = self.__dict__.copy()
        state["_canvas"] = None
        return state

    def __repr__(self) -> str:
        return (
            f"YOLODataset({len(self)} images, imgsz={self.imgsz}, augment={self.augment}, "
            f"cache={self.cache!r}, epoch={self.epoch}, mosaic={self.mosaic_enabled})"
        )


def _to_chw(img: np.ndarray, out: np.ndarray) -> None:
    """``(H, W, 3)`` -> ``out``, a contiguous ``(3, H, W)`` uint8 array. ``cv2.split`` into
    the planes of the output: ~7x faster than numpy's strided transpose copy (0.09 vs
    0.65 ms at 640).

    Raises:
        ValueError: ``img`` is not ``(H, W, 3)`` of ``out``'s size (a letterbox or mosaic of
            another size would otherwise be written out of place).
    """
    if img.shape != (*out.shape[1:], 3):
        raise ValueError(f"image of shape {img.shape} does not fit a batch slot {out.shape}")
    cv2.split(np.ascontiguousarray(img), [out[0], out[1], out[2]])


def _to_hwc(img: np.ndarray, out: np.ndarray) -> None:
    """``(H, W, 3)`` uint8 -> ``out``, an ``(H, W, 3)`` slot of a channels-last batch (one
    contiguous copy; 0.46 ms at 640 for the transpose of :func:`_to_chw` measured in a
    loader, this is a memcpy).

    Raises:
        ValueError: ``img`` is not of ``out``'s shape (a letterbox or mosaic of another
            size would otherwise be written out of place).
    """
    if img.shape != out.shape:
        raise ValueError(f"image of shape {img.shape} does not fit a batch slot {out.shape[-1:] + out.shape[:2]}")
    np.copyto(out, img)


def _batch_tensor(shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialised uint8 tensor, in shared memory inside a loader worker (where it will
    be sent to the training process), in ordinary memory elsewhere."""
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=torch.uint8)
    storage = torch.UntypedStorage._new_shared(math.prod(shape))
    return torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)


def _parse_cache(cache: Any) -> CacheMode:
    """``False``/None/"false"/"0"/"no"/"none"/"" -> off; True/"ram"/"true"/"1"/"yes" -> ram;
    "disk" -> disk (LibreYOLO semantics). Raises ``ValueError`` otherwise."""
    if cache is None or cache is False:
        return False
    if cache is True:
        return "ram"
    if isinstance(cache, str):
        v = cache.strip().lower()
        if v in ("", "false", "0", "no", "none"):
            return False
        if v in ("ram", "true", "1", "yes"):
            return "ram"
        if v == "disk":
            return "disk"
    raise ValueError(f"Invalid cache mode {cache!r}: use False, 'ram' or 'disk'")
