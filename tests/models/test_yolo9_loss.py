"""YOLOv9 loss: target padding, task-aligned assignment, loss values and a tiny overfit."""

from __future__ import annotations

import pytest
import torch
from torchvision.ops import complete_box_iou_loss

from libreyolo_core.models import get_family
from libreyolo_core.models.common import bbox_ciou, make_anchors
from libreyolo_core.models.yolo9.loss import TaskAlignedAssigner, pad_targets

yolo9 = get_family("yolo9")


@pytest.fixture(autouse=True)
def _one_thread():
    """Single intra-op thread: these tensors are small, and on a shared CPU spinning
    OpenMP workers make the tests many times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------------------- helpers


def test_bbox_ciou_matches_torchvision():
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(200, 2, generator=g) * 100
    a = torch.cat((xy, xy + torch.rand(200, 2, generator=g) * 50 + 1), 1)
    xy = xy + torch.randn(200, 2, generator=g) * 10
    b = torch.cat((xy, xy + torch.rand(200, 2, generator=g) * 50 + 1), 1)
    ref = 1 - complete_box_iou_loss(a, b, reduction="none", eps=1e-7)
    torch.testing.assert_close(bbox_ciou(a, b), ref, rtol=1e-4, atol=1e-5)
    # broadcasting pairwise form
    pair = bbox_ciou(a[:5, None], b[None, :7])
    assert pair.shape == (5, 7)
    torch.testing.assert_close(pair[2, 3], bbox_ciou(a[2], b[3]))
    # degenerate (all-zero) boxes stay finite
    assert torch.isfinite(bbox_ciou(torch.zeros(4), a[0])).all()


def test_pad_targets_vectorised_and_order_free():
    t = torch.tensor(
        [
            [1, 3, 10, 10, 20, 20],
            [0, 1, 0, 0, 5, 5],
            [1, 2, 30, 30, 40, 40],
            [1, 0, 1, 1, 2, 2],
        ],
        dtype=torch.float32,
    )
    boxes, cls, mask = pad_targets(t, 3)
    assert boxes.shape == (3, 3, 4) and cls.shape == (3, 3) and mask.shape == (3, 3)
    assert mask.tolist() == [[True, False, False], [True, True, True], [False] * 3]
    assert cls[1].tolist() == [3, 2, 0] and cls[0, 0] == 1  # order inside an image kept
    assert boxes[1, 1].tolist() == [30, 30, 40, 40]
    assert boxes[2].abs().sum() == 0
    boxes, cls, mask = pad_targets(t, 3, max_targets=2)  # overflow rows dropped
    assert mask.tolist() == [[True, False], [True, True], [False, False]]
    assert cls[1].tolist() == [3, 2]
    boxes, cls, mask = pad_targets(torch.zeros(0, 6), 2)
    assert boxes.shape == (2, 0, 4) and mask.shape == (2, 0)
    with pytest.raises(ValueError, match="N, 6"):
        pad_targets(torch.zeros(3, 5), 2)


# ---------------------------------------------------------------------------- assigner

SHAPES = [(16, 16), (8, 8), (4, 4)]  # 128 x 128 input
STRIDES = (8, 16, 32)
GT_BIG = [0.0, 0.0, 64.0, 64.0]  # class 0
GT_MID = [16.0, 16.0, 48.0, 48.0]  # class 1, nested in GT_BIG
GT_TINY = [101.0, 101.0, 104.0, 104.0]  # class 2, no anchor centre inside


def _grid():
    points, stride = make_anchors(SHAPES, STRIDES)
    return points, stride


def _assign(gts, classes, pred_boxes=None):
    points, stride = _grid()
    a = points.shape[0]
    if pred_boxes is None:  # every anchor predicts a 32 x 32 box centred on itself
        pred_boxes = torch.cat((points - 16, points + 16), 1)
    pred_scores = torch.full((1, a, 3), 0.5)
    gt_boxes = torch.tensor([gts], dtype=torch.float32)
    gt_cls = torch.tensor([classes])
    mask = torch.ones_like(gt_cls, dtype=torch.bool)
    tb, ts, fg, gt_idx = TaskAlignedAssigner()(
        pred_scores, pred_boxes[None], points, stride, gt_boxes, gt_cls, mask
    )
    return tb[0], ts[0], fg[0], gt_idx[0], pred_boxes


def _positives(gt, cls):
    _, _, fg, _, _ = _assign([gt], [cls])
    return set(fg.nonzero()[:, 0].tolist())


def test_assigner_topk_inside_box_and_duplicates_go_to_best_iou():
    points, _ = _grid()
    alone_big, alone_mid = _positives(GT_BIG, 0), _positives(GT_MID, 1)
    shared = alone_big & alone_mid
    assert 0 < len(alone_big) <= 10 and 0 < len(alone_mid) <= 10
    assert shared, "the hand-made case must contain anchors claimed by both boxes"

    tb, ts, fg, gt_idx, preds = _assign([GT_BIG, GT_MID, GT_TINY], [0, 1, 2])
    gts = torch.tensor([GT_BIG, GT_MID, GT_TINY])
    iou = bbox_ciou(gts[:, None], preds[None]).clamp(0, 1)  # (3, A)
    fg_idx = set(fg.nonzero()[:, 0].tolist())
    assert alone_big | alone_mid <= fg_idx
    for a in alone_big | alone_mid:
        owner = int(gt_idx[a])
        if a in shared:
            assert owner == int(iou[:2, a].argmax())
        else:
            assert owner == (0 if a in alone_big else 1)
        x, y = points[a].tolist()
        x1, y1, x2, y2 = gts[owner].tolist()
        assert x1 < x < x2 and y1 < y < y2  # positives lie inside their box
        assert tb[a].tolist() == gts[owner].tolist()
        assert ts[a].nonzero()[:, 0].tolist() == [owner]  # one-hot of the GT class
    assert any(int(gt_idx[a]) == 1 for a in shared)

    # the tiny box has no valid anchor: it gets exactly one, the best-aligned one
    tiny = [a for a in fg_idx if int(gt_idx[a]) == 2]
    assert len(tiny) == 1
    assert points[tiny[0]].tolist() == [104.0, 104.0]

    # soft targets: per GT, the best anchor gets that GT's max IoU over its positives
    for g in range(3):
        own = [a for a in fg_idx if int(gt_idx[a]) == g]
        best = ts[own, g].max()
        assert best == pytest.approx(float(iou[g, own].max()), rel=1e-4)
        assert (ts[own, g] <= best + 1e-6).all()
    assert ts[~fg].abs().sum() == 0
    assert len(fg_idx) == len(alone_big | alone_mid) + 1


def test_assigner_zero_scores_fall_back_to_nearest_anchor():
    points, _ = _grid()
    far = torch.tensor([500.0, 500.0, 501.0, 501.0]).expand(points.shape[0], 4)
    _, ts, fg, gt_idx, _ = _assign([GT_TINY, GT_BIG], [2, 0], pred_boxes=far)
    assert fg.sum() == 2  # one anchor per GT despite all scores being 0
    pos = fg.nonzero()[:, 0].tolist()
    owners = {int(gt_idx[a]): a for a in pos}
    assert points[owners[0]].tolist() == [104.0, 104.0]
    assert ts.sum() == 0  # IoU 0 -> zero soft target


def test_assigner_ignores_padding_rows():
    points, stride = _grid()
    a = points.shape[0]
    preds = torch.cat((points - 16, points + 16), 1)[None]
    gt = torch.tensor([[GT_MID, [0.0, 0.0, 0.0, 0.0]]])
    mask = torch.tensor([[True, False]])
    _, _, fg, gt_idx = TaskAlignedAssigner()(
        torch.full((1, a, 3), 0.5), preds, points, stride, gt, torch.tensor([[1, 0]]), mask
    )
    assert fg.any() and (gt_idx[fg] == 0).all()


def _dense_assign(asg, scores, preds, points, stride, gt, cls, mask):
    """The assignment as its definition reads (TaskAlignedAssigner's docstring), on dense
    ``(B, M, A)`` tensors: the oracle for the assigner, which computes scores on the valid
    pairs only."""
    b, a, c = scores.shape
    valid = asg._valid(points, stride, gt) & mask[..., None]
    iou = bbox_ciou(gt[:, :, None], preds[:, None]).clamp(0, 1)
    prob = scores.transpose(1, 2).gather(1, cls.clamp(0, c - 1)[..., None].expand(-1, -1, a))
    score = iou.pow(asg.iou_power) * prob.pow(asg.cls_power)
    top_val, top_idx = (score * valid).topk(min(asg.topk, a), -1)
    pos = torch.zeros_like(valid).scatter_(-1, top_idx, top_val > 0)
    best_val, best_idx = score.max(-1)
    centre = (gt[..., :2] + gt[..., 2:]) / 2
    nearest = (centre[:, :, None] - points).square().sum(-1).argmin(-1)
    best_idx = torch.where(best_val > 0, best_idx, nearest)
    need = mask & ~pos.any(-1)
    pos.scatter_(-1, best_idx[..., None], need[..., None] | pos.gather(-1, best_idx[..., None]))
    fg = pos.any(1)
    gt_idx = torch.where(pos, iou, -1.0).argmax(1)
    pos = torch.zeros_like(pos).scatter_(1, gt_idx[:, None], fg[:, None])
    max_score = (score * pos).amax(-1, keepdim=True)
    norm = (score * pos / max_score.clamp(min=torch.finfo(score.dtype).tiny)
            * (iou * pos).amax(-1, keepdim=True)).sum(1)
    target_scores = torch.zeros(b, a, c).scatter_(-1, cls.gather(1, gt_idx)[..., None], norm[..., None])
    return gt.gather(1, gt_idx[..., None].expand(b, a, 4)), target_scores, fg, gt_idx


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_assigner_equals_its_dense_definition(seed):
    """Many GTs per image (padding rows, tiny boxes that fall back to one anchor, boxes that
    claim the same anchors, quantised IoUs that tie) on a 320 px grid: the same fg, GT
    indices and target boxes, and soft targets within float32 rounding."""
    g = torch.Generator().manual_seed(seed)
    points, stride = make_anchors([(40, 40), (20, 20), (10, 10)], (8, 16, 32), "cpu", torch.float32)
    b, a, c, m = 4, points.shape[0], 5, 30
    half = torch.rand(a, 2, generator=g) * 30 + 1
    preds = torch.cat((points - half, points + half), 1)[None].expand(b, a, 4).contiguous()
    preds = (preds / 4).round() * 4  # equal boxes: ties between GTs and anchors
    scores = torch.rand(b, a, c, generator=g)
    xy = torch.rand(b, m, 2, generator=g) * 300
    wh = torch.where(torch.rand(b, m, 1, generator=g) < 0.3, 2.0, torch.rand(b, m, 2, generator=g) * 80 + 4)
    gt = torch.cat((xy, xy + wh), -1)
    gt[:, 1] = gt[:, 0]  # a duplicate GT per image
    cls = torch.randint(0, c, (b, m), generator=g)
    mask = torch.rand(b, m, generator=g) > 0.2
    asg = TaskAlignedAssigner()
    got = asg(scores, preds, points, stride, gt, cls, mask)
    want = _dense_assign(asg, scores, preds, points, stride, gt, cls, mask)
    assert want[2].sum() > 0 and torch.equal(got[2], want[2])
    assert torch.equal(got[3], want[3]) and torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=1e-7)


def test_assigner_gives_every_claimed_anchor_a_gt_when_predictions_are_nan():
    """A non-finite step (NaN predicted boxes): the assignment still completes (the loss
    is NaN and the guard skips the step) instead of indexing past the GTs, which ended
    the run with an IndexError."""
    points, stride = make_anchors([(8, 8), (4, 4)], (8, 16), "cpu", torch.float32)
    a = points.shape[0]
    preds = torch.full((1, a, 4), float("nan"))
    scores = torch.rand(1, a, 2)
    gt = torch.tensor([[[4.0, 4.0, 40.0, 40.0], [8.0, 8.0, 60.0, 50.0]]])
    boxes, target_scores, fg, gt_idx = TaskAlignedAssigner()(
        scores, preds, points, stride, gt, torch.tensor([[0, 1]]), torch.ones(1, 2, dtype=torch.bool))
    assert fg.any() and int(gt_idx.max()) < 2 and boxes.shape == (1, a, 4)


# ---------------------------------------------------------------------------- loss


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = yolo9.build_model("t", 3).train()
    loss = yolo9.build_loss(model)
    x = torch.rand(2, 3, 64, 96)
    targets = torch.tensor(
        [
            [0, 0, 4, 4, 40, 30],
            [0, 2, 50, 10, 90, 60],
            [1, 1, 10, 20, 30, 50],
        ],
        dtype=torch.float32,
    )
    return model, loss, x, targets


def test_loss_contract_and_values(setup):
    model, loss, x, targets = setup
    assert loss.item_names == ("box", "dfl", "cls")
    assert loss.normalizer_reduce is None
    total, items = loss(model(x), targets, 2)
    assert total.ndim == 0 and total.requires_grad and torch.isfinite(total)
    assert items.shape == (3,) and not items.requires_grad
    assert (items > 0).all()
    assert total.item() == pytest.approx(items.sum().item(), rel=1e-6)
    model.zero_grad()
    total.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_loss_independent_of_target_order(setup):
    model, loss, x, targets = setup
    model.eval()  # fixed BN statistics so both calls see identical maps
    with torch.no_grad():
        maps = model(x)[1]
    model.train()
    _, a = loss(maps, targets, 2)
    _, b = loss(maps, targets.flip(0), 2)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_loss_without_targets_keeps_graph(setup):
    model, loss, x, _ = setup
    maps = model(x)
    total, items = loss(maps, torch.zeros(0, 6), 2)
    assert torch.isfinite(total) and items[0] == 0 and items[1] == 0 and items[2] > 0
    model.zero_grad()
    total.backward()
    cls_last = model.head.cls[0][-1].weight.grad
    box_last = model.head.box[0][-1].weight.grad
    assert cls_last is not None and cls_last.abs().sum() > 0
    assert box_last is not None and box_last.abs().sum() == 0  # attached, zero gradient


def test_normalizer_hook_and_errors(setup):
    model, loss, x, targets = setup
    model.eval()
    with torch.no_grad():
        maps = model(x)[1]
    model.train()
    calls = []

    def const(value):
        def hook(s):
            calls.append(float(s))
            return torch.full_like(s, value)

        return hook

    loss.normalizer_reduce = const(4.0)
    _, a = loss(maps, targets, 2)
    loss.normalizer_reduce = const(8.0)
    _, b = loss(maps, targets, 2)
    loss.normalizer_reduce = None
    assert len(calls) == 2 and calls[0] > 0
    torch.testing.assert_close(a, 2 * b)
    with pytest.raises(ValueError, match="batch_size"):
        loss(maps, targets, 3)
    with pytest.raises(ValueError, match="maps"):
        loss(maps[:2], targets, 2)
    with pytest.raises(ValueError, match="channels"):
        loss([m[:, :10] for m in maps], targets, 2)


def test_overfit_one_image_two_boxes():
    torch.manual_seed(0)
    model = yolo9.build_model("t", 2).train()
    loss = yolo9.build_loss(model)
    img = torch.full((1, 3, 128, 128), 0.2)
    img[:, :, 20:60, 30:90] = torch.tensor([0.9, 0.1, 0.1])[:, None, None]
    img[:, :, 70:120, 10:50] = torch.tensor([0.1, 0.8, 0.3])[:, None, None]
    targets = torch.tensor([[0, 0, 30, 20, 90, 60], [0, 1, 10, 70, 50, 120]], dtype=torch.float32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
    history = []
    for _ in range(30):
        total, _ = loss(model(img), targets, 1)
        opt.zero_grad()
        total.backward()
        opt.step()
        history.append(total.item())
    assert all(torch.isfinite(torch.tensor(history)))
    assert min(history[-5:]) < 0.4 * history[0]
