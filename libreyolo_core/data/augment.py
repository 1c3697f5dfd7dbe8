"""Geometric and photometric augmentation on numpy images with pixel ``xyxy`` boxes.

Conventions for every function here:

- images are ``np.ndarray`` uint8 ``(H, W, 3)`` RGB (any 3-channel order works);
- labels are float32 ``(n, 5)`` rows ``[cls, x1, y1, x2, y2]`` in pixels of that image,
  continuous coordinates (pixel ``i`` spans ``[i, i + 1)``);
- randomness comes only from the ``np.random.Generator`` passed in.

Algorithms follow Ultralytics YOLOv5/v8 ``RandomPerspective``/``Mosaic``/``MixUp`` and
YOLOX ``augment_hsv`` (sources: ultralytics/data/augment.py, YOLOX yolox/data/data_augment.py),
re-implemented with cv2 for speed.
"""

from __future__ import annotations

import itertools
import math

import cv2
import numpy as np

__all__ = [
    "PAD_VALUE",
    "affine_matrix",
    "apply_hsv",
    "augment_hsv",
    "blend",
    "box_candidates",
    "flip_matrix",
    "fliplr",
    "flipud",
    "hsv_deltas",
    "letterbox",
    "mixup",
    "mosaic4",
    "mosaic_centre",
    "mosaic_crop",
    "mosaic_labels",
    "mosaic_rects",
    "random_affine",
    "resize_longest",
    "warp_boxes",
    "warp_mosaic",
]

#: Grey used for padding and empty canvas areas (YOLO convention).
PAD_VALUE = 114


def _empty_labels() -> np.ndarray:
    return np.zeros((0, 5), np.float32)


def resize_longest(img: np.ndarray, size: int) -> np.ndarray:
    """Resize so the longest side is ``size`` pixels, keeping the aspect ratio.

    ``cv2.INTER_AREA`` when shrinking, ``cv2.INTER_LINEAR`` when growing. New sides are
    ``round(side * size / max(h, w))`` (at least 1). Boxes scale by ``new_w / w`` and
    ``new_h / h`` exactly (cv2 resizes are pixel-area aligned).
    """
    h, w = img.shape[:2]
    r = size / max(h, w)
    if r == 1.0:
        return img
    nw, nh = max(1, round(w * r)), max(1, round(h * r))
    interp = cv2.INTER_AREA if r < 1 else cv2.INTER_LINEAR
    return cv2.resize(img, (nw, nh), interpolation=interp)


def letterbox(
    img: np.ndarray,
    size: int,
    labels: np.ndarray | None = None,
    pad_value: int = PAD_VALUE,
) -> tuple[np.ndarray, np.ndarray | None, float, tuple[int, int]]:
    """Resize the longest side to ``size`` (aspect kept) and pad to ``size x size``, centred.

    Args:
        img: ``(h, w, 3)`` uint8.
        size: output side ``S`` in pixels.
        labels: optional ``(n, 5)`` ``[cls, x1, y1, x2, y2]`` pixels of ``img``.
        pad_value: fill of the padding.

    Returns:
        ``(out, labels_out, ratio, (left, top))``: ``out`` is ``(S, S, 3)`` uint8;
        ``labels_out`` are boxes in ``out`` pixels, clipped to the resized image (``None``
        if no labels given);
        ``ratio = S / max(h, w)``; ``left``/``top`` are the padding in pixels, so an output
        point maps back as ``x0 = (x - left) / ratio``.
    """
    h, w = img.shape[:2]
    resized = resize_longest(img, size)
    nh, nw = resized.shape[:2]
    left, top = (size - nw) // 2, (size - nh) // 2
    out = cv2.copyMakeBorder(
        resized,
        top,
        size - nh - top,
        left,
        size - nw - left,
        cv2.BORDER_CONSTANT,
        value=(pad_value, pad_value, pad_value),
    )
    if labels is not None:
        labels = labels.astype(np.float32, copy=True)
        # clipped to the resized image: float32 rounding put an edge at 100.00001 of 100
        labels[:, [1, 3]] = np.clip(labels[:, [1, 3]] * (nw / w) + left, left, left + nw)
        labels[:, [2, 4]] = np.clip(labels[:, [2, 4]] * (nh / h) + top, top, top + nh)
    return out, labels, size / max(h, w), (left, top)


def mosaic4(
    images: list[np.ndarray],
    labels: list[np.ndarray],
    size: int,
    rng: np.random.Generator,
    pad_value: int = PAD_VALUE,
) -> tuple[np.ndarray, np.ndarray]:
    """Four images on a ``2S x 2S`` canvas around a random centre (YOLO mosaic).

    The centre ``(xc, yc)`` is uniform in ``[0.5 S, 1.5 S)``; image 0 fills the top-left
    quadrant ending at the centre, 1 the top-right, 2 the bottom-left, 3 the bottom-right,
    each cropped where it would leave the canvas. Boxes are shifted and clipped to the part
    of their tile that is visible (not just to the canvas), boxes with no area left are
    dropped. Follow with :func:`random_affine` (``out_size=S``) to get an ``S x S`` sample.

    Args:
        images: four ``(h_i, w_i, 3)`` uint8 images, each side <= ``S`` (resized already).
        labels: four ``(n_i, 5)`` ``[cls, x1, y1, x2, y2]`` pixel arrays.
        size: ``S``.
        rng: random generator.

    Returns:
        ``(canvas (2S, 2S, 3) uint8, labels (n, 5) float32 in canvas pixels)``.
    """
    if len(images) != 4 or len(labels) != 4:
        raise ValueError(f"mosaic4 needs 4 images and 4 label arrays, got {len(images)}")
    s = size
    canvas = np.full((2 * s, 2 * s, 3), pad_value, dtype=np.uint8)
    rects = mosaic_rects([im.shape[:2] for im in images], s, mosaic_centre(rng, s))
    for img, (x1a, y1a, x2a, y2a, x1b, y1b) in zip(images, rects, strict=True):
        canvas[y1a:y2a, x1a:x2a] = img[y1b : y1b + (y2a - y1a), x1b : x1b + (x2a - x1a)]
    return canvas, mosaic_labels(labels, rects)


def mosaic_centre(rng: np.random.Generator, size: int) -> tuple[int, int]:
    """The mosaic centre ``(xc, yc)``, uniform in ``[0.5 S, 1.5 S)`` (integer pixels); the
    one draw :func:`mosaic4` makes."""
    xc, yc = (int(v) for v in rng.uniform(0.5 * size, 1.5 * size, size=2))
    return xc, yc


Rect = tuple[int, int, int, int, int, int]


def mosaic_rects(
    shapes: list[tuple[int, int]], size: int, centre: tuple[int, int]
) -> list[Rect]:
    """Where each of four tiles of ``shapes`` ``[(h, w), ...]`` lands on the ``2S`` canvas.

    Returns ``[(x1a, y1a, x2a, y2a, x1b, y1b), ...]``: the canvas rectangle (end exclusive)
    and the top-left of the part of the tile shown there (see :func:`mosaic4`). Needs no
    pixels, so a caller can decide which tiles are seen before decoding them.
    """
    s, (xc, yc) = size, centre
    out = []
    for i, (h, w) in enumerate(shapes):
        if i == 0:  # top-left
            x1a, y1a, x2a, y2a = max(xc - w, 0), max(yc - h, 0), xc, yc
            x1b, y1b = w - (x2a - x1a), h - (y2a - y1a)
        elif i == 1:  # top-right
            x1a, y1a, x2a, y2a = xc, max(yc - h, 0), min(xc + w, 2 * s), yc
            x1b, y1b = 0, h - (y2a - y1a)
        elif i == 2:  # bottom-left
            x1a, y1a, x2a, y2a = max(xc - w, 0), yc, xc, min(2 * s, yc + h)
            x1b, y1b = w - (x2a - x1a), 0
        else:  # bottom-right
            x1a, y1a, x2a, y2a = xc, yc, min(xc + w, 2 * s), min(2 * s, yc + h)
            x1b, y1b = 0, 0
        out.append((x1a, y1a, x2a, y2a, x1b, y1b))
    return out


def mosaic_labels(labels: list[np.ndarray], rects: list[Rect]) -> np.ndarray:
    """The four tiles' boxes in canvas pixels: shifted, clipped to the visible part of their
    tile, boxes with no area left dropped (``(n, 5)`` float32)."""
    out = []
    for lab, (x1a, y1a, x2a, y2a, x1b, y1b) in zip(labels, rects, strict=True):
        if len(lab):
            lab = lab.astype(np.float32, copy=True)
            lab[:, [1, 3]] = np.clip(lab[:, [1, 3]] + (x1a - x1b), x1a, x2a)
            lab[:, [2, 4]] = np.clip(lab[:, [2, 4]] + (y1a - y1b), y1a, y2a)
            keep = (lab[:, 3] > lab[:, 1]) & (lab[:, 4] > lab[:, 2])
            out.append(lab[keep])
    return np.concatenate(out, 0) if out else _empty_labels()


def mosaic_crop(
    rects: list[Rect], m: np.ndarray, size: int, out_size: int, perspective: float = 0.0
) -> tuple[tuple[int, int, int, int], list[bool]]:
    """The part of the ``2S`` mosaic canvas that warping with ``m`` can read, and which
    tiles touch it.

    The output's pixel centres ``[0, out_size - 1]^2`` are mapped back through ``m``; their
    bounding box, widened by 2 px for bilinear interpolation and cv2's 1/32-px coordinate
    rounding, is the only part of the canvas any output pixel samples. A tile outside it is
    never seen, so it need not be decoded (its boxes still go through :func:`warp_boxes`,
    which drops them). A perspective warp reads the whole canvas (its inverse can pass
    through infinity); so does a singular ``m``.

    Returns:
        ``((x0, y0, x1, y1), needed)``: the canvas crop (end exclusive, possibly empty) and
        one flag per tile.
    """
    full = (0, 0, 2 * size, 2 * size)
    box = full
    if not perspective:
        try:
            mi = np.linalg.inv(m)
        except np.linalg.LinAlgError:
            mi = None
        if mi is not None:
            e = out_size - 1
            q = mi @ np.array([[0, e, 0, e], [0, 0, e, e], [1, 1, 1, 1]], np.float64)
            lo, hi = q[:2].min(1), q[:2].max(1)
            box = (max(0, math.floor(lo[0]) - 2), max(0, math.floor(lo[1]) - 2),
                   min(2 * size, math.ceil(hi[0]) + 3), min(2 * size, math.ceil(hi[1]) + 3))
    x0, y0, x1, y1 = box
    needed = [x1a < x1 and x2a > x0 and y1a < y1 and y2a > y0 and x2a > x1a and y2a > y1a
              for x1a, y1a, x2a, y2a, _, _ in rects]
    return box, needed


def warp_mosaic(
    images: list[np.ndarray | None],
    rects: list[Rect],
    crop: tuple[int, int, int, int],
    m: np.ndarray,
    out_size: int,
    perspective: float = 0.0,
    pad_value: int = PAD_VALUE,
    *,
    out: np.ndarray | None = None,
    scratch: np.ndarray | None = None,
) -> np.ndarray:
    """:func:`mosaic4` then the warp of :func:`random_affine` with matrix ``m``, building only
    the ``crop`` of the canvas (from :func:`mosaic_crop`) that the warp reads.

    The same pixels as warping the whole canvas: the crop holds every canvas pixel an output
    pixel samples, and the matrix is moved to the crop's origin (with a rotation, a few
    pixels can differ by 1: cv2 rounds its coordinates to 1/32 px, and the moved origin
    rounds differently; without one they are identical). ``images[k]``
    may be ``None`` for a tile :func:`mosaic_crop` did not flag as needed. Only the part of
    the crop no tile covers is painted ``pad_value``.

    Args:
        out: a C-contiguous ``(out_size, out_size, 3)`` uint8 array the warp writes into
            (a batch slot); a new array when ``None``.
        scratch: a 1-D uint8 array the canvas is built in when it holds ``ch * cw * 3``
            bytes, reused from sample to sample (a fresh canvas of several MiB is
            page-faulted in on every sample); a new array when ``None`` or too small.

    Returns:
        ``(out_size, out_size, 3)`` uint8: ``out`` when given.

    Raises:
        ValueError: a tile inside the crop is ``None``; ``out`` of another shape or dtype.
    """
    if out is not None and (out.shape != (out_size, out_size, 3) or out.dtype != np.uint8
                            or not out.flags.c_contiguous):
        raise ValueError(f"warp_mosaic: out must be a contiguous uint8 ({out_size}, {out_size}, 3) "
                         f"array, got {out.dtype} {out.shape}")
    x0, y0, x1, y1 = crop
    cw, ch = max(x1 - x0, 1), max(y1 - y0, 1)
    n = ch * cw * 3
    if scratch is not None and scratch.size >= n:
        canvas = scratch[:n].reshape(ch, cw, 3)
    else:
        canvas = np.empty((ch, cw, 3), dtype=np.uint8)
    covered = []
    for img, (x1a, y1a, x2a, y2a, x1b, y1b) in zip(images, rects, strict=True):
        ax1, ay1, ax2, ay2 = max(x1a, x0), max(y1a, y0), min(x2a, x1), min(y2a, y1)
        if ax2 <= ax1 or ay2 <= ay1:
            continue
        if img is None:
            raise ValueError("warp_mosaic: a tile inside the crop was not given")
        bx, by = x1b + ax1 - x1a, y1b + ay1 - y1a
        canvas[ay1 - y0 : ay2 - y0, ax1 - x0 : ax2 - x0] = img[by : by + ay2 - ay1, bx : bx + ax2 - ax1]
        covered.append((ax1 - x0, ay1 - y0, ax2 - x0, ay2 - y0))
    _paint_uncovered(canvas, covered, pad_value)
    shift = np.eye(3)
    shift[0, 2], shift[1, 2] = x0, y0
    return _warp(canvas, m @ shift, out_size, perspective, pad_value, dst=out)


def _paint_uncovered(canvas: np.ndarray, covered: list[tuple[int, int, int, int]], value: int) -> None:
    """Paint ``value`` where none of the ``covered`` rectangles ``(x1, y1, x2, y2)`` (canvas
    pixels, end exclusive) lies: band by band between their top and bottom edges, the gaps
    between the rectangles spanning the band."""
    h, w = canvas.shape[:2]
    ys = sorted({0, h, *(y for r in covered for y in (r[1], r[3]))})
    for ya, yb in itertools.pairwise(ys):
        x = 0
        for x1, _, x2, _ in sorted(r for r in covered if r[1] <= ya and r[3] >= yb):
            if x1 > x:
                canvas[ya:yb, x:x1] = value
            x = max(x, x2)
        if x < w:
            canvas[ya:yb, x:w] = value


def box_candidates(
    before: np.ndarray,
    after: np.ndarray,
    wh_thr: float = 2.0,
    ar_thr: float = 20.0,
    area_thr: float = 0.1,
    eps: float = 1e-16,
) -> np.ndarray:
    """Which boxes survive a warp (Ultralytics ``box_candidates``).

    Args:
        before: ``(n, 4)`` xyxy boxes before the warp, already multiplied by the warp's scale.
        after: ``(n, 4)`` xyxy boxes after the warp and clipping.
        wh_thr: minimum width and height in pixels (strictly greater).
        ar_thr: maximum aspect ratio ``max(w/h, h/w)`` (strictly less).
        area_thr: minimum ``area_after / area_before`` (strictly greater).

    Returns:
        bool mask ``(n,)``.
    """
    w1, h1 = before[:, 2] - before[:, 0], before[:, 3] - before[:, 1]
    w2, h2 = after[:, 2] - after[:, 0], after[:, 3] - after[:, 1]
    ar = np.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return (w2 > wh_thr) & (h2 > wh_thr) & (w2 * h2 / (w1 * h1 + eps) > area_thr) & (ar < ar_thr)


def random_affine(
    img: np.ndarray,
    labels: np.ndarray,
    rng: np.random.Generator,
    out_size: int,
    degrees: float = 0.0,
    translate: float = 0.0,
    scale: tuple[float, float] = (1.0, 1.0),
    shear: float = 0.0,
    perspective: float = 0.0,
    pad_value: int = PAD_VALUE,
) -> tuple[np.ndarray, np.ndarray]:
    """Random rotation/scale/shear/translation/perspective; input centre -> output centre.

    ``M = T @ S @ R @ P @ C`` (Ultralytics ``RandomPerspective``): ``C`` moves the input
    centre to the origin, ``P`` perspective ``+-perspective``, ``R`` rotation
    ``+-degrees`` and scale ``U(scale)``, ``S`` shear ``+-shear`` degrees on both axes,
    ``T`` moves to the output centre ``+- translate * out_size``. Used on the ``2S``
    mosaic canvas with ``out_size = S`` (the canvas centre becomes the sample centre).

    Boxes become the bounding box of their four transformed corners, clipped to the output;
    boxes with width or height <= 2 px, area < 10 % of the (scaled) original, or aspect
    > 20 are dropped (:func:`box_candidates`).

    Args:
        img: ``(h, w, 3)`` uint8.
        labels: ``(n, 5)`` ``[cls, x1, y1, x2, y2]`` pixels of ``img``.
        rng: random generator.
        out_size: output side ``S``.
        degrees, translate, scale, shear, perspective: ranges as described above.

    Returns:
        ``(out (S, S, 3) uint8, labels (m, 5) float32 in output pixels)``, ``m <= n``.
    """
    h, w = img.shape[:2]
    m, s = affine_matrix(rng, w, h, out_size, degrees, translate, scale, shear, perspective)
    out = _warp(img, m, out_size, perspective, pad_value)
    return out, warp_boxes(labels, m, s, out_size, perspective)


def affine_matrix(
    rng: np.random.Generator,
    w: int,
    h: int,
    out_size: int,
    degrees: float = 0.0,
    translate: float = 0.0,
    scale: tuple[float, float] = (1.0, 1.0),
    shear: float = 0.0,
    perspective: float = 0.0,
) -> tuple[np.ndarray, float]:
    """The random matrix of :func:`random_affine` for a ``w x h`` input (its draws, in its
    order): ``(M (3, 3) float64 in cv2 pixel-index coordinates, scale s)``."""
    c = np.eye(3)
    c[0, 2], c[1, 2] = -w / 2, -h / 2
    p = np.eye(3)
    p[2, 0], p[2, 1] = rng.uniform(-perspective, perspective, size=2)
    r = np.eye(3)
    angle = rng.uniform(-degrees, degrees)
    s = rng.uniform(scale[0], scale[1])
    r[:2] = cv2.getRotationMatrix2D(center=(0, 0), angle=angle, scale=s)
    sh = np.eye(3)
    sh[0, 1], sh[1, 0] = (math.tan(math.radians(a)) for a in rng.uniform(-shear, shear, size=2))
    t = np.eye(3)
    t[0, 2], t[1, 2] = rng.uniform(0.5 - translate, 0.5 + translate, size=2) * out_size
    return t @ sh @ r @ p @ c, float(s)


def flip_matrix(out_size: int, lr: bool, ud: bool) -> np.ndarray:
    """The ``(3, 3)`` pixel-index matrix of a left-right and/or top-bottom mirror of an
    ``out_size`` square (``u -> out_size - 1 - u``). ``flip_matrix(S, lr, ud) @ M`` warps
    and mirrors in one pass, pixel for pixel what :func:`fliplr`/:func:`flipud` give after
    the warp; :func:`warp_boxes` mirrors boxes exactly (``x -> S - x``)."""
    f = np.eye(3)
    if lr:
        f[0, 0], f[0, 2] = -1.0, out_size - 1
    if ud:
        f[1, 1], f[1, 2] = -1.0, out_size - 1
    return f


def _warp(img: np.ndarray, m: np.ndarray, out_size: int, perspective: float, pad_value: int,
          dst: np.ndarray | None = None) -> np.ndarray:
    border = (pad_value, pad_value, pad_value)
    if perspective:
        out = cv2.warpPerspective(img, m, dsize=(out_size, out_size), dst=dst, borderValue=border)
    else:
        out = cv2.warpAffine(img, m[:2], dsize=(out_size, out_size), dst=dst, borderValue=border)
    return out if dst is None else dst


def warp_boxes(
    labels: np.ndarray, m: np.ndarray, s: float, out_size: int, perspective: float = 0.0
) -> np.ndarray:
    """Boxes through the warp ``m`` (:func:`random_affine`'s box rule): each box becomes the
    bounding box of its four transformed corners, clipped to the output, then filtered by
    :func:`box_candidates` against the box scaled by ``s``. Returns ``(m, 5)`` float32."""
    if len(labels) == 0:
        return _empty_labels()
    # cv2 maps pixel-centre indices; boxes are corner-based: shift by half a pixel around M.
    half = np.eye(3)
    half[:2, 2] = 0.5
    unhalf = np.eye(3)
    unhalf[:2, 2] = -0.5
    mb = half @ m @ unhalf
    n = len(labels)
    xy = np.ones((n * 4, 3))
    xy[:, :2] = labels[:, [1, 2, 3, 4, 1, 4, 3, 2]].reshape(n * 4, 2)  # 4 corners per box
    xy = xy @ mb.T
    xy = xy[:, :2] / xy[:, 2:3] if perspective else xy[:, :2]
    xs, ys = xy[:, 0].reshape(n, 4), xy[:, 1].reshape(n, 4)
    new = np.stack([xs.min(1), ys.min(1), xs.max(1), ys.max(1)], 1)
    new = np.clip(new, 0, out_size)
    keep = box_candidates(labels[:, 1:5] * s, new)
    return np.concatenate([labels[keep, :1], new[keep]], 1).astype(np.float32)


def augment_hsv(
    img: np.ndarray,
    rng: np.random.Generator,
    hgain: float = 5.0,
    sgain: float = 30.0,
    vgain: float = 30.0,
    channel_prob: float = 0.5,
) -> np.ndarray:
    """Random hue/saturation/value shift in OpenCV units (YOLOX ``augment_hsv``).

    Each of H, S, V is shifted (with probability ``channel_prob`` each) by an integer offset
    uniform in ``+-gain``: hue in OpenCV's 0..179 scale (wraps around), saturation and value
    in 0..255 (clipped). Implemented with per-channel lookup tables.

    Args:
        img: ``(H, W, 3)`` uint8 RGB.

    Returns:
        A new ``(H, W, 3)`` uint8 RGB image (``img`` itself when no channel changes).
    """
    return apply_hsv(img, *hsv_deltas(rng, hgain, sgain, vgain, channel_prob))


def hsv_deltas(
    rng: np.random.Generator,
    hgain: float = 5.0,
    sgain: float = 30.0,
    vgain: float = 30.0,
    channel_prob: float = 0.5,
) -> tuple[int, int, int]:
    """The integer ``(dh, ds, dv)`` shifts :func:`augment_hsv` draws (its draws, in order)."""
    gains = np.array([hgain, sgain, vgain], dtype=np.float64)
    deltas = rng.uniform(-1, 1, 3) * gains * (rng.random(3) < channel_prob)
    dh, ds, dv = (int(round(d)) for d in deltas)
    return dh, ds, dv


def apply_hsv(img: np.ndarray, dh: int, ds: int, dv: int, inplace: bool = False) -> np.ndarray:
    """Shift hue (mod 180), saturation and value (clipped to 0..255) of an RGB uint8 image
    through OpenCV's HSV with lookup tables; ``img`` itself when all shifts are 0, and,
    with ``inplace``, always ``img``, overwritten (no new image)."""
    if dh == 0 and ds == 0 and dv == 0:
        return img
    x = np.arange(256, dtype=np.int16)
    lut = np.empty((256, 1, 3), np.uint8)  # one 3-channel table: no split/merge copies
    lut[:, 0, 0] = (x + dh) % 180
    lut[:, 0, 1] = np.clip(x + ds, 0, 255)
    lut[:, 0, 2] = np.clip(x + dv, 0, 255)
    if inplace:
        hsv = img
        cv2.cvtColor(img, cv2.COLOR_RGB2HSV, dst=hsv)
    else:
        hsv = cv2.cvtColor(img, cv2.COLOR_RGB2HSV)
    cv2.LUT(hsv, lut, dst=hsv)
    cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB, dst=hsv)
    return hsv


def fliplr(img: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mirror left-right. Box ``[x1, x2] -> [W - x2, W - x1]``."""
    w = img.shape[1]
    labels = labels.astype(np.float32, copy=True)
    labels[:, [1, 3]] = w - labels[:, [3, 1]]
    return cv2.flip(img, 1), labels


def flipud(img: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mirror top-bottom. Box ``[y1, y2] -> [H - y2, H - y1]``."""
    h = img.shape[0]
    labels = labels.astype(np.float32, copy=True)
    labels[:, [2, 4]] = h - labels[:, [4, 2]]
    return cv2.flip(img, 0), labels


def mixup(
    img1: np.ndarray,
    labels1: np.ndarray,
    img2: np.ndarray,
    labels2: np.ndarray,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Blend two same-size images with ratio ``r ~ Beta(32, 32)`` and KEEP both label sets.

    (Zhang et al., "mixup", 2018; YOLO practice.) ``out = r * img1 + (1 - r) * img2``.

    Returns:
        ``(out uint8 same shape, labels concat (n1 + n2, 5))``.
    """
    if img1.shape != img2.shape:
        raise ValueError(f"mixup needs equal shapes, got {img1.shape} and {img2.shape}")
    r = float(rng.beta(32.0, 32.0))
    return blend(img1, img2, r), np.concatenate([labels1, labels2], 0).astype(np.float32)


def blend(img1: np.ndarray, img2: np.ndarray, r: float, inplace: bool = False) -> np.ndarray:
    """``r * img1 + (1 - r) * img2`` as uint8 (the pixels of :func:`mixup`); written over
    ``img1`` (and returned) with ``inplace``."""
    if not inplace:
        return cv2.addWeighted(img1, r, img2, 1.0 - r, 0.0)
    cv2.addWeighted(img1, r, img2, 1.0 - r, 0.0, dst=img1)
    return img1
