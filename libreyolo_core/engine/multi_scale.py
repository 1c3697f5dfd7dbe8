"""``multi_scale=True``: each training batch at a random size in ``[0.5, 1.5] x imgsz``.

The rule is Ultralytics' (``DetectionTrainer.preprocess_batch``, 8.x): a size drawn
uniformly from ``[0.5 * imgsz, 1.5 * imgsz + stride)`` and floored to a multiple of the
network's stride; the batch is resized on the device with bilinear interpolation and its
boxes are scaled with it. The draw is a pure function of ``(seed, epoch, step)``, so every
rank of a DDP run trains the step at the same size and a resumed run repeats the sizes of
the uninterrupted one. Validation always runs at ``imgsz``.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

__all__ = ["multi_scale_size", "rescale_batch"]


def multi_scale_size(imgsz: int, stride: int, seed: int, epoch: int, step: int) -> int:
    """The side, pixels, of training step ``step`` of ``epoch`` (both 0-based): a multiple
    of ``stride`` from ``imgsz / 2`` (rounded down, at least ``stride``) to ``1.5 * imgsz``
    (rounded up), each equally likely up to the rounding (320-960 for 640 at stride 32)."""
    rng = random.Random(f"multi_scale/{seed}/{epoch}/{step}")
    size = rng.randrange(int(imgsz * 0.5), int(imgsz * 1.5 + stride)) // stride * stride
    return max(stride, size)


def rescale_batch(images: torch.Tensor, targets: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Resize a square batch to ``size`` and scale its boxes by the same factor.

    Args:
        images: float ``(B, 3, S, S)`` (any memory format; kept).
        targets: ``(N, 6)`` ``[batch_idx, cls, x1, y1, x2, y2]``, boxes in pixels of ``S``.
        size: the new side, pixels.

    Returns:
        ``(images (B, 3, size, size), targets)``: the inputs themselves when ``size == S``,
        else bilinear-resized images (``align_corners=False``) and a scaled copy of the targets.
    """
    side = images.shape[-1]
    if size == side:
        return images, targets
    images = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
    targets = targets.clone()
    targets[:, 2:6] *= size / side
    return images, targets
