"""Building blocks shared by the detector families.

Contents: the ``Conv`` block (Conv2d + BatchNorm + SiLU) with its inference fusion,
anchor generation for anchor-free heads, distance <-> box conversions and a broadcasting
Complete-IoU.

Sources: Conv/BN fusion is the standard algebraic fold (Ioffe & Szegedy 2015 BN applied
as an affine map); CIoU from Zheng et al., "Enhancing Geometric Factors in Model Learning
and Inference for Object Detection and Instance Segmentation" (2021); anchor-point
layout as in YOLOv9 (Wang et al., 2024) / YOLOv8 (cell centres, offset 0.5).
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "BN_EPS",
    "BN_MOMENTUM",
    "Conv",
    "fuse_conv_bn",
    "make_anchors",
    "dist2bbox",
    "bbox2dist",
    "bbox_ciou",
    "pad_1x1_to_3x3",
]

BN_EPS = 1e-3
BN_MOMENTUM = 0.03


class Conv(nn.Module):
    """Conv2d (no bias) + BatchNorm2d (eps 1e-3, momentum 0.03) + SiLU, "same" padding.

    Args:
        c1: input channels.
        c2: output channels.
        k: square kernel size (odd); padding is ``k // 2``.
        s: stride.
        g: groups.
        act: apply SiLU when True, identity otherwise.

    Shapes: (B, c1, H, W) -> (B, c2, ceil(H / s), ceil(W / s)).
    After :meth:`fuse` the BatchNorm is folded into a biased convolution (inference only).
    """

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, g: int = 1, act: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2, groups=g, bias=False)
        self.bn: nn.Module = nn.BatchNorm2d(c2, eps=BN_EPS, momentum=BN_MOMENTUM)
        self.act: nn.Module = nn.SiLU() if act else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.bn(self.conv(x)))

    @property
    def fused(self) -> bool:
        """True once :meth:`fuse` has folded the BatchNorm into the convolution."""
        return not isinstance(self.bn, nn.BatchNorm2d)

    def fuse(self) -> Conv:
        """Fold the BatchNorm (running statistics) into the convolution; idempotent."""
        if isinstance(self.bn, nn.BatchNorm2d):  # not fused yet
            self.conv = fuse_conv_bn(self.conv, self.bn)
            self.bn = nn.Identity()
        return self


@torch.no_grad()
def fuse_conv_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """Return a biased ``nn.Conv2d`` equal to ``bn(conv(x))`` with ``bn`` in eval mode.

    ``w' = w * g / sqrt(var + eps)``, ``b' = beta + (b - mean) * g / sqrt(var + eps)``.
    The new conv has the same geometry (kernel, stride, padding, groups, dilation) and
    lives on the same device and dtype as ``conv``.

    Raises:
        ValueError: ``bn`` keeps no running statistics (``track_running_stats=False``).
    """
    mean, var = bn.running_mean, bn.running_var
    if mean is None or var is None:
        raise ValueError("fuse_conv_bn needs a BatchNorm with running statistics")
    # _ConvNd types the geometry as tuple[int, ...]; a Conv2d's is always 2-D
    Pair = tuple[int, int]
    fused = nn.Conv2d(
        conv.in_channels,
        conv.out_channels,
        cast(Pair, conv.kernel_size),
        cast(Pair, conv.stride),
        cast("str | Pair", conv.padding),
        cast(Pair, conv.dilation),
        conv.groups,
        bias=True,
    ).to(device=conv.weight.device, dtype=conv.weight.dtype)
    scale = bn.weight / torch.sqrt(var + bn.eps)
    fused.weight.copy_(conv.weight * scale.view(-1, 1, 1, 1))
    bias = conv.bias if conv.bias is not None else torch.zeros_like(mean)
    assert fused.bias is not None  # built with bias=True
    fused.bias.copy_(bn.bias + (bias - mean) * scale)
    fused.requires_grad_(False)
    return fused


def make_anchors(
    shapes: list[tuple[int, int]] | tuple[tuple[int, int], ...],
    strides: tuple[int, ...] | list[int],
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    offset: float = 0.5,
) -> tuple[Tensor, Tensor]:
    """Anchor points at cell centres of every feature level, concatenated level by level.

    Args:
        shapes: ``(h, w)`` of each feature map (Python ints; no device sync).
        strides: input pixels per cell of each level, same length as ``shapes``.
        device, dtype: where to build the tensors.
        offset: cell offset (0.5 = cell centre, YOLOv9 convention).

    Returns:
        ``points (A, 2)`` as ``(x, y)`` in input pixels and ``stride (A, 1)``, where
        ``A = sum(h * w)``; anchors run row-major (y outer, x inner) inside each level,
        matching ``feature.flatten(2)``.
    """
    if len(shapes) != len(strides):
        raise ValueError(f"got {len(shapes)} feature shapes but {len(strides)} strides")
    points, stride_list = [], []
    for (h, w), s in zip(shapes, strides, strict=True):
        sx = (torch.arange(w, device=device, dtype=dtype) + offset) * s
        sy = (torch.arange(h, device=device, dtype=dtype) + offset) * s
        yy, xx = torch.meshgrid(sy, sx, indexing="ij")
        points.append(torch.stack((xx, yy), -1).view(-1, 2))
        stride_list.append(torch.full((h * w, 1), float(s), device=device, dtype=dtype))
    return torch.cat(points), torch.cat(stride_list)


def dist2bbox(distance: Tensor, points: Tensor, dim: int = -1) -> Tensor:
    """Convert ``(l, t, r, b)`` distances from anchor points into ``(x1, y1, x2, y2)``.

    Args:
        distance: distances with size 4 along ``dim`` (same units as ``points``).
        points: anchor ``(x, y)`` with size 2 along ``dim``, broadcastable to ``distance``.
        dim: the coordinate dimension.

    Returns:
        boxes with size 4 along ``dim``.
    """
    lt, rb = distance.chunk(2, dim)
    return torch.cat((points - lt, points + rb), dim)


def bbox2dist(boxes: Tensor, points: Tensor, dim: int = -1) -> Tensor:
    """Inverse of :func:`dist2bbox`: ``(x1, y1, x2, y2)`` -> ``(l, t, r, b)`` from points."""
    x1y1, x2y2 = boxes.chunk(2, dim)
    return torch.cat((points - x1y1, x2y2 - points), dim)


def bbox_ciou(box1: Tensor, box2: Tensor, eps: float = 1e-7) -> Tensor:
    """Complete IoU of broadcastable ``xyxy`` boxes (last dim 4); returns the broadcast shape.

    ``CIoU = IoU - rho^2 / c^2 - alpha * v`` with ``v = 4 / pi^2 (atan(w2/h2) -
    atan(w1/h1))^2`` and ``alpha = v / (1 - IoU + v)`` (alpha treated as a constant for
    gradients, as in Zheng et al. 2021). Degenerate (zero-size) boxes give finite values
    thanks to ``eps``; the result lies in [-1.5, 1].
    """
    b1x1, b1y1, b1x2, b1y2 = box1.unbind(-1)
    b2x1, b2y1, b2x2, b2y2 = box2.unbind(-1)
    w1, h1 = b1x2 - b1x1, b1y2 - b1y1
    w2, h2 = b2x2 - b2x1, b2y2 - b2y1
    iw = (torch.minimum(b1x2, b2x2) - torch.maximum(b1x1, b2x1)).clamp(min=0)
    ih = (torch.minimum(b1y2, b2y2) - torch.maximum(b1y1, b2y1)).clamp(min=0)
    inter = iw * ih
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
    cw = torch.maximum(b1x2, b2x2) - torch.minimum(b1x1, b2x1)
    ch = torch.maximum(b1y2, b2y2) - torch.minimum(b1y1, b2y1)
    c2 = cw.square() + ch.square() + eps
    rho2 = ((b2x1 + b2x2 - b1x1 - b1x2).square() + (b2y1 + b2y2 - b1y1 - b1y2).square()) / 4
    v = (4 / math.pi**2) * (torch.atan(w2 / (h2 + eps)) - torch.atan(w1 / (h1 + eps))).square()
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return iou - (rho2 / c2 + v * alpha)


def pad_1x1_to_3x3(weight: Tensor) -> Tensor:
    """Zero-pad a ``(c2, c1, 1, 1)`` kernel to ``(c2, c1, 3, 3)`` (value in the centre)."""
    return F.pad(weight, [1, 1, 1, 1])
