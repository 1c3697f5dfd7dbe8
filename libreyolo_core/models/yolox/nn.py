"""YOLOX (n, t, s) network: CSPDarknet with a Focus stem, PAFPN neck and decoupled head.

Source: Ge, Liu, Wang, Li & Sun, "YOLOX: Exceeding YOLO Series in 2021" (arXiv
2107.08430) and its reference implementation (Megvii-BaseDetection/YOLOX,
``yolox/models/{darknet,network_blocks,yolo_pafpn,yolo_head}.py``); widths and depths as
LibreYOLO 1.6 / YOLOX 0.3 (n: depth 0.33, width 0.25, depthwise convs; t: 0.33 / 0.375;
s: 0.33 / 0.50).

Forward contract (:class:`YOLOX`): input ``(B, 3, H, W)`` float **BGR in 0-255** (the
family's ``preprocess`` converts the loader's RGB uint8) with ``H`` and ``W`` multiples of
32.

* ``train()`` mode: list of 3 raw maps ``(B, 5 + nc, H / s, W / s)`` for strides
  ``s = 8, 16, 32``; channels ``[reg (dx, dy, log w, log h) x 4, obj logit, class logits]``.
* ``eval()`` mode: ``(decoded, maps)`` with ``decoded (B, 5 + nc, A)`` = ``x1, y1, x2,
  y2`` in input pixels, the objectness probability and the per-class probabilities,
  ``A = sum(H / s * W / s)``. Boxes decode with the grid at cell **corners**:
  ``cxcy = (raw_xy + grid) * stride``, ``wh = exp(raw_wh) * stride``.

The forward has no host synchronisation and no branching on tensor values, so it can be
captured in a CUDA graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from libreyolo_core.models.common import Conv, make_anchors

__all__ = [
    "DWConv",
    "Focus",
    "Bottleneck",
    "CSPLayer",
    "SPPBottleneck",
    "CSPDarknet",
    "YOLOPAFPN",
    "YOLOXHead",
    "YOLOXConfig",
    "CONFIGS",
    "YOLOX",
]

PRIOR_PROB = 0.01  # cls / obj bias prior: bias = -ln((1 - p) / p) = -ln(99)


class DWConv(nn.Module):
    """Depthwise ``k x k`` Conv (groups = c1) then pointwise 1x1 Conv, both BN + SiLU.

    Shapes: (B, c1, H, W) -> (B, c2, ceil(H / s), ceil(W / s)).
    """

    def __init__(self, c1: int, c2: int, k: int = 3, s: int = 1):
        super().__init__()
        self.dconv = Conv(c1, c1, k, s, g=c1)
        self.pconv = Conv(c1, c2, 1, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.pconv(self.dconv(x))


def _conv(depthwise: bool) -> type[nn.Module]:
    return DWConv if depthwise else Conv


class Focus(nn.Module):
    """Space-to-depth (each 2x2 patch -> 4 channels) then a Conv.

    Shapes: (B, c1, H, W) -> (B, c2, H / 2, W / 2).

    Channel order ``[top-left, bottom-left, top-right, bottom-right]`` as in the reference
    implementation (matters only for loading its weights).
    """

    def __init__(self, c1: int, c2: int, k: int = 3):
        super().__init__()
        self.conv = Conv(c1 * 4, c2, k, 1)

    def forward(self, x: Tensor) -> Tensor:
        tl, tr = x[..., ::2, ::2], x[..., ::2, 1::2]
        bl, br = x[..., 1::2, ::2], x[..., 1::2, 1::2]
        return self.conv(torch.cat((tl, bl, tr, br), 1))


class Bottleneck(nn.Module):
    """1x1 Conv to ``c2 * e`` then 3x3 Conv (depthwise-separable when asked).

    Residual when ``shortcut`` and ``c1 == c2``. Shapes: (B, c1, H, W) -> (B, c2, H, W).
    """

    def __init__(
        self, c1: int, c2: int, shortcut: bool = True, e: float = 0.5, depthwise: bool = False
    ):
        super().__init__()
        hidden = int(c2 * e)
        self.conv1 = Conv(c1, hidden, 1, 1)
        self.conv2 = _conv(depthwise)(hidden, c2, 3, 1)
        self.add = shortcut and c1 == c2

    def forward(self, x: Tensor) -> Tensor:
        y = self.conv2(self.conv1(x))
        return x + y if self.add else y


class CSPLayer(nn.Module):
    """CSP block: two 1x1 branches (hidden ``c2 * e``), ``n`` Bottlenecks on the first, concat, 1x1.

    Shapes: (B, c1, H, W) -> (B, c2, H, W).
    """

    def __init__(
        self,
        c1: int,
        c2: int,
        n: int = 1,
        shortcut: bool = True,
        e: float = 0.5,
        depthwise: bool = False,
    ):
        super().__init__()
        hidden = int(c2 * e)
        self.conv1 = Conv(c1, hidden, 1, 1)
        self.conv2 = Conv(c1, hidden, 1, 1)
        self.conv3 = Conv(2 * hidden, c2, 1, 1)
        self.m = nn.Sequential(
            *(Bottleneck(hidden, hidden, shortcut, 1.0, depthwise) for _ in range(n))
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.conv3(torch.cat((self.m(self.conv1(x)), self.conv2(x)), 1))


class SPPBottleneck(nn.Module):
    """Spatial pyramid pooling (He et al. 2015) as in YOLOv3-SPP: 1x1 to ``c1 / 2``,
    parallel max-pools 5 / 9 / 13 (stride 1), concat with the input, 1x1 to ``c2``."""

    def __init__(self, c1: int, c2: int, ks: tuple[int, ...] = (5, 9, 13)):
        super().__init__()
        hidden = c1 // 2
        self.conv1 = Conv(c1, hidden, 1, 1)
        self.m = nn.ModuleList(nn.MaxPool2d(k, 1, k // 2) for k in ks)
        self.conv2 = Conv(hidden * (len(ks) + 1), c2, 1, 1)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv1(x)
        return self.conv2(torch.cat([x, *(m(x) for m in self.m)], 1))


class CSPDarknet(nn.Module):
    """Focus stem + dark2..dark5 (stride-2 Conv + CSPLayer; SPP before dark5's CSP).

    Returns the dark3, dark4, dark5 features (strides 8, 16, 32) with ``4b, 8b, 16b``
    channels, ``b = int(64 * width)``.
    """

    def __init__(self, depth: float, width: float, depthwise: bool = False):
        super().__init__()
        conv = _conv(depthwise)
        b = int(64 * width)
        d = max(round(3 * depth), 1)
        self.stem = Focus(3, b, 3)
        self.dark2 = nn.Sequential(
            conv(b, 2 * b, 3, 2), CSPLayer(2 * b, 2 * b, d, depthwise=depthwise)
        )
        self.dark3 = nn.Sequential(
            conv(2 * b, 4 * b, 3, 2), CSPLayer(4 * b, 4 * b, 3 * d, depthwise=depthwise)
        )
        self.dark4 = nn.Sequential(
            conv(4 * b, 8 * b, 3, 2), CSPLayer(8 * b, 8 * b, 3 * d, depthwise=depthwise)
        )
        self.dark5 = nn.Sequential(
            conv(8 * b, 16 * b, 3, 2),
            SPPBottleneck(16 * b, 16 * b),
            CSPLayer(16 * b, 16 * b, d, shortcut=False, depthwise=depthwise),
        )

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x = self.dark2(self.stem(x))
        c3 = self.dark3(x)
        c4 = self.dark4(c3)
        return c3, c4, self.dark5(c4)


class YOLOPAFPN(nn.Module):
    """PAFPN neck on CSPDarknet features: top-down (lateral 1x1, upsample, concat, CSP) then
    bottom-up (stride-2 conv, concat, CSP). Outputs ``(P3, P4, P5)`` with channels
    ``[256, 512, 1024] * width`` at strides 8, 16, 32."""

    def __init__(self, depth: float, width: float, depthwise: bool = False):
        super().__init__()
        conv = _conv(depthwise)
        c3, c4, c5 = (int(c * width) for c in (256, 512, 1024))
        n = round(3 * depth)
        self.backbone = CSPDarknet(depth, width, depthwise)
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")
        self.lateral_conv0 = Conv(c5, c4, 1, 1)
        self.C3_p4 = CSPLayer(2 * c4, c4, n, False, depthwise=depthwise)
        self.reduce_conv1 = Conv(c4, c3, 1, 1)
        self.C3_p3 = CSPLayer(2 * c3, c3, n, False, depthwise=depthwise)
        self.bu_conv2 = conv(c3, c3, 3, 2)
        self.C3_n3 = CSPLayer(2 * c3, c4, n, False, depthwise=depthwise)
        self.bu_conv1 = conv(c4, c4, 3, 2)
        self.C3_n4 = CSPLayer(2 * c4, c5, n, False, depthwise=depthwise)
        self.out_channels = (c3, c4, c5)

    def forward(self, x: Tensor) -> list[Tensor]:
        x2, x1, x0 = self.backbone(x)
        fpn_out0 = self.lateral_conv0(x0)
        f_out0 = self.C3_p4(torch.cat((self.upsample(fpn_out0), x1), 1))
        fpn_out1 = self.reduce_conv1(f_out0)
        pan_out2 = self.C3_p3(torch.cat((self.upsample(fpn_out1), x2), 1))
        pan_out1 = self.C3_n3(torch.cat((self.bu_conv2(pan_out2), fpn_out1), 1))
        pan_out0 = self.C3_n4(torch.cat((self.bu_conv1(pan_out1), fpn_out0), 1))
        return [pan_out2, pan_out1, pan_out0]


class YOLOXHead(nn.Module):
    """Decoupled head, per level: 1x1 stem to ``int(256 * width)``; cls branch 2 x 3x3 ->
    1x1 ``nc``; reg branch 2 x 3x3 -> 1x1 4 (box) and 1x1 1 (objectness).

    Per-level output ``(B, 5 + nc, h, w)`` = ``cat(reg, obj, cls)``. Bias of the cls and obj
    predictors starts at ``-ln((1 - 0.01) / 0.01) = -ln(99)`` (focal-loss prior, Lin et al.
    2017, as in the reference implementation).
    """

    def __init__(
        self, nc: int, width: float, in_channels: tuple[int, ...], depthwise: bool = False
    ):
        super().__init__()
        conv = _conv(depthwise)
        hid = int(256 * width)
        self.nc = nc
        self.stems = nn.ModuleList(Conv(c, hid, 1, 1) for c in in_channels)
        self.cls_convs = nn.ModuleList(
            nn.Sequential(conv(hid, hid, 3, 1), conv(hid, hid, 3, 1)) for _ in in_channels
        )
        self.reg_convs = nn.ModuleList(
            nn.Sequential(conv(hid, hid, 3, 1), conv(hid, hid, 3, 1)) for _ in in_channels
        )
        self.cls_preds = nn.ModuleList(nn.Conv2d(hid, nc, 1) for _ in in_channels)
        self.reg_preds = nn.ModuleList(nn.Conv2d(hid, 4, 1) for _ in in_channels)
        self.obj_preds = nn.ModuleList(nn.Conv2d(hid, 1, 1) for _ in in_channels)
        self.initialize_biases(PRIOR_PROB)

    @torch.no_grad()
    def initialize_biases(self, prior_prob: float = PRIOR_PROB) -> None:
        """Set cls and obj biases to ``-ln((1 - p) / p)`` (p = 0.01 gives -ln 99)."""
        value = -math.log((1 - prior_prob) / prior_prob)
        for m in (*self.cls_preds, *self.obj_preds):
            m.bias.fill_(value)

    def forward(self, feats: list[Tensor]) -> list[Tensor]:
        out = []
        for i, x in enumerate(feats):
            x = self.stems[i](x)
            c = self.cls_convs[i](x)
            r = self.reg_convs[i](x)
            reg, obj, cls = self.reg_preds[i](r), self.obj_preds[i](r), self.cls_preds[i](c)
            out.append(torch.cat((reg, obj, cls), 1))
        return out


@dataclass(frozen=True)
class YOLOXConfig:
    """Depth / width multipliers and the depthwise flag of one YOLOX size."""

    depth: float
    width: float
    depthwise: bool = False


CONFIGS: dict[str, YOLOXConfig] = {
    "n": YOLOXConfig(0.33, 0.25, depthwise=True),
    "t": YOLOXConfig(0.33, 0.375),
    "s": YOLOXConfig(0.33, 0.50),
}


class YOLOX(nn.Module):
    """YOLOX detector (see the module docstring for the forward contract).

    Args:
        cfg: multipliers (:data:`CONFIGS`).
        nc: number of classes (>= 1).

    Attributes:
        nc, strides ``(8, 16, 32)``, ``no = 5 + nc`` channels per map.

    Raises:
        ValueError: ``nc < 1``.
    """

    strides = (8, 16, 32)

    def __init__(self, cfg: YOLOXConfig, nc: int = 80):
        super().__init__()
        if nc < 1:
            raise ValueError(f"nc must be >= 1, got {nc}")
        self.cfg, self.nc, self.no = cfg, int(nc), int(nc) + 5
        self.backbone = YOLOPAFPN(cfg.depth, cfg.width, cfg.depthwise)
        self.head = YOLOXHead(self.nc, cfg.width, self.backbone.out_channels, cfg.depthwise)

    def forward(self, x: Tensor) -> list[Tensor] | tuple[Tensor, list[Tensor]]:
        maps = self.head(self.backbone(x))
        if self.training:
            return maps
        return self.decode(maps), maps

    def decode(self, maps: list[Tensor]) -> Tensor:
        """Raw maps -> ``(B, 5 + nc, A)``: ``xyxy`` (input pixels), obj prob, class probs."""
        shapes = [(m.shape[2], m.shape[3]) for m in maps]
        grid, stride = make_anchors(shapes, self.strides, maps[0].device, offset=0.0)
        x = torch.cat([m.flatten(2) for m in maps], 2).float()  # (B, no, A)
        grid, stride = grid.T, stride.T  # (2, A) pixels, (1, A)
        cxcy = x[:, :2] * stride + grid  # (raw + cell index) * stride
        wh = x[:, 2:4].exp() * stride
        boxes = torch.cat((cxcy - wh / 2, cxcy + wh / 2), 1)
        return torch.cat((boxes, x[:, 4:].sigmoid()), 1)

    def fuse(self) -> YOLOX:
        """Fold every BatchNorm into its convolution (inference only); returns ``self``."""
        for m in self.modules():
            if isinstance(m, Conv):
                m.fuse()
        return self
