"""YOLOX training loss: SimOTA dynamic-k assignment, IoU / objectness / class BCE and L1.

Sources:
* Ge, Liu, Wang, Li & Sun, "YOLOX: Exceeding YOLO Series in 2021" (arXiv 2107.08430),
  and its reference implementation (Megvii-BaseDetection/YOLOX, ``yolo_head.py``:
  ``get_losses``, ``get_assignments``, ``simota_matching``).
* Ge, Liu, Li, Yoshie & Sun, "OTA: Optimal Transport Assignment for Object Detection"
  (CVPR 2021), of which SimOTA is the dynamic-k top-k approximation.

Assignment (per image, vectorised over the batch):

* candidates (the centre prior of YOLOX 0.3 and LibreYOLO 1.6): anchors whose centre
  ``(grid + 0.5) * stride`` lies within ``center_radius`` (1.5) strides of some GT's
  centre; the other anchors of the image take no part. A (GT, candidate) pair is
  "geometric" when the candidate lies in that GT's own centre region; the others cost an
  extra ``1e6``. (YOLOX's 2021 release also took anchors inside the box, radius 2.5;
  the released code and LibreYOLO dropped that.)
* cost = BCE(sqrt(sigmoid(cls) * sigmoid(obj)), one-hot) summed over classes
  + ``iou_weight`` (3) x ``-log(IoU + 1e-8)`` (+ 1e6 off-geometry), in float32 with
  autocast off;
* ``dynamic_k = max(int(sum of the top-10 IoUs of the GT's candidates)), 1)``; each GT
  takes its ``dynamic_k`` cheapest candidates; an anchor claimed by several GTs goes to
  the GT of lowest cost for it among all the image's GTs.

Losses, each summed then divided by ``num_fg = max(positives in the batch, 1)``:
``iou = 1 - IoU^2`` on positives (x ``iou_gain`` 5); ``obj`` BCE over every anchor
(target = positive mask); ``cls`` BCE on positives against one-hot x matched IoU; ``l1``
on the raw regression outputs of positives against ``(cx / s - gx, cy / s - gy,
log(w / s + 1e-8), log(h / s + 1e-8))``, only when :attr:`YOLOXLoss.use_l1` (switched on
when mosaic closes).

Targets are padded to ``(B, M, ...)`` with a mask and the matching runs on dense
``(B, M, A)`` tensors: no per-image or per-box Python loop. The class-cost term is
decomposed (``sum_c BCE(p_c, onehot_c) = sum_c -log(1 - p_c) + log(1 - p_g) - log p_g``)
so nothing of shape ``(B, M, A, C)`` is materialised.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from libreyolo_core.models.common import make_anchors
from libreyolo_core.models.yolo9.loss import pad_targets

if TYPE_CHECKING:
    from libreyolo_core.models.yolox.nn import YOLOX

__all__ = ["SimOTAAssigner", "YOLOXLoss", "box_iou_cxcywh"]

_FAR = 1e6  # cost of a candidate pair outside that GT's own centre region
_NOT_CANDIDATE = 1e10  # cost of an anchor that is no candidate at all


def box_iou_cxcywh(a: Tensor, b: Tensor, eps: float = 1e-16) -> Tensor:
    """IoU of broadcastable ``(..., 4)`` ``cx, cy, w, h`` boxes; returns the broadcast shape.

    Same arithmetic as the reference ``bboxes_iou(..., xyxy=False)`` / ``IOUloss``: an
    empty intersection gives 0.
    """
    a_tl, a_br = a[..., :2] - a[..., 2:] / 2, a[..., :2] + a[..., 2:] / 2
    b_tl, b_br = b[..., :2] - b[..., 2:] / 2, b[..., :2] + b[..., 2:] / 2
    tl, br = torch.maximum(a_tl, b_tl), torch.minimum(a_br, b_br)
    inter = (br - tl).clamp(min=0).prod(-1)
    union = a[..., 2:].prod(-1) + b[..., 2:].prod(-1) - inter
    return inter / (union + eps)


class SimOTAAssigner(nn.Module):
    """SimOTA dynamic-k label assignment (Ge et al. 2021), batched.

    Args:
        center_radius: half-side of the centre region, in strides (1.5).
        iou_weight: weight of ``-log(IoU)`` in the cost (3.0).
        topk: number of best IoUs summed for ``dynamic_k`` (10).
    """

    def __init__(self, center_radius: float = 1.5, iou_weight: float = 3.0, topk: int = 10):
        super().__init__()
        self.center_radius, self.iou_weight, self.topk = center_radius, iou_weight, topk

    @torch.no_grad()
    def forward(
        self,
        cls_logits: Tensor,
        obj_logits: Tensor,
        pred_boxes: Tensor,
        centres: Tensor,
        stride: Tensor,
        gt_boxes: Tensor,
        gt_cls: Tensor,
        gt_mask: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Match anchors to ground truths.

        Args:
            cls_logits: ``(B, A, C)`` class logits.
            obj_logits: ``(B, A)`` objectness logits.
            pred_boxes: ``(B, A, 4)`` decoded ``cx, cy, w, h`` (input pixels).
            centres: ``(A, 2)`` anchor centres ``(grid + 0.5) * stride`` (pixels).
            stride: ``(A,)`` stride of each anchor (pixels).
            gt_boxes: ``(B, M, 4)`` GT ``cx, cy, w, h`` (pixels).
            gt_cls: ``(B, M)`` long class ids (clamped into ``[0, C)``).
            gt_mask: ``(B, M)`` bool, True for real GTs.

        Returns:
            ``fg (B, A)`` bool positives, ``gt_idx (B, A)`` long matched GT (0 outside
            ``fg``), ``matched_iou (B, A)`` IoU of each positive with its GT (0 outside).
        """
        b, a, c = cls_logits.shape
        m = gt_boxes.shape[1]
        device = cls_logits.device
        if m == 0:
            zeros = torch.zeros(b, a, device=device)
            return zeros.bool(), zeros.long(), zeros
        cls_logits, obj_logits = cls_logits.float(), obj_logits.float()
        pred_boxes, gt_boxes = pred_boxes.float(), gt_boxes.float()

        # geometry: (B, M, A)
        cx, cy = centres[:, 0], centres[:, 1]  # (A,)
        gcx, gcy = gt_boxes[..., 0:1], gt_boxes[..., 1:2]  # (B, M, 1)
        r = self.center_radius * stride
        in_ctr = (cx > gcx - r) & (cx < gcx + r) & (cy > gcy - r) & (cy < gcy + r)
        valid = gt_mask[..., None]
        candidate = (in_ctr & valid).any(1)  # (B, A) anchors in any GT's centre region
        geometric = in_ctr

        iou = box_iou_cxcywh(gt_boxes[:, :, None, :], pred_boxes[:, None, :, :])  # (B, M, A)
        iou = iou * (candidate[:, None, :] & valid)

        # class cost without a (B, M, A, C) tensor
        p = (cls_logits.sigmoid() * obj_logits.sigmoid()[..., None]).sqrt()  # (B, A, C)
        log_p = p.log().clamp(min=-100.0)  # BCE's log clamp (torch semantics)
        log_1mp = torch.log1p(-p).clamp(min=-100.0)
        neg_sum = -log_1mp.sum(-1)  # (B, A)
        cls_idx = gt_cls.clamp(0, c - 1)[..., None].expand(b, m, a)
        lp = log_p.transpose(1, 2).gather(1, cls_idx)  # (B, M, A)
        l1mp = log_1mp.transpose(1, 2).gather(1, cls_idx)
        cost_cls = neg_sum[:, None, :] + l1mp - lp

        cost = cost_cls + self.iou_weight * -torch.log(iou + 1e-8) + _FAR * ~geometric
        usable = candidate[:, None, :] & valid
        cost = torch.where(usable, cost, torch.full_like(cost, _NOT_CANDIDATE))

        # dynamic k from the top IoUs of each GT's candidates
        k = min(self.topk, a)
        dynamic_k = iou.topk(k, -1).values.sum(-1).int().clamp(min=1)  # (B, M)
        low_cost, low_idx = cost.topk(k, -1, largest=False)  # (B, M, k) ascending
        take = torch.arange(k, device=device) < dynamic_k[..., None]
        take &= (low_cost < _NOT_CANDIDATE / 2) & valid
        match = torch.zeros(b, m, a, dtype=torch.bool, device=device)
        match.scatter_(-1, low_idx, take)

        # an anchor claimed by several GTs goes to its cheapest GT among all of them
        fg = match.any(1)  # (B, A)
        several = match.sum(1) > 1  # (B, A)
        cheapest = torch.where(valid, cost, torch.full_like(cost, float("inf"))).argmin(1)
        claimed = torch.where(match, cost, torch.full_like(cost, float("inf"))).argmin(1)
        gt_idx = torch.where(several, cheapest, claimed) * fg
        matched_iou = iou.gather(1, gt_idx[:, None]).squeeze(1) * fg
        return fg, gt_idx, matched_iou


class YOLOXLoss(nn.Module):
    """YOLOX detection loss ``iou_gain * iou + obj + cls + l1`` (see the module docstring).

    Args:
        model: a :class:`~libreyolo_core.models.yolox.nn.YOLOX` (or anything with ``nc`` and
            ``strides``); only these numbers are read.
        iou_gain: weight of the IoU term (5.0).
        center_radius, iou_weight, topk: assigner settings (1.5, 3.0, 10).

    Attributes:
        item_names: ``("iou", "obj", "cls", "l1")``, the order of the returned items
            (``iou`` already weighted; ``l1`` is 0 while :attr:`use_l1` is off).
        use_l1: add the L1 term (off at construction; the family's ``on_mosaic_disable``
            turns it on).
        normalizer_reduce: optional callable applied to the positive count before the
            ``max(., 1)`` clamp, e.g. an all-reduce mean across DDP ranks.
        max_targets: optional fixed per-image target capacity (avoids the host read of the
            per-image maximum; extra targets are dropped).
        last_num_fg: detached count of positive anchors in the last call.
        last_assign_s: wall seconds of the last assignment when :attr:`time_assign` is
            set (synchronises CUDA around it; for benchmarks only).

    Call: ``loss(outputs, targets, batch_size) -> (total, items)`` with ``outputs`` the 3
    raw maps ``(B, 5 + nc, h, w)``, ``targets (N, 6)`` ``[batch_idx, cls, x1, y1, x2, y2]``
    in input pixels; ``total`` is a scalar tensor with grad and ``items`` a detached
    ``(4,)`` tensor.

    Raises:
        ValueError: wrong number of maps, channel count or batch size.
    """

    item_names = ("iou", "obj", "cls", "l1")

    def __init__(
        self,
        model: nn.Module,
        iou_gain: float = 5.0,
        center_radius: float = 1.5,
        iou_weight: float = 3.0,
        topk: int = 10,
    ):
        super().__init__()
        spec = cast("YOLOX", model)  # duck-typed: any module with nc and strides
        self.nc = int(spec.nc)
        self.strides = tuple(int(s) for s in spec.strides)
        self.iou_gain = float(iou_gain)
        self.assigner = SimOTAAssigner(center_radius, iou_weight, topk)
        self.use_l1 = False
        self.normalizer_reduce: Callable[[Tensor], Tensor] | None = None
        self.max_targets: int | None = None
        self.last_num_fg: Tensor | None = None
        self.time_assign = False
        self.last_assign_s = 0.0
        self._grid_cache: dict[tuple, tuple[Tensor, Tensor]] = {}

    def grids(self, outputs: list[Tensor]) -> tuple[Tensor, Tensor]:
        """Cached per map shapes and device: cell-corner ``grid (A, 2)`` in cells and
        ``stride (A,)`` in pixels."""
        key = (tuple((o.shape[2], o.shape[3]) for o in outputs), outputs[0].device)
        hit = self._grid_cache.get(key)
        if hit is None:
            pts, stride = make_anchors(list(key[0]), self.strides, key[1], torch.float32, 0.0)
            hit = (pts / stride, stride[:, 0])
            self._grid_cache[key] = hit
        return hit

    def forward(
        self, outputs: list[Tensor], targets: Tensor, batch_size: int
    ) -> tuple[Tensor, Tensor]:
        if len(outputs) != len(self.strides):
            raise ValueError(f"expected {len(self.strides)} output maps, got {len(outputs)}")
        if outputs[0].shape[1] != 5 + self.nc:
            raise ValueError(
                f"output maps must have {5 + self.nc} channels, got {outputs[0].shape[1]}"
            )
        if outputs[0].shape[0] != batch_size:
            raise ValueError(
                f"batch_size {batch_size} does not match outputs batch {outputs[0].shape[0]}"
            )
        with torch.autocast(outputs[0].device.type, enabled=False):  # loss and cost in fp32
            return self._loss(outputs, targets, batch_size)

    def _assign(self, *args: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if not self.time_assign:
            return self.assigner(*args)
        import time

        sync = torch.cuda.synchronize if args[0].is_cuda else (lambda: None)
        sync()
        t0 = time.perf_counter()
        out = self.assigner(*args)
        sync()
        self.last_assign_s = time.perf_counter() - t0
        return out

    def _loss(
        self, outputs: list[Tensor], targets: Tensor, batch_size: int
    ) -> tuple[Tensor, Tensor]:
        b = batch_size
        x = torch.cat([o.flatten(2) for o in outputs], 2).float().transpose(1, 2)  # (B, A, no)
        grid, stride = self.grids(outputs)
        raw_reg, obj_logits, cls_logits = x[..., :4], x[..., 4], x[..., 5:]
        s = stride[:, None]
        pred_boxes = torch.cat(((raw_reg[..., :2] + grid) * s, raw_reg[..., 2:].exp() * s), -1)

        boxes, gt_cls, gt_mask = pad_targets(targets.to(x.device), b, self.max_targets)
        if boxes.shape[1] == 0:  # no targets: one masked-out row keeps the gathers valid
            boxes, gt_cls = boxes.new_zeros(b, 1, 4), gt_cls.new_zeros(b, 1)
            gt_mask = gt_mask.new_zeros(b, 1)
        gt = torch.cat(((boxes[..., :2] + boxes[..., 2:]) / 2, boxes[..., 2:] - boxes[..., :2]), -1)
        fg, gt_idx, matched_iou = self._assign(
            cls_logits.detach(),
            obj_logits.detach(),
            pred_boxes.detach(),
            (grid + 0.5) * s,
            stride,
            gt,
            gt_cls,
            gt_mask,
        )
        num_fg = fg.sum().float()
        self.last_num_fg = num_fg.detach()
        if self.normalizer_reduce is not None:
            num_fg = self.normalizer_reduce(num_fg)
        norm = num_fg.clamp(min=1.0)

        fgf = fg.float()
        target_box = gt.gather(1, gt_idx[..., None].expand(b, -1, 4))  # (B, A, 4)
        iou = box_iou_cxcywh(pred_boxes, target_box)
        loss_iou = ((1.0 - iou.square()) * fgf).sum() / norm

        loss_obj = F.binary_cross_entropy_with_logits(obj_logits, fgf, reduction="sum") / norm

        target_cls = gt_cls.gather(1, gt_idx).clamp(0, self.nc - 1)
        cls_target = F.one_hot(target_cls, self.nc).float() * matched_iou[..., None]
        bce = F.binary_cross_entropy_with_logits(cls_logits, cls_target, reduction="none")
        loss_cls = (bce.sum(-1) * fgf).sum() / norm

        if self.use_l1:
            l1_target = torch.cat(
                (
                    target_box[..., :2] / s - grid,
                    torch.log(target_box[..., 2:] / s + 1e-8),
                ),
                -1,
            )
            loss_l1 = ((raw_reg - l1_target).abs().sum(-1) * fgf).sum() / norm
        else:
            loss_l1 = x.new_zeros(())

        parts = torch.stack((self.iou_gain * loss_iou, loss_obj, loss_cls, loss_l1))
        return parts.sum(), parts.detach()
