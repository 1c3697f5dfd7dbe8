"""YOLOv9 training loss: task-aligned assignment, BCE classification, CIoU box and DFL.

Sources:
* Task-Aligned assignment: Feng et al., "TOOD: Task-aligned One-stage Object Detection"
  (ICCV 2021) -- alignment score ``IoU^6 * p^0.5``, top-k positives per object.
* Distribution Focal Loss: Li et al., "Generalized Focal Loss" (NeurIPS 2020).
* Complete IoU: Zheng et al. (AAAI 2020 / TCYB 2021).
* Recipe (gains 7.5 / 1.5 / 0.5, normalisation by the soft-target sum, assignment
  details): Wang et al., "YOLOv9" (2024), its reference implementation and LibreYOLO 1.6
  (``tests/models/test_loss_reference.py`` compares the numbers).

Everything is vectorised over the batch: targets are padded to ``(B, M, ...)`` with a
mask and matched on ``(B, M, A)`` masks, with CIoU and alignment scores computed only on
the (GT, anchor) pairs that can become positives (and ties broken as a dense argmax
would); there are no per-image or per-box Python loops. The only host read is the per-image maximum target count ``M`` (a shape),
taken from the targets' device (free when targets are on the CPU); set
:attr:`YOLO9Loss.max_targets` to a fixed ``M`` to avoid it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from libreyolo_core.models.common import bbox2dist, bbox_ciou, dist2bbox, make_anchors

if TYPE_CHECKING:
    from libreyolo_core.models.yolo9.nn import YOLO9

__all__ = ["TaskAlignedAssigner", "YOLO9Loss", "pad_targets"]


def pad_targets(
    targets: Tensor, batch_size: int, max_targets: int | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Scatter flat targets into padded per-image tensors (vectorised, order preserving).

    Args:
        targets: ``(N, 6)`` rows ``[batch_idx, cls, x1, y1, x2, y2]`` (pixels).
        batch_size: ``B``; every ``batch_idx`` must lie in ``[0, B)``.
        max_targets: fixed ``M`` (rows beyond it in an image are dropped); ``None`` uses
            the largest per-image count (one host read of that count).

    Returns:
        ``boxes (B, M, 4)`` float, ``cls (B, M)`` long, ``mask (B, M)`` bool (True = real).

    Raises:
        ValueError: ``targets`` is not 2-D with 6 columns.
    """
    if targets.ndim != 2 or targets.shape[1] != 6:
        raise ValueError(
            f"targets must be (N, 6) [batch_idx, cls, x1, y1, x2, y2], got {tuple(targets.shape)}"
        )
    device, n = targets.device, targets.shape[0]
    if n == 0:
        m = max_targets or 0
        return (
            torch.zeros(batch_size, m, 4, device=device),
            torch.zeros(batch_size, m, dtype=torch.long, device=device),
            torch.zeros(batch_size, m, dtype=torch.bool, device=device),
        )
    bi = targets[:, 0].long()
    counts = torch.bincount(bi, minlength=batch_size)
    m = int(max_targets) if max_targets is not None else int(counts.max())
    order = torch.argsort(bi, stable=True)
    starts = counts.cumsum(0) - counts
    rank = torch.empty_like(bi)
    rank[order] = torch.arange(n, device=device) - starts[bi[order]]
    slot = rank.clamp(max=m)  # overflow rows land in slot m, sliced off below
    rows = torch.zeros(batch_size, m + 1, 5, device=device, dtype=torch.float32)
    rows[bi, slot] = targets[:, 1:].float()
    mask = torch.arange(m, device=device) < counts.clamp(max=m)[:, None]
    rows = rows[:, :m]
    return rows[..., 1:], rows[..., 0].long(), mask


class TaskAlignedAssigner(nn.Module):
    """Task-aligned label assignment (TOOD, Feng et al. 2021) as used by YOLOv9.

    For every ground truth (GT) ``g`` and anchor ``a``:

    * valid(g, a): anchor centre inside the GT box or on its edge (as LibreYOLO 1.6) and ``max(l, t, r, b) /
      stride <= reg_max - 1.01`` (the box is representable by the DFL bins);
    * IoU(g, a) = CIoU(GT, predicted box) clamped to [0, 1];
    * score(g, a) = IoU^``iou_power`` x sigmoid(class logit of g's class)^``cls_power``;
    * positives of g: its ``topk`` best valid anchors with score > 0; a GT without any
      gets its single best anchor by the unmasked score (or, when every score is 0, the
      anchor nearest to its centre);
    * an anchor claimed by several GTs keeps the one with the highest IoU;
    * soft class target = one-hot x score / max score of that GT x max IoU of that GT.

    Inputs are detached and computed in float32.

    One deliberate difference from LibreYOLO 1.6 (and Ultralytics), which divide by
    ``max score + 1e-9``: by default the division has no additive term, because the
    alignment scores of badly localised objects early in training (IoU^6 of a poor box)
    lie far below 1e-9, and with the additive term their soft class targets would all be
    near 0, so those classes learn nothing until the boxes improve. ``align_eps = 1e-9``
    gives the reference's numbers exactly (``tests/models/test_loss_reference.py``).
    """

    def __init__(
        self,
        topk: int = 10,
        iou_power: float = 6.0,
        cls_power: float = 0.5,
        reg_max: int = 16,
        align_eps: float = 0.0,
    ):
        super().__init__()
        self.topk, self.iou_power, self.cls_power = topk, iou_power, cls_power
        self.reg_max, self.align_eps = reg_max, align_eps

    @torch.no_grad()
    def forward(
        self,
        pred_scores: Tensor,
        pred_boxes: Tensor,
        points: Tensor,
        stride: Tensor,
        gt_boxes: Tensor,
        gt_cls: Tensor,
        gt_mask: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Match anchors to ground truths.

        Args:
            pred_scores: ``(B, A, C)`` class probabilities (after sigmoid).
            pred_boxes: ``(B, A, 4)`` predicted ``xyxy`` (pixels).
            points: ``(A, 2)`` anchor centres (pixels).
            stride: ``(A, 1)`` stride of each anchor (pixels).
            gt_boxes: ``(B, M, 4)`` GT ``xyxy`` (pixels).
            gt_cls: ``(B, M)`` long class ids in ``[0, C)`` (ids outside are clamped
                instead of raising a device-side error; the data layer validates them).
            gt_mask: ``(B, M)`` bool, True for real (non-padding) GTs.

        Returns:
            ``target_boxes (B, A, 4)`` (pixels; meaningful where ``fg``),
            ``target_scores (B, A, C)`` soft class targets (0 outside ``fg``),
            ``fg (B, A)`` bool positive mask, ``gt_idx (B, A)`` long matched GT index.
        """
        b, a, c = pred_scores.shape
        m = gt_boxes.shape[1]
        device = pred_scores.device
        if m == 0:
            return (
                torch.zeros(b, a, 4, device=device),
                torch.zeros(b, a, c, device=device),
                torch.zeros(b, a, dtype=torch.bool, device=device),
                torch.zeros(b, a, dtype=torch.long, device=device),
            )
        pred_scores, pred_boxes = pred_scores.float(), pred_boxes.float()
        gt_boxes = gt_boxes.float()

        # CIoU and alignment scores only where they can matter: the valid (GT, anchor)
        # pairs (a few per cent of B x M x A) and, below, the whole row of a GT left
        # without a positive; every other pair's IoU and score is 0, as ``score * valid``
        # made it before.
        valid = self._valid(points, stride, gt_boxes) & gt_mask[..., None]  # (B, M, A)
        cls_c = gt_cls.clamp(0, c - 1)
        vb, vm, va = valid.nonzero(as_tuple=True)
        iou = torch.zeros(b, m, a, device=device)
        score = torch.zeros(b, m, a, device=device)
        iou_v, score_v = self._align(gt_boxes[vb, vm], pred_boxes[vb, va], pred_scores[vb, va, cls_c[vb, vm]])
        iou[vb, vm, va] = iou_v
        score[vb, vm, va] = score_v

        # top-k valid anchors with a positive score per GT
        k = min(self.topk, a)
        top_val, top_idx = score.topk(k, dim=-1)
        pos = torch.zeros(b, m, a, dtype=torch.bool, device=device)
        pos.scatter_(-1, top_idx, top_val > 0)

        # GTs left without any positive get their single best anchor by the unmasked
        # score (the nearest anchor to their centre when every score is 0)
        nb, nm = (gt_mask & ~pos.any(-1)).nonzero(as_tuple=True)
        if nb.numel():
            rows = gt_boxes[nb, nm]  # (K, 4)
            iou_r, score_r = self._align(rows[:, None, :], pred_boxes[nb], pred_scores[nb, :, cls_c[nb, nm]])
            best_val, best_idx = score_r.max(-1)
            centre = (rows[:, :2] + rows[:, 2:]) / 2  # (K, 2)
            nearest = (centre[:, None, :] - points[None]).square().sum(-1).argmin(-1)
            best_idx = torch.where(best_val > 0, best_idx, nearest)
            pos[nb, nm, best_idx] = True
            iou[nb, nm, best_idx] = iou_r.gather(1, best_idx[:, None]).squeeze(1)
            score[nb, nm, best_idx] = score_r.gather(1, best_idx[:, None]).squeeze(1)

        # an anchor claimed by several GTs keeps the highest-IoU one (the first such GT on a
        # tie, as argmax over GTs would pick); on the positive pairs only
        fg = pos.any(1)  # (B, A)
        pb, pm, pa = pos.nonzero(as_tuple=True)
        flat = pb * a + pa
        iou_p = iou[pb, pm, pa]
        best = iou.new_full((b * a,), -1.0).scatter_reduce_(0, flat, iou_p, "amax")
        # (not ``iou_p == best``: a NaN IoU of a non-finite step would leave its anchor
        # without any GT; NaN pairs count as winners, finite ones below the best lose)
        won = ~(iou_p < best[flat])
        gt_idx = torch.full((b * a,), m, dtype=torch.long, device=device)
        gt_idx = gt_idx.scatter_reduce_(0, flat[won], pm[won], "amin").view(b, a)
        gt_idx = gt_idx.masked_fill_(~fg, 0)  # (B, A); 0 where no GT claims the anchor

        # soft targets normalised per GT: score / max score x max IoU over each GT's
        # final positives (by default no additive eps: see the class docstring)
        fb, fa = fg.nonzero(as_tuple=True)
        fm = gt_idx[fb, fa]
        gt_flat = fb * m + fm
        score_f, iou_f = score[fb, fm, fa], iou[fb, fm, fa]
        max_score = score.new_zeros(b * m).scatter_reduce_(0, gt_flat, score_f, "amax")
        max_iou = iou.new_zeros(b * m).scatter_reduce_(0, gt_flat, iou_f, "amax")
        if self.align_eps > 0:
            denom = max_score + self.align_eps
        else:
            denom = max_score.clamp(min=torch.finfo(score.dtype).tiny)
        norm = score.new_zeros(b, a)
        norm[fb, fa] = score_f / denom[gt_flat] * max_iou[gt_flat]

        target_cls = gt_cls.gather(1, gt_idx).clamp(0, c - 1)
        target_boxes = gt_boxes.gather(1, gt_idx[..., None].expand(b, a, 4))
        target_scores = torch.zeros(b, a, c, device=device)
        target_scores.scatter_(-1, target_cls[..., None], norm[..., None])
        return target_boxes, target_scores, fg, gt_idx

    def _align(self, gt: Tensor, pred: Tensor, prob: Tensor) -> tuple[Tensor, Tensor]:
        """CIoU clamped to [0, 1] and alignment score ``IoU^iou_power x prob^cls_power`` of
        broadcastable ``xyxy`` boxes ``gt`` and ``pred`` and class probabilities ``prob``."""
        iou = bbox_ciou(gt, pred).clamp_(0, 1)
        return iou, iou.pow(self.iou_power) * prob.pow(self.cls_power)

    def _valid(self, points: Tensor, stride: Tensor, gt_boxes: Tensor) -> Tensor:
        """``(B, M, A)`` anchors inside each GT whose distances fit the DFL range."""
        px, py = points[:, 0], points[:, 1]  # (A,)
        x1, y1, x2, y2 = (v[..., None] for v in gt_boxes.unbind(-1))  # (B, M, 1)
        sides = torch.stack((px - x1, py - y1, x2 - px, y2 - py), 0)  # (4, B, M, A)
        inside = sides.amin(0) >= 0
        fits = sides.amax(0) <= (self.reg_max - 1.01) * stride[:, 0]
        return inside & fits


class YOLO9Loss(nn.Module):
    """YOLOv9 detection loss ``7.5 * box + 1.5 * dfl + 0.5 * cls`` (see module docstring).

    * ``cls``: BCE-with-logits against the soft task-aligned targets, summed, divided by
      ``cls_norm = max(sum of soft targets, 1)``.
    * ``box``: ``sum((1 - CIoU) * w) / cls_norm`` over positive anchors, ``w`` = the
      anchor's soft-target sum; coordinates in stride units.
    * ``dfl``: two-bin cross-entropy on the ``(l, t, r, b)`` distances (stride units,
      clamped to ``[0, reg_max - 1.01]``), mean over the 4 sides, ``* w / cls_norm``.

    Without positives ``box`` and ``dfl`` are exact zeros still attached to the graph.

    Args:
        model: a :class:`~libreyolo_core.models.yolo9.nn.YOLO9` (or anything with ``nc``,
            ``reg_max`` and ``strides``); only these numbers are read.
        box, dfl, cls: loss gains.
        topk, iou_power, cls_power: assigner settings.

    Attributes:
        item_names: ``("box", "dfl", "cls")``, the order of the returned items.
        normalizer_reduce: optional callable applied to the soft-target sum before the
            ``max(., 1)`` clamp, e.g. an all-reduce mean across DDP ranks.
        max_targets: optional fixed per-image target capacity (avoids the host read of
            the per-image maximum; extra targets are dropped).
        last_num_fg: detached count of positive anchors in the last call (for logging).

    Call: ``loss(outputs, targets, batch_size) -> (total, items)`` with ``outputs`` the 3
    raw maps ``(B, 4 * reg_max + nc, h, w)``, ``targets (N, 6)`` ``[batch_idx, cls, x1,
    y1, x2, y2]`` in input pixels; ``total`` is a scalar tensor with grad and ``items``
    a detached ``(3,)`` tensor of the weighted components.

    Raises:
        ValueError: wrong number of maps, channel count or target layout.
    """

    item_names = ("box", "dfl", "cls")

    def __init__(
        self,
        model: nn.Module,
        box: float = 7.5,
        dfl: float = 1.5,
        cls: float = 0.5,
        topk: int = 10,
        iou_power: float = 6.0,
        cls_power: float = 0.5,
    ):
        super().__init__()
        spec = cast("YOLO9", model)  # duck-typed: any module with nc, reg_max, strides
        self.nc = int(spec.nc)
        self.reg_max = int(spec.reg_max)
        self.strides = tuple(int(s) for s in spec.strides)
        self.gains = (float(box), float(dfl), float(cls))
        self.assigner = TaskAlignedAssigner(topk, iou_power, cls_power, self.reg_max)
        self.normalizer_reduce: Callable[[Tensor], Tensor] | None = None
        self.max_targets: int | None = None
        self._anchor_cache: dict[tuple, tuple[Tensor, Tensor, Tensor, Tensor]] = {}
        self.last_num_fg: Tensor | None = None

    def anchors(self, outputs: list[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Cached per map shapes and device: ``points (A, 2)`` pixels, ``grid (A, 2)``
        stride units, ``stride (A, 1)`` and the DFL bin values ``proj (reg_max,)``."""
        key = (tuple((o.shape[2], o.shape[3]) for o in outputs), outputs[0].device)
        hit = self._anchor_cache.get(key)
        if hit is None:
            points, stride = make_anchors(list(key[0]), self.strides, key[1], torch.float32)
            proj = torch.arange(self.reg_max, device=key[1], dtype=torch.float32)
            hit = (points, points / stride, stride, proj)
            self._anchor_cache[key] = hit
        return hit

    def forward(
        self, outputs: list[Tensor], targets: Tensor, batch_size: int
    ) -> tuple[Tensor, Tensor]:
        if len(outputs) != len(self.strides):
            raise ValueError(f"expected {len(self.strides)} output maps, got {len(outputs)}")
        no = 4 * self.reg_max + self.nc
        if outputs[0].shape[1] != no:
            raise ValueError(f"output maps must have {no} channels, got {outputs[0].shape[1]}")
        b = outputs[0].shape[0]
        if b != batch_size:
            raise ValueError(f"batch_size {batch_size} does not match outputs batch {b}")
        with torch.autocast(outputs[0].device.type, enabled=False):  # the loss runs in fp32
            return self._loss(outputs, targets, batch_size)

    def _loss(
        self, outputs: list[Tensor], targets: Tensor, batch_size: int
    ) -> tuple[Tensor, Tensor]:
        b, r = batch_size, self.reg_max
        # one contiguous (B, A, no) fp32 copy; the slices below are views
        x = torch.cat([o.flatten(2) for o in outputs], 2).float().transpose(1, 2).contiguous()
        dist_logits = x[..., : 4 * r].view(b, -1, 4, r)
        cls_logits = x[..., 4 * r :]
        points, grid, stride, proj = self.anchors(outputs)

        log_prob = dist_logits.log_softmax(-1)  # (B, A, 4, R)
        dist = (log_prob.exp() * proj).sum(-1)  # (B, A, 4) stride units; no autocast matmul
        pred_grid = dist2bbox(dist, grid)  # (B, A, 4) stride units

        gt_boxes, gt_cls, gt_mask = pad_targets(targets.to(x.device), batch_size, self.max_targets)
        target_boxes, target_scores, fg, _ = self.assigner(
            cls_logits.detach().sigmoid(),
            pred_grid.detach() * stride,
            points,
            stride,
            gt_boxes,
            gt_cls,
            gt_mask,
        )
        self.last_num_fg = fg.sum().detach()

        score_sum = target_scores.sum()
        if self.normalizer_reduce is not None:
            score_sum = self.normalizer_reduce(score_sum)
        cls_norm = score_sum.clamp(min=1.0)

        loss_cls = F.binary_cross_entropy_with_logits(cls_logits, target_scores, reduction="sum")
        loss_cls = loss_cls / cls_norm

        weight = target_scores.sum(-1)  # (B, A); 0 outside fg
        target_grid = target_boxes / stride
        ciou = bbox_ciou(pred_grid, target_grid)
        loss_box = ((1.0 - ciou) * weight).sum() / cls_norm

        tdist = bbox2dist(target_grid, grid).clamp_(0, r - 1.01)  # (B, A, 4)
        left = tdist.floor()
        w_left = left + 1 - tdist
        idx = left.long().clamp_(max=r - 2)[..., None]
        lp_left = log_prob.gather(-1, idx).squeeze(-1)
        lp_right = log_prob.gather(-1, idx + 1).squeeze(-1)
        dfl = -(lp_left * w_left + lp_right * (1 - w_left)).mean(-1)
        loss_dfl = (dfl * weight).sum() / cls_norm

        gb, gd, gc = self.gains
        parts = torch.stack((gb * loss_box, gd * loss_dfl, gc * loss_cls))
        return parts.sum(), parts.detach()
