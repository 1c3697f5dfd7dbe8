"""YOLOv9 (t, s) network: GELAN backbone, PAN neck and the anchor-free ``DDetect`` head.

Source: Wang, Yeh & Liao, "YOLOv9: Learning What You Want to Learn Using Programmable
Gradient Information" (2024); block layout and widths follow the reference
implementation's t/s configurations (docs/architecture.md, Models). Only the plain detection
path is built (no PGI auxiliary branch).

Forward contract (:class:`YOLO9`): input ``(B, 3, H, W)`` float RGB in [0, 1] with ``H``
and ``W`` multiples of 32.

* ``train()`` mode: list of 3 raw maps ``(B, 4 * reg_max + nc, H / s, W / s)`` for
  strides ``s = 8, 16, 32`` (channels: 4 sides x ``reg_max`` DFL logits, then class
  logits).
* ``eval()`` mode: ``(decoded, maps)`` with ``decoded (B, 4 + nc, A)`` = ``x1, y1, x2,
  y2`` in input pixels followed by sigmoid class scores, ``A = sum(H / s * W / s)``.

The forward has no host synchronisation and no branching on tensor values, so it can be
captured in a CUDA graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from libreyolo_core.models.common import Conv, dist2bbox, make_anchors, pad_1x1_to_3x3

__all__ = [
    "RepConvN",
    "RepNBottleneck",
    "RepNCSP",
    "ELAN",
    "RepNCSPELAN",
    "AConv",
    "SPPELAN",
    "DDetect",
    "YOLO9Config",
    "CONFIGS",
    "GELANBackbone",
    "PANNeck",
    "YOLO9",
]


class RepConvN(nn.Module):
    """Re-parameterisable conv: SiLU(BN(3x3 conv) + BN(1x1 conv)), no identity branch.

    Shapes: (B, c1, H, W) -> (B, c2, H / s, W / s). :meth:`fuse` merges both branches
    into one biased 3x3 convolution (RepVGG, Ding et al. 2021).
    """

    def __init__(self, c1: int, c2: int, s: int = 1, g: int = 1):
        super().__init__()
        self.conv1 = Conv(c1, c2, 3, s, g, act=False)
        self.conv2: Conv | None = Conv(c1, c2, 1, s, g, act=False)
        self.act = nn.SiLU()

    def forward(self, x: Tensor) -> Tensor:
        y = self.conv1(x)
        if self.conv2 is not None:
            y = y + self.conv2(x)
        return self.act(y)

    @torch.no_grad()
    def fuse(self) -> RepConvN:
        """Fold both BatchNorms and the 1x1 branch into ``conv1`` (inference only)."""
        if self.conv2 is None:
            return self
        k3 = self.conv1.fuse().conv
        k1 = self.conv2.fuse().conv
        assert k3.bias is not None and k1.bias is not None  # fused convs carry a bias
        k3.weight.add_(pad_1x1_to_3x3(k1.weight))
        k3.bias.add_(k1.bias)
        self.conv2 = None
        return self


class RepNBottleneck(nn.Module):
    """RepConvN 3x3 then Conv 3x3 (hidden width = ``c2``), residual when ``c1 == c2``."""

    def __init__(self, c1: int, c2: int, shortcut: bool = True):
        super().__init__()
        self.cv1 = RepConvN(c1, c2)
        self.cv2 = Conv(c2, c2, 3)
        self.add = shortcut and c1 == c2

    def forward(self, x: Tensor) -> Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class RepNCSP(nn.Module):
    """CSP block: 1x1 -> ``n`` RepNBottlenecks, 1x1 skip, concat, 1x1 (hidden ``c2 // 2``)."""

    def __init__(self, c1: int, c2: int, n: int = 1):
        super().__init__()
        h = c2 // 2
        self.cv1 = Conv(c1, h, 1)
        self.cv2 = Conv(c1, h, 1)
        self.cv3 = Conv(2 * h, c2, 1)
        self.m = nn.Sequential(*(RepNBottleneck(h, h) for _ in range(n)))

    def forward(self, x: Tensor) -> Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class ELAN(nn.Module):
    """ELAN: 1x1 to ``part``, split; two chained 3x3 (``c3``) on the second half; concat 4; 1x1.

    Args: c1 input, c2 output, part split width (even), c3 width of the 3x3 convs.
    """

    def __init__(self, c1: int, c2: int, part: int, c3: int):
        super().__init__()
        self.cv1 = Conv(c1, part, 1)
        self.cv2 = Conv(part // 2, c3, 3)
        self.cv3 = Conv(c3, c3, 3)
        self.cv4 = Conv(part + 2 * c3, c2, 1)

    def forward(self, x: Tensor) -> Tensor:
        y = list(self.cv1(x).chunk(2, 1))
        y.append(self.cv2(y[-1]))
        y.append(self.cv3(y[-1]))
        return self.cv4(torch.cat(y, 1))


class RepNCSPELAN(nn.Module):
    """GELAN block: ELAN whose two branches are ``RepNCSP(n) + Conv 3x3``.

    Args: c1 input, c2 output, part split width (even), c3 branch width, n RepNCSP depth.
    """

    def __init__(self, c1: int, c2: int, part: int, c3: int, n: int = 1):
        super().__init__()
        self.cv1 = Conv(c1, part, 1)
        self.cv2 = nn.Sequential(RepNCSP(part // 2, c3, n), Conv(c3, c3, 3))
        self.cv3 = nn.Sequential(RepNCSP(c3, c3, n), Conv(c3, c3, 3))
        self.cv4 = Conv(part + 2 * c3, c2, 1)

    def forward(self, x: Tensor) -> Tensor:
        y = list(self.cv1(x).chunk(2, 1))
        y.append(self.cv2(y[-1]))
        y.append(self.cv3(y[-1]))
        return self.cv4(torch.cat(y, 1))


class AConv(nn.Module):
    """Downsample by 2: 2x2 average pool (stride 1, no padding) then 3x3 stride-2 Conv."""

    def __init__(self, c1: int, c2: int):
        super().__init__()
        self.cv1 = Conv(c1, c2, 3, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.cv1(F.avg_pool2d(x, 2, 1, 0))


class SPPELAN(nn.Module):
    """SPP-ELAN: 1x1 to ``c3``, three chained 5x5 stride-1 max pools, concat 4, 1x1 to ``c2``."""

    def __init__(self, c1: int, c2: int, c3: int | None = None):
        super().__init__()
        c3 = c3 or c2 // 2
        self.cv1 = Conv(c1, c3, 1)
        self.cv5 = Conv(4 * c3, c2, 1)

    def forward(self, x: Tensor) -> Tensor:
        y = [self.cv1(x)]
        for _ in range(3):
            y.append(F.max_pool2d(y[-1], 5, 1, 2))
        return self.cv5(torch.cat(y, 1))


def _out_bias(tower: nn.Module) -> Tensor:
    """The bias of a head tower's last layer (a ``nn.Sequential`` ending in a biased conv)."""
    return cast(Tensor, cast(nn.Sequential, tower)[-1].bias)


class DDetect(nn.Module):
    """Decoupled anchor-free detection head with Distribution Focal Loss box encoding.

    Per level: box tower ``Conv3x3(c -> hb), Conv3x3(hb -> hb, groups 4), Conv1x1(hb ->
    4 * reg_max, groups 4)`` and class tower ``Conv3x3(c -> hc), Conv3x3(hc -> hc),
    Conv1x1(hc -> nc)``, with ``hb = max(ceil4(ch[0] / 4), 4 * reg_max, reg_max)`` and
    ``hc = max(ch[0], min(nc, 100))`` unless ``cls_width`` is given (a model fine-tuned
    from COCO keeps the 80-wide tower it was trained with). Box distances use the DFL integral (Li et al.,
    "Generalized Focal Loss", 2020): softmax over ``reg_max`` bins times ``0..reg_max-1``.

    Args:
        ch: input channels per level.
        nc: number of classes (>= 1).
        reg_max: DFL bins per side.
        strides: input pixels per cell of each level.
        cls_width: class-tower width ``hc`` (default: the formula above).

    Raises:
        ValueError: ``nc < 1`` or ``len(ch) != len(strides)``.
    """

    proj: Tensor  # (reg_max,) DFL bin values, a non-persistent buffer

    def __init__(
        self,
        ch: tuple[int, ...],
        nc: int,
        reg_max: int = 16,
        strides: tuple[int, ...] = (8, 16, 32),
        cls_width: int | None = None,
    ):
        super().__init__()
        if nc < 1:
            raise ValueError(f"nc must be >= 1, got {nc}")
        if len(ch) != len(strides):
            raise ValueError(f"{len(ch)} input levels but {len(strides)} strides")
        self.nc, self.reg_max, self.strides = nc, reg_max, tuple(int(s) for s in strides)
        self.no = 4 * reg_max + nc
        hb = max(math.ceil(ch[0] / 4 / 4) * 4, 4 * reg_max, reg_max)
        hc = int(cls_width) if cls_width else max(ch[0], min(nc, 100))
        self.box = nn.ModuleList(
            nn.Sequential(
                Conv(c, hb, 3), Conv(hb, hb, 3, g=4), nn.Conv2d(hb, 4 * reg_max, 1, groups=4)
            )
            for c in ch
        )
        self.cls = nn.ModuleList(
            nn.Sequential(Conv(c, hc, 3), Conv(hc, hc, 3), nn.Conv2d(hc, nc, 1)) for c in ch
        )
        self.register_buffer("proj", torch.arange(reg_max, dtype=torch.float32), persistent=False)
        self._anchor_cache: dict[tuple, tuple[Tensor, Tensor]] = {}
        self.reset_bias()

    @torch.no_grad()
    def reset_bias(self) -> None:
        """Bias priors: box logits 1.0; class logits ``ln(5 / nc / (640 / stride)^2)``."""
        for box, cls, s in zip(self.box, self.cls, self.strides, strict=True):
            _out_bias(box).fill_(1.0)
            _out_bias(cls).fill_(math.log(5 / self.nc / (640 / s) ** 2))

    def forward(self, feats: list[Tensor]) -> list[Tensor] | tuple[Tensor, list[Tensor]]:
        maps = [
            torch.cat((box(f), cls(f)), 1)
            for f, box, cls in zip(feats, self.box, self.cls, strict=True)
        ]
        if self.training:
            return maps
        return self.decode(maps), maps

    def anchors(self, maps: list[Tensor]) -> tuple[Tensor, Tensor]:
        """Cached ``points (2, A)`` (pixels) and ``stride (1, A)`` for these map shapes."""
        x = maps[0]
        key = (
            tuple((m.shape[2], m.shape[3]) for m in maps),
            x.device,
            x.dtype,
            torch.is_inference_mode_enabled(),
        )
        hit = self._anchor_cache.get(key)
        if hit is None:
            points, stride = make_anchors(list(key[0]), self.strides, x.device, x.dtype)
            hit = (points.T.contiguous(), stride.T.contiguous())
            # tensors made while a CUDA graph is captured hold values only after replay
            if not (x.is_cuda and torch.cuda.is_current_stream_capturing()):
                self._anchor_cache[key] = hit
        return hit

    def decode(self, maps: list[Tensor]) -> Tensor:
        """Raw maps -> ``(B, 4 + nc, A)``: ``xyxy`` in input pixels and sigmoid scores."""
        b = maps[0].shape[0]
        x = torch.cat([m.flatten(2) for m in maps], 2)
        box, cls = x.split((4 * self.reg_max, self.nc), 1)
        prob = box.view(b, 4, self.reg_max, -1).softmax(2)
        dist = (prob * self.proj.to(prob.dtype).view(1, 1, -1, 1)).sum(2)
        points, stride = self.anchors(maps)
        return torch.cat((dist2bbox(dist * stride, points, dim=1), cls.sigmoid()), 1)

    def _apply(self, fn, *args, **kwargs):
        # .to() / .half() / .cuda(): cached anchors belong to the old device or dtype
        self._anchor_cache = {}
        return super()._apply(fn, *args, **kwargs)


@dataclass(frozen=True)
class YOLO9Config:
    """Widths of one YOLOv9 size (docs/architecture.md, Models).

    Attributes:
        stem: output channels of the two stride-2 stem convs.
        elan: ELAN output (= part) width.
        stages: per backbone stage ``(AConv out, RepNCSPELAN out, part)`` for P3, P4, P5.
        spp: SPPELAN output width.
        up1, up2: neck top-down RepNCSPELAN ``(out, part)``.
        down1, down2: neck bottom-up ``(AConv out, RepNCSPELAN out, part)``.
        n: RepNCSP depth inside every RepNCSPELAN.
    """

    stem: tuple[int, int]
    elan: int
    stages: tuple[tuple[int, int, int], ...]
    spp: int
    up1: tuple[int, int]
    up2: tuple[int, int]
    down1: tuple[int, int, int]
    down2: tuple[int, int, int]
    n: int = 3

    @property
    def head_channels(self) -> tuple[int, int, int]:
        """Channels of the P3, P4, P5 maps that feed the head."""
        return (self.up2[0], self.down1[1], self.down2[1])


CONFIGS: dict[str, YOLO9Config] = {
    "t": YOLO9Config(
        stem=(16, 32),
        elan=32,
        stages=((64, 64, 64), (96, 96, 96), (128, 128, 128)),
        spp=128,
        up1=(96, 96),
        up2=(64, 64),
        down1=(48, 96, 96),
        down2=(64, 128, 128),
    ),
    "s": YOLO9Config(
        stem=(32, 64),
        elan=64,
        stages=((128, 128, 128), (192, 192, 192), (256, 256, 256)),
        spp=256,
        up1=(192, 192),
        up2=(128, 128),
        down1=(96, 192, 192),
        down2=(128, 256, 256),
    ),
}


class GELANBackbone(nn.Module):
    """Conv s2 -> Conv s2 -> ELAN -> 3 x (AConv -> RepNCSPELAN) -> SPPELAN on P5.

    Returns ``(P3, P4, SPP(P5))`` at strides 8, 16, 32.
    """

    def __init__(self, cfg: YOLO9Config):
        super().__init__()
        c0, c1 = cfg.stem
        self.stem = nn.Sequential(Conv(3, c0, 3, 2), Conv(c0, c1, 3, 2))
        self.elan = ELAN(c1, cfg.elan, cfg.elan, cfg.elan // 2)
        stages, c = [], cfg.elan
        for down, out, part in cfg.stages:
            stages.append(
                nn.Sequential(AConv(c, down), RepNCSPELAN(down, out, part, part // 2, cfg.n))
            )
            c = out
        self.stages = nn.ModuleList(stages)
        self.spp = SPPELAN(c, cfg.spp, cfg.spp // 2)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x = self.elan(self.stem(x))
        p3 = self.stages[0](x)
        p4 = self.stages[1](p3)
        p5 = self.spp(self.stages[2](p4))
        return p3, p4, p5


class PANNeck(nn.Module):
    """PAN: top-down (upsample + concat) then bottom-up (AConv + concat) GELAN blocks."""

    def __init__(self, cfg: YOLO9Config):
        super().__init__()
        c3, c4 = cfg.stages[0][1], cfg.stages[1][1]
        n = cfg.n
        self.up1 = RepNCSPELAN(cfg.spp + c4, cfg.up1[0], cfg.up1[1], cfg.up1[1] // 2, n)
        self.up2 = RepNCSPELAN(cfg.up1[0] + c3, cfg.up2[0], cfg.up2[1], cfg.up2[1] // 2, n)
        d1, o1, p1 = cfg.down1
        self.down1_conv = AConv(cfg.up2[0], d1)
        self.down1 = RepNCSPELAN(d1 + cfg.up1[0], o1, p1, p1 // 2, n)
        d2, o2, p2 = cfg.down2
        self.down2_conv = AConv(o1, d2)
        self.down2 = RepNCSPELAN(d2 + cfg.spp, o2, p2, p2 // 2, n)

    def forward(self, p3: Tensor, p4: Tensor, s5: Tensor) -> list[Tensor]:
        """``(P3, P4, SPP(P5))`` -> head inputs ``[P3', P4', P5']``."""
        n4 = self.up1(torch.cat((F.interpolate(s5, scale_factor=2.0, mode="nearest"), p4), 1))
        o3 = self.up2(torch.cat((F.interpolate(n4, scale_factor=2.0, mode="nearest"), p3), 1))
        o4 = self.down1(torch.cat((self.down1_conv(o3), n4), 1))
        o5 = self.down2(torch.cat((self.down2_conv(o4), s5), 1))
        return [o3, o4, o5]


class YOLO9(nn.Module):
    """YOLOv9 detector (GELAN backbone + PAN neck + DDetect head).

    Args:
        cfg: widths (see :data:`CONFIGS`).
        nc: number of classes.
        reg_max: DFL bins per side (16).
        cls_width: class-tower width of the head (default: from ``nc``, see :class:`DDetect`).

    Attributes: ``nc``, ``reg_max``, ``strides`` (8, 16, 32), ``backbone``, ``neck``,
    ``head``. See the module docstring for the train/eval forward contract.
    """

    def __init__(self, cfg: YOLO9Config, nc: int = 80, reg_max: int = 16, cls_width: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.backbone = GELANBackbone(cfg)
        self.neck = PANNeck(cfg)
        self.head = DDetect(cfg.head_channels, nc, reg_max, (8, 16, 32), cls_width=cls_width)

    @property
    def nc(self) -> int:
        return self.head.nc

    @property
    def reg_max(self) -> int:
        return self.head.reg_max

    @property
    def strides(self) -> tuple[int, ...]:
        return self.head.strides

    def forward(self, x: Tensor) -> list[Tensor] | tuple[Tensor, list[Tensor]]:
        return self.head(self.neck(*self.backbone(x)))

    @torch.no_grad()
    def fuse(self) -> YOLO9:
        """Fold every BatchNorm and RepConvN branch into plain convs, in place; returns self.

        Uses BatchNorm running statistics, so the result is for inference (``eval()``);
        it is idempotent. Train-mode BatchNorm behaviour is gone afterwards.
        """
        for m in list(self.modules()):
            if isinstance(m, RepConvN):
                m.fuse()
        for m in list(self.modules()):
            if isinstance(m, Conv):
                m.fuse()
        return self
