"""Device side of ``loader=gpu``: decode, resize, mosaic canvas, one warp, mixup, HSV.

Batched tensor operations that run on whatever device the tensors live on: CUDA in
training (JPEG decode by nvjpeg through ``torchvision.io.decode_jpeg(list, device="cuda")``),
CPU tensors in the tests, so the code the GPU runs is the code the test suite checks.

Pixel conventions match :mod:`libreyolo_core.data.augment` (cv2): pixel ``i`` spans
``[i, i + 1)``, a ``3 x 3`` matrix maps source pixel *indices* (centres) to output pixel
indices, the border is grey ``114``. Differences from the CPU pipeline, all sub-pixel or
one grey level:

- resize: bilinear with antialiasing (``F.interpolate(antialias=True)``) instead of
  ``cv2.INTER_AREA`` when shrinking, and from the full-size decode (the CPU decoder shrinks
  large JPEGs by DCT scaling first);
- warp: ``grid_sample`` bilinear in float32 instead of cv2's fixed-point bilinear (1/32 px
  coordinates, 15-bit weights);
- HSV: OpenCV's 8-bit HSV formulas in float32 with rounding (cv2 uses integer tables).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from libreyolo_core.data.augment import PAD_VALUE

__all__ = ["apply_hsv", "blend", "build_canvases", "decode_jpegs", "hsv_to_rgb",
           "inverse_matrices", "resize_to", "rgb_to_hsv", "to_device", "warp"]


def decode_jpegs(data: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor | None]:
    """Decode encoded JPEGs on ``device`` in one batched call.

    Args:
        data: uint8 ``(nbytes,)`` CPU tensors, each a complete 3-component JPEG.
        device: where to decode (``cuda``: nvjpeg, batched; ``cpu``: libjpeg).

    Returns:
        One uint8 ``(3, h, w)`` RGB tensor on ``device`` per input; None for a file the
        decoder refused (the caller decodes it on the host). When the batched call fails,
        each file is decoded alone so one bad file does not fail the others.
    """
    from torchvision.io import ImageReadMode, decode_jpeg

    if not data:
        return []
    try:
        out = decode_jpeg(list(data), mode=ImageReadMode.RGB, device=device)
        return list(out)
    except RuntimeError:
        pass
    decoded: list[torch.Tensor | None] = []
    for d in data:
        try:
            decoded.append(decode_jpeg(d, mode=ImageReadMode.RGB, device=device))
        except RuntimeError:
            decoded.append(None)
    return decoded


def resize_to(img: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """Resize one image to ``hw = (h, w)`` and round back to whole grey levels.

    Args:
        img: ``(3, h0, w0)`` uint8 or float.

    Returns:
        float32 ``(3, h, w)`` with integer values in ``[0, 255]`` (the CPU path's tiles are
        uint8); bilinear, antialiased when shrinking (half-pixel centres, like cv2).
    """
    x = img.float()
    if tuple(x.shape[-2:]) == tuple(hw):
        return x
    x = F.interpolate(x[None], size=hw, mode="bilinear", align_corners=False, antialias=True)[0]
    return x.round_().clamp_(0, 255)


def build_canvases(layers: Sequence[Sequence[tuple[torch.Tensor, int, int, int, int, int, int]]],
                   size: int, device: torch.device, pad_value: int = PAD_VALUE) -> torch.Tensor:
    """Paste tiles on grey canvases (the mosaic of :func:`~libreyolo_core.data.augment.mosaic4`).

    Args:
        layers: per canvas, its tiles ``(tile, x1a, y1a, x2a, y2a, x1b, y1b)``: ``tile``
            float ``(3, h, w)`` on ``device``, its part from ``(x1b, y1b)`` pasted at
            ``[x1a, x2a) x [y1a, y2a)``.
        size: the canvas side (``2 S``).

    Returns:
        float32 ``(L, 3, size, size)``, ``pad_value`` where no tile lies.
    """
    canvas = torch.full((len(layers), 3, size, size), float(pad_value), dtype=torch.float32,
                        device=device)
    for k, tiles in enumerate(layers):
        for tile, x1a, y1a, x2a, y2a, x1b, y1b in tiles:
            canvas[k, :, y1a:y2a, x1a:x2a] = tile[:, y1b:y1b + y2a - y1a, x1b:x1b + x2a - x1a]
    return canvas


def warp(canvas: torch.Tensor, minv: torch.Tensor, out_size: int,
         pad_value: int = PAD_VALUE) -> torch.Tensor:
    """Warp each canvas by its matrix in one batched ``grid_sample``
    (``cv2.warpAffine``/``cv2.warpPerspective`` with a constant border, batched).

    Output pixel ``(u, v)`` samples the canvas at ``M^-1 (u, v, 1)`` (divided by its third
    coordinate, so a perspective matrix works too), bilinearly; outside the canvas the value
    is ``pad_value`` (the border is sampled as ``pad_value`` by warping ``canvas - pad`` with
    zero padding and adding ``pad`` back: bilinear interpolation is linear).

    Args:
        canvas: float32 ``(L, 3, H, W)``; consumed (``pad_value`` is subtracted in place, so
            no second canvas-sized buffer is needed).
        minv: ``(L, 3, 3)`` inverse matrices (output pixel index -> canvas pixel index), on
            the canvas' device (:func:`inverse_matrices`).
        out_size: output side ``S``.

    Returns:
        float32 ``(L, 3, S, S)`` rounded to whole grey levels in ``[0, 255]``.
    """
    n, _, h, w = canvas.shape
    dev = canvas.device
    r = torch.arange(out_size, device=dev, dtype=torch.float32)
    v, u = torch.meshgrid(r, r, indexing="ij")
    base = torch.stack([u, v, torch.ones_like(u)], -1).reshape(1, -1, 3)  # (1, S*S, 3)
    src = base @ minv.float().transpose(1, 2)  # (L, S*S, 3)
    xy = src[..., :2] / src[..., 2:3]
    # pixel index -> grid_sample's [-1, 1] with align_corners=False: g = (2 x + 1) / W - 1
    # (Python scalars: a tensor built from a list would be a synchronising host copy)
    gx = xy[..., 0] * (2.0 / w) + (1.0 / w - 1.0)
    gy = xy[..., 1] * (2.0 / h) + (1.0 / h - 1.0)
    grid = torch.stack([gx, gy], -1).reshape(n, out_size, out_size, 2)
    out = F.grid_sample(canvas.sub_(pad_value), grid, mode="bilinear", padding_mode="zeros",
                        align_corners=False)
    return out.add_(pad_value).round_().clamp_(0, 255)


def blend(a: torch.Tensor, b: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """``ratio * a + (1 - ratio) * b`` rounded (:func:`~libreyolo_core.data.augment.blend`).

    Args:
        a, b: float ``(N, 3, S, S)``. ratio: ``(N,)`` in ``[0, 1]``.
    """
    r = ratio.to(a).view(-1, 1, 1, 1)
    return (a * r + b * (1 - r)).round_().clamp_(0, 255)


def rgb_to_hsv(rgb: torch.Tensor) -> torch.Tensor:
    """OpenCV's 8-bit ``COLOR_RGB2HSV``: ``H`` in ``[0, 180)`` (degrees / 2), ``S`` and
    ``V`` in ``[0, 255]``, all rounded to integers (as float32).

    Args:
        rgb: float ``(N, 3, H, W)`` with values in ``[0, 255]``.
    """
    r, g, b = rgb.unbind(1)
    v, _ = rgb.max(1)
    mn, _ = rgb.min(1)
    diff = v - mn
    s = torch.where(v > 0, diff * 255.0 / v.clamp_min(1e-6), torch.zeros_like(v))
    d = diff.clamp_min(1e-6)
    h = torch.where(v == r, 60.0 * (g - b) / d,
                    torch.where(v == g, 120.0 + 60.0 * (b - r) / d, 240.0 + 60.0 * (r - g) / d))
    h = torch.where(diff > 0, h, torch.zeros_like(h))
    h = torch.where(h < 0, h + 360.0, h)
    return torch.stack([(h / 2).round() % 180, s.round(), v], 1)


def hsv_to_rgb(hsv: torch.Tensor) -> torch.Tensor:
    """OpenCV's 8-bit ``COLOR_HSV2RGB`` (``H`` in degrees / 2): float ``(N, 3, H, W)`` RGB
    in ``[0, 255]``, rounded."""
    h, s, v = hsv.unbind(1)
    h6 = (h * 2.0 / 60.0) % 6.0
    s, v = s / 255.0, v / 255.0
    out = []
    for n in (5.0, 3.0, 1.0):  # R, G, B: v - v s clamp(min(k, 4 - k), 0, 1), k = (n + h6) mod 6
        k = (n + h6) % 6.0
        out.append(v - v * s * torch.minimum(k, 4.0 - k).clamp(0.0, 1.0))
    return (torch.stack(out, 1) * 255.0).round_().clamp_(0, 255)


def apply_hsv(img: torch.Tensor, deltas: torch.Tensor) -> torch.Tensor:
    """Shift hue (mod 180), saturation and value (clipped to ``[0, 255]``) in OpenCV's 8-bit
    HSV (:func:`~libreyolo_core.data.augment.apply_hsv`, batched).

    Args:
        img: float ``(N, 3, H, W)`` RGB in ``[0, 255]``.
        deltas: ``(N, 3)`` integer ``(dh, ds, dv)`` shifts.

    Returns:
        float ``(N, 3, H, W)`` RGB, rounded.
    """
    hsv = rgb_to_hsv(img)
    d = deltas.to(hsv).view(-1, 3, 1, 1)
    h = (hsv[:, 0:1] + d[:, 0:1]) % 180.0
    sv = (hsv[:, 1:] + d[:, 1:]).clamp(0, 255)
    return hsv_to_rgb(torch.cat([h, sv], 1))


def to_device(x: np.ndarray, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A small host array on ``device`` without waiting for the device: through pinned
    memory and an asynchronous copy on CUDA (a pageable copy would wait for the stream)."""
    t = torch.from_numpy(np.ascontiguousarray(x)).to(dtype)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def inverse_matrices(ms: Sequence[np.ndarray], device: torch.device) -> torch.Tensor:
    """``(L, 3, 3)`` float32 inverses of the host matrices ``ms`` (canvas -> output), on
    ``device``: inverted on the host in float64 (a device inverse checks for singular
    matrices, a device-to-host sync).

    Raises:
        numpy.linalg.LinAlgError: a singular matrix (a scale of 0 is refused by the config).
    """
    return to_device(np.linalg.inv(np.stack(ms).astype(np.float64)), device)
