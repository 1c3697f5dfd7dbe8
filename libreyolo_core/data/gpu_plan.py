"""Host side of ``loader=gpu``: every random draw and every box, plus the tiles' file bytes.

A loader worker of the GPU path does no pixel work. For sample ``i`` it makes the draws the
CPU pipeline makes (:meth:`YOLODataset._augmented <libreyolo_core.data.dataset.YOLODataset>`:
same seed ``[seed, rank, epoch, i]``, same functions, same order), computes the sample's
boxes with the CPU pipeline's own box functions (:func:`~libreyolo_core.data.augment.mosaic_labels`,
:func:`~libreyolo_core.data.augment.warp_boxes` and its box-candidate rule, the
``MIN_BOX_SIDE`` filter), and reads the file bytes of the tiles the warp can see
(:func:`~libreyolo_core.data.augment.mosaic_crop`). The device then decodes and warps
(:mod:`libreyolo_core.data.gpu_augment`). Because draws and boxes are the CPU path's, sample
``i`` of epoch ``e`` has the same tiles, matrix, flips, HSV shifts and boxes on both paths;
only the pixels' interpolation differs.

Every sample is expressed as one or two *layers* (two with mixup), each a ``2S x 2S`` canvas
(grey 114) with tiles pasted on it and a ``3 x 3`` matrix that maps canvas pixel indices to
output pixel indices (the mosaic's affine/perspective with the flips folded in; for a
letterboxed sample the image sits at its letterbox offset and the matrix is the flip).
Boxes are computed here, on the host, because their count after the box-candidate filter is
data-dependent: filtering on the device would cost a device-to-host sync per batch.

Pixels travel as:

- ``("jpeg", uint8 (nbytes,))``: the encoded file, for a complete 3-component JPEG whose
  stored size is the scanned size and which carries no EXIF rotation; decoded on the device;
- ``("pixels", uint8 (h, w, 3))``: decoded and resized on the host by the CPU path's decoder
  (grey or CMYK JPEGs, RGB-coded JPEGs, PNG and other formats, truncated files, EXIF-rotated
  JPEGs) or read from the image cache (``cache=ram|disk``).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from libreyolo_core.data import augment as A
from libreyolo_core.data.dataset import MIN_BOX_SIDE, YOLODataset
from libreyolo_core.data.image import _jpeg_complete, jpeg_frame

__all__ = ["EncodedBatch", "EncodedDataset", "Layer", "SamplePlan", "collate_encoded",
           "plan_sample", "read_tile"]

#: Reasons a tile is decoded on the host (the loader says so once).
HOST_REASONS = ("not a 3-component JPEG", "truncated JPEG", "EXIF orientation",
                "stored size differs from the scanned size", "unreadable file",
                "RGB-coded JPEG (Adobe transform 0)")

_EXIF_ORIENTATION_TAG = 0x0112


@dataclass
class Layer:
    """One canvas of a sample: tiles pasted on a ``2S x 2S`` grey canvas, then warped by ``m``.

    Attributes:
        tiles: ``(j, x1a, y1a, x2a, y2a, x1b, y1b)`` per pasted tile: image ``j`` (resized so
            its longest side is ``S``), its part from ``(x1b, y1b)`` pasted at the canvas
            rectangle ``[x1a, x2a) x [y1a, y2a)`` (the rectangles of
            :func:`~libreyolo_core.data.augment.mosaic_rects`, clipped to the warp's crop).
        m: ``(3, 3)`` float64, canvas pixel index -> output pixel index (cv2 convention).
    """

    tiles: list[tuple[int, int, int, int, int, int, int]]
    m: np.ndarray


@dataclass
class SamplePlan:
    """Everything the device needs to render sample ``index``, and its final boxes.

    Attributes:
        index: the dataset index.
        layers: one layer, or two for mixup (blended ``ratio * first + (1 - ratio) * second``).
        ratio: the mixup ratio (1.0 without mixup).
        hsv: the ``(dh, ds, dv)`` shifts of :func:`~libreyolo_core.data.augment.hsv_deltas`, or
            None (no HSV jitter, or all three shifts 0).
        labels: float32 ``(n, 5)`` ``[cls, x1, y1, x2, y2]`` output pixels, final.
        meta: the sample's meta dict (as ``YOLODataset`` gives it).
    """

    index: int
    layers: list[Layer]
    ratio: float
    hsv: tuple[int, int, int] | None
    labels: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)


def _letterbox_layer(ds: YOLODataset, j: int) -> tuple[Layer, np.ndarray]:
    """Image ``j`` letterboxed into the top-left ``S x S`` of the canvas (identity warp) and
    its boxes there (:func:`~libreyolo_core.data.augment.letterbox` with an image that is
    already resized: only the offset moves the boxes)."""
    s = ds.imgsz
    h, w = ds._target_hw(j)
    left, top = (s - w) // 2, (s - h) // 2
    lab = ds.load_labels(j)
    lab[:, [1, 3]] += left
    lab[:, [2, 4]] += top
    return Layer([(j, left, top, left + w, top + h, 0, 0)], np.eye(3)), lab


def _mosaic_layer(ds: YOLODataset, plan: Any, flip: np.ndarray) -> tuple[Layer, np.ndarray]:
    """A planned mosaic (``YOLODataset._mosaic_plan``) as a layer, and its boxes: the CPU
    pipeline's ``_render_mosaic`` without the pixels."""
    s, persp = ds.imgsz, ds.aug.perspective
    rects = A.mosaic_rects([ds._target_hw(j) for j in plan.idx], s, plan.centre)
    m = flip @ plan.m
    (x0, y0, x1, y1), needed = A.mosaic_crop(rects, m, s, s, persp)
    tiles = []
    for j, need, (x1a, y1a, x2a, y2a, x1b, y1b) in zip(plan.idx, needed, rects, strict=True):
        ax1, ay1, ax2, ay2 = max(x1a, x0), max(y1a, y0), min(x2a, x1), min(y2a, y1)
        if need and ax2 > ax1 and ay2 > ay1:
            tiles.append((j, ax1, ay1, ax2, ay2, x1b + ax1 - x1a, y1b + ay1 - y1a))
    labels = A.mosaic_labels([ds.load_labels(j) for j in plan.idx], rects)
    return Layer(tiles, m), A.warp_boxes(labels, m, plan.scale, s, persp)


def plan_sample(ds: YOLODataset, i: int) -> SamplePlan:
    """The draws and boxes of augmented sample ``i`` of ``ds`` at its current epoch.

    Mirrors ``YOLODataset._augmented`` draw for draw (seed ``[seed, rank, epoch, i]``):
    mosaic or letterbox, mixup, HSV, vertical then horizontal flip. The flips are folded
    into each layer's matrix (they commute with the per-pixel HSV and the blend, so the
    order of the CPU pipeline's letterbox branch gives the same image).

    Raises:
        ValueError: ``ds`` has ``augment=False``, a mosaic buffer (its tiles depend on
            decoded pixels kept in the worker; ``loader=gpu`` refuses it) or
            ``mosaic_partners="batch"`` (its partners depend on the batch).
    """
    if not ds.augment:
        raise ValueError("plan_sample needs an augmenting dataset (augment=True)")
    if ds._buffer is not None:
        raise ValueError("loader=gpu does not support mosaic_buffer > 0 (the buffer keeps "
                         "decoded images in the loader workers); use mosaic_buffer=0")
    if ds.aug.mosaic_partners == "batch":
        raise ValueError("loader=gpu does not support mosaic_partners=batch (its workers plan "
                         "one sample at a time); use mosaic_partners=dataset")
    rng = np.random.default_rng([ds.seed, ds.rank, ds.epoch, i])
    h, s = ds.aug, ds.imgsz
    mosaic_on = ds.mosaic_enabled
    use_mosaic = mosaic_on and h.mosaic > 0 and rng.random() < h.mosaic
    branch = _mosaic_draws if use_mosaic else _letterbox_draws
    layers, lab, ratio, hsv = branch(ds, i, rng)
    if hsv is not None and not any(hsv):
        hsv = None  # A.apply_hsv returns the image untouched
    keep = (lab[:, 3] - lab[:, 1] > MIN_BOX_SIDE) & (lab[:, 4] - lab[:, 2] > MIN_BOX_SIDE)
    rec = ds.records[i]
    h0, w0 = rec.shape
    nh, nw = ds._target_hw(i)
    meta = {"path": str(rec.im_file), "orig_shape": (h0, w0), "ratio": s / max(h0, w0),
            "pad": ((s - nw) // 2, (s - nh) // 2), "mosaic": bool(use_mosaic)}
    return SamplePlan(i, layers, ratio, hsv, lab[keep].astype(np.float32), meta)


_Draws = tuple[list[Any], np.ndarray, float, Any]  # layers, boxes, mixup ratio, HSV deltas


def _letterbox_draws(ds: YOLODataset, i: int, rng: np.random.Generator) -> _Draws:
    """The letterbox branch of :func:`plan_sample`: mixup, HSV and flips, drawn in the order
    of ``YOLODataset._augmented``; the flips folded into each layer's matrix."""
    h, s = ds.aug, ds.imgsz
    ratio, hsv = 1.0, None
    layer, lab = _letterbox_layer(ds, i)
    layers = [layer]
    if ds.mosaic_enabled and h.mixup > 0 and rng.random() < h.mixup:
        layer2, lab2 = _letterbox_layer(ds, int(rng.integers(0, len(ds))))
        ratio = float(rng.beta(32.0, 32.0))  # A.mixup's one draw
        layers.append(layer2)
        lab = np.concatenate([lab, lab2], 0).astype(np.float32)
    if h.hsv_prob > 0 and rng.random() < h.hsv_prob:
        hsv = A.hsv_deltas(rng, h.hsv_h, h.hsv_s, h.hsv_v)
    ud = h.flipud > 0 and rng.random() < h.flipud
    lr = h.fliplr > 0 and rng.random() < h.fliplr
    flip = A.flip_matrix(s, lr, ud)
    for layer in layers:
        layer.m = flip @ layer.m
    if ud:  # A.flipud's box rule
        lab[:, [2, 4]] = s - lab[:, [4, 2]]
    if lr:  # A.fliplr's box rule
        lab[:, [1, 3]] = s - lab[:, [3, 1]]
    return layers, lab, ratio, hsv


def _mosaic_draws(ds: YOLODataset, i: int, rng: np.random.Generator) -> _Draws:
    """The mosaic branch of :func:`plan_sample` (a second mosaic for mixup), drawn in the
    order of ``YOLODataset._augmented``."""
    h, s = ds.aug, ds.imgsz
    ratio, hsv = 1.0, None
    plan = ds._mosaic_plan(i, rng)
    plan2 = None
    if h.mixup > 0 and rng.random() < h.mixup:
        plan2 = ds._mosaic_plan(int(rng.integers(0, len(ds))), rng)
        ratio = float(rng.beta(32.0, 32.0))
    if h.hsv_prob > 0 and rng.random() < h.hsv_prob:
        hsv = A.hsv_deltas(rng, h.hsv_h, h.hsv_s, h.hsv_v)
    ud = h.flipud > 0 and rng.random() < h.flipud
    lr = h.fliplr > 0 and rng.random() < h.fliplr
    flip = A.flip_matrix(s, lr, ud)
    layer, lab = _mosaic_layer(ds, plan, flip)
    layers = [layer]
    if plan2 is not None:
        layer2, lab2 = _mosaic_layer(ds, plan2, flip)
        layers.append(layer2)
        lab = np.concatenate([lab, lab2], 0).astype(np.float32)
    return layers, lab, ratio, hsv


def _exif_orientation(buf: np.ndarray) -> int:
    """The EXIF orientation of an encoded image (1 when it has none or it is unreadable)."""
    if b"Exif\x00\x00" not in buf[:65536].tobytes():
        return 1
    try:
        with Image.open(io.BytesIO(buf.tobytes())) as im:
            return int(im.getexif().get(_EXIF_ORIENTATION_TAG, 1))
    except Exception:  # noqa: BLE001 - a malformed EXIF block: unrotated, like exif_transpose
        return 1


def _adobe_rgb(buf: np.ndarray) -> bool:
    """Whether an Adobe APP14 segment says the 3 components are RGB, not YCbCr (transform
    0): libjpeg honours it, nvjpeg would convert them as YCbCr."""
    head = buf[:65536].tobytes()
    k = head.find(b"Adobe")
    while k >= 4:
        if head[k - 4:k - 2] == b"\xff\xee" and k + 11 < len(head):
            return head[k + 11] == 0
        k = head.find(b"Adobe", k + 1)
    return False


def device_decodable(buf: np.ndarray, shape: tuple[int, int]) -> str | None:
    """None when ``buf`` can be decoded on the device (nvjpeg), else the reason it cannot
    (one of :data:`HOST_REASONS`). ``shape`` is the scanned ``(h, w)`` (after EXIF)."""
    frame = jpeg_frame(buf)
    if frame is None or frame[2] != 3:
        return HOST_REASONS[0]
    if not _jpeg_complete(buf):
        return HOST_REASONS[1]
    if _exif_orientation(buf) != 1:
        return HOST_REASONS[2]
    if (frame[0], frame[1]) != tuple(shape):
        return HOST_REASONS[3]
    if _adobe_rgb(buf):
        return HOST_REASONS[5]
    return None


def read_tile(ds: YOLODataset, j: int) -> tuple[str, torch.Tensor, str | None]:
    """Image ``j``'s pixels as they travel to the main process: ``(kind, tensor, reason)``.

    ``("jpeg", uint8 (nbytes,), None)`` for a file the device decodes; ``("pixels", uint8
    (h, w, 3), reason)`` decoded and resized on the host (``reason`` None when it came from
    the image cache). Raises what the CPU path's decoder raises for a broken file.
    """
    if ds.cache:  # cache=ram|disk: pixels are already decoded and resized
        return "pixels", torch.from_numpy(np.ascontiguousarray(ds.load_image(j))), None
    try:
        buf = np.fromfile(ds.records[j].im_file, np.uint8)
    except OSError:
        buf = None
    reason = HOST_REASONS[4] if buf is None else device_decodable(buf, ds.records[j].shape)
    if reason is None and buf is not None:
        return "jpeg", torch.from_numpy(buf), None
    return "pixels", torch.from_numpy(np.ascontiguousarray(ds.load_image(j))), reason


@dataclass
class EncodedBatch:
    """A batch as the GPU path's workers hand it over.

    Attributes:
        plans: one :class:`SamplePlan` per sample.
        tiles: image index -> ``(kind, tensor, reason)`` of :func:`read_tile`, once per image
            even when several samples show it.
    """

    plans: list[SamplePlan]
    tiles: dict[int, tuple[str, torch.Tensor, str | None]]

    def __len__(self) -> int:
        return len(self.plans)


class EncodedDataset(Dataset):
    """``dataset[i] -> (SamplePlan, {j: tile})``: the GPU path's view of an augmenting
    :class:`YOLODataset` (its records, recipe, seed, epoch and mosaic switch; see the module
    docstring). Length, ``set_epoch`` and ``close_mosaic`` are the wrapped dataset's."""

    def __init__(self, ds: YOLODataset) -> None:
        plan_sample(ds, 0)  # refuses a dataset this path cannot serve, at build time
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> tuple[SamplePlan, dict[int, tuple[str, torch.Tensor, str | None]]]:
        plan = plan_sample(self.ds, int(i))
        tiles = {t[0]: read_tile(self.ds, t[0]) for layer in plan.layers for t in layer.tiles}
        return plan, tiles


def collate_encoded(items: list[tuple[SamplePlan, dict[int, Any]]]) -> EncodedBatch:
    """Gather the workers' samples into one :class:`EncodedBatch` (tiles de-duplicated).

    Raises:
        ValueError: an empty list.
    """
    if not items:
        raise ValueError("collate_encoded() got no samples")
    tiles: dict[int, Any] = {}
    for _, t in items:
        tiles.update(t)
    return EncodedBatch([p for p, _ in items], tiles)
