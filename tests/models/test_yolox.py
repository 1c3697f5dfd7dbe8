"""YOLOX family: parameter counts, shapes, decode, SimOTA on hand-made cases, loss, L1 switch."""

from __future__ import annotations

import math

import pytest
import torch

from libreyolo_core.models import get_family
from libreyolo_core.models.registry import parse_model_name
from libreyolo_core.models.yolox.loss import SimOTAAssigner, YOLOXLoss, box_iou_cxcywh

yolox = get_family("yolox")

# measured on the reference implementation (Megvii YOLOX) at 80 classes
PARAMS = {"n": 912_159, "t": 5_055_855, "s": 8_968_255}


@pytest.mark.parametrize("size", ["n", "t", "s"])
def test_param_counts_match_the_reference(size):
    model = yolox.build_model(size, 80)
    n = sum(p.numel() for p in model.parameters())
    assert n == PARAMS[size]


def test_registry_and_family_protocol():
    spec, size = parse_model_name("yolox-t")
    assert (spec.title, size) == ("YOLOX", "t")
    assert spec is yolox
    d = spec.defaults("n")
    assert d["imgsz"] == 416 and spec.defaults("s")["imgsz"] == 640
    assert d["momentum"] == 0.9 and d["scheduler"] == "yoloxwarmcos"
    assert d["no_aug_epochs"] == 15 and d["warmup_epochs"] == 5 and d["sync_bn"] and d["amp"]
    with pytest.raises(ValueError, match="unknown YOLOX size"):
        yolox.build_model("x", 80)


def test_shapes_train_and_eval():
    model = yolox.build_model("n", 3)
    x = yolox.preprocess(torch.randint(0, 256, (2, 3, 96, 128), dtype=torch.uint8))
    maps = model.train()(x)
    assert [tuple(m.shape) for m in maps] == [(2, 8, 12, 16), (2, 8, 6, 8), (2, 8, 3, 4)]
    with torch.no_grad():
        decoded, maps = model.eval()(x)
    assert decoded.shape == (2, 8, 12 * 16 + 6 * 8 + 3 * 4)
    assert ((decoded[:, 4:] >= 0) & (decoded[:, 4:] <= 1)).all()


def test_bias_prior_and_initial_scores():
    model = yolox.build_model("n", 5)
    for m in (*model.head.cls_preds, *model.head.obj_preds):
        assert torch.allclose(m.bias, torch.full_like(m.bias, -math.log(99)))


def test_decode_grid_at_cell_corners():
    model = yolox.build_model("n", 1)
    maps = [torch.zeros(1, 6, 4, 4), torch.zeros(1, 6, 2, 2), torch.zeros(1, 6, 1, 1)]
    maps[0][0, 0, 1, 2] = 0.5  # dx at row 1, col 2 of stride 8
    maps[0][0, 2, 1, 2] = math.log(2.0)  # w = 2 strides
    dec = model.decode(maps)
    assert dec.shape == (1, 6, 21)
    a = 1 * 4 + 2
    # cx = (0.5 + 2) * 8 = 20, cy = (0 + 1) * 8 = 8, w = 16, h = 8
    assert dec[0, :4, a].tolist() == pytest.approx([12.0, 4.0, 28.0, 12.0])
    # corner grid: the first cell of stride 32 is centred on (0, 0) with zero raw outputs
    assert dec[0, :4, 20].tolist() == pytest.approx([-16.0, -16.0, 16.0, 16.0])


def test_preprocess_is_bgr_0_255():
    img = torch.zeros(1, 3, 2, 2, dtype=torch.uint8)
    img[:, 0] = 200  # red
    out = yolox.preprocess(img)
    assert out.dtype == torch.float32
    assert out[0, 2].max() == 200 and out[0, 0].max() == 0
    with pytest.raises(ValueError):
        yolox.preprocess(torch.zeros(3, 2, 2, dtype=torch.uint8))


def test_postprocess_obj_times_best_class():
    decoded = torch.zeros(1, 5 + 3, 3)
    decoded[0, :4, 0] = torch.tensor([0, 0, 10, 10])
    decoded[0, :4, 1] = torch.tensor([50, 50, 60, 60])
    decoded[0, :4, 2] = torch.tensor([0, 0, 10, 10])
    decoded[0, 4] = torch.tensor([0.9, 0.5, 0.1])
    decoded[0, 5:, 0] = torch.tensor([0.2, 0.8, 0.7])  # best class 1 only (no multi-label)
    decoded[0, 5:, 1] = torch.tensor([0.6, 0.1, 0.1])
    decoded[0, 5:, 2] = torch.tensor([0.1, 0.9, 0.1])  # 0.09: suppressed by conf
    (out,) = yolox.postprocess((decoded, None), conf=0.25, iou=0.5)
    assert out[:, 5].tolist() == [1.0, 0.0]
    assert out[:, 4].tolist() == pytest.approx([0.72, 0.3])


# -- SimOTA --------------------------------------------------------------------------------

def _assign(pred_cxcywh, centres, gts, gt_cls=None, cls_logit=None, **kw):
    """Run the assigner on one image with stride 8 anchors; logits default to equal."""
    a = centres.shape[0]
    m = gts.shape[0]
    cls_logits = torch.zeros(1, a, 2) if cls_logit is None else cls_logit[None]
    fg, gt_idx, miou = SimOTAAssigner(**kw)(
        cls_logits,
        torch.zeros(1, a),
        pred_cxcywh[None],
        centres,
        torch.full((a,), 8.0),
        gts[None],
        (torch.zeros(m, dtype=torch.long) if gt_cls is None else gt_cls)[None],
        torch.ones(1, m, dtype=torch.bool),
    )
    return fg[0], gt_idx[0], miou[0]


def test_simota_dynamic_k_from_top_ious():
    # three anchors inside the box and its centre region, one far away
    centres = torch.tensor([[20.0, 20.0], [24.0, 20.0], [16.0, 20.0], [200.0, 200.0]])
    gt = torch.tensor([[20.0, 20.0, 16.0, 16.0]])
    exact = gt[0]
    # IoUs 1.0, 1.0, 0.5 -> dynamic_k = int(2.5) = 2: the two exact boxes are taken
    preds = torch.stack([exact, exact, torch.tensor([20.0, 20.0, 16.0, 8.0]), exact])
    fg, gt_idx, miou = _assign(preds, centres, gt)
    assert fg.tolist() == [True, True, False, False]  # anchor 3 is no candidate
    assert miou[:2].tolist() == pytest.approx([1.0, 1.0])
    # one exact box and two at IoU 0.25 -> dynamic_k = int(1.5) = 1
    quarter = torch.tensor([20.0, 20.0, 8.0, 8.0])
    fg, _, _ = _assign(torch.stack([quarter, exact, quarter, exact]), centres, gt)
    assert fg.tolist() == [False, True, False, False]


def test_simota_dynamic_k_is_at_least_one():
    centres = torch.tensor([[20.0, 20.0], [28.0, 20.0]])
    gt = torch.tensor([[20.0, 20.0, 16.0, 16.0]])
    far = torch.tensor([[300.0, 300.0, 4.0, 4.0], [300.0, 300.0, 4.0, 4.0]])  # IoU 0
    fg, _, miou = _assign(far, centres, gt)
    assert fg.sum() == 1 and miou.sum() == 0


def test_simota_centre_radius_is_1_5_strides():
    gt = torch.tensor([[100.0, 100.0, 2.0, 2.0]])
    centres = torch.tensor([[111.0, 100.0], [113.0, 100.0]])  # 11 px and 13 px away (r = 12)
    preds = gt.expand(2, 4)
    fg, _, _ = _assign(preds, centres, gt, topk=10)
    assert fg.tolist() == [True, False]


def test_simota_class_cost_and_conflicts():
    centres = torch.tensor([[20.0, 20.0], [24.0, 20.0]])
    gts = torch.tensor([[20.0, 20.0, 16.0, 16.0], [22.0, 20.0, 16.0, 16.0]])
    preds = torch.tensor([[21.0, 20.0, 16.0, 16.0], [21.0, 20.0, 16.0, 16.0]])
    logits = torch.tensor([[4.0, -4.0], [-4.0, 4.0]])  # anchor 0 says class 0, anchor 1 class 1
    fg, gt_idx, _ = _assign(preds, centres, gts, torch.tensor([0, 1]), logits)
    assert fg.tolist() == [True, True] and gt_idx.tolist() == [0, 1]
    # swap the classes: the matching follows the class cost
    fg, gt_idx, _ = _assign(preds, centres, gts, torch.tensor([1, 0]), logits)
    assert gt_idx.tolist() == [1, 0]
    # both GTs want anchor 0 only (anchor 1 is off-geometry for both): it keeps the cheaper one
    centres = torch.tensor([[20.0, 20.0], [90.0, 90.0]])
    fg, gt_idx, _ = _assign(preds, centres, gts, torch.tensor([0, 1]), logits)
    assert fg.tolist() == [True, False] and gt_idx[0] == 0


def test_simota_class_cost_equals_explicit_bce():
    torch.manual_seed(0)
    c = 4
    cls = torch.randn(1, 6, c)
    obj = torch.randn(1, 6)
    p = (cls.sigmoid() * obj.sigmoid()[..., None]).sqrt()
    onehot = torch.nn.functional.one_hot(torch.tensor([2]), c).float()
    explicit = torch.nn.functional.binary_cross_entropy(
        p[0], onehot.expand(6, c), reduction="none"
    ).sum(-1)
    # the assigner's decomposed form
    log_p, log_1mp = p.log().clamp(min=-100), torch.log1p(-p).clamp(min=-100)
    decomposed = -log_1mp.sum(-1)[0] + log_1mp[0, :, 2] - log_p[0, :, 2]
    assert torch.allclose(explicit, decomposed, atol=1e-5)


def test_simota_batched_equals_per_image_and_ignores_padding():
    torch.manual_seed(1)
    model = yolox.build_model("n", 3)
    loss = YOLOXLoss(model)
    maps = [torch.randn(2, 8, 8, 8), torch.randn(2, 8, 4, 4), torch.randn(2, 8, 2, 2)]
    targets = torch.tensor(
        [[0, 1, 10, 10, 40, 50], [0, 2, 30, 5, 60, 30], [0, 0, 5, 5, 20, 20], [1, 1, 8, 8, 56, 56]]
    )
    loss(maps, targets, 2)
    fg_both = loss.last_num_fg.item()
    loss([m[:1] for m in maps], targets[:3], 1)
    fg0 = loss.last_num_fg.item()
    only1 = targets[3:].clone()
    only1[:, 0] = 0
    loss([m[1:] for m in maps], only1, 1)
    assert fg_both == fg0 + loss.last_num_fg.item() > 0


def test_box_iou_cxcywh():
    a = torch.tensor([10.0, 10.0, 4.0, 4.0])
    assert box_iou_cxcywh(a, a).item() == pytest.approx(1.0)
    assert box_iou_cxcywh(a, torch.tensor([12.0, 10.0, 4.0, 4.0])).item() == pytest.approx(1 / 3)
    assert box_iou_cxcywh(a, torch.tensor([20.0, 10.0, 4.0, 4.0])).item() == 0.0


# -- loss ----------------------------------------------------------------------------------

def _maps_and_targets(b=2, nc=3, seed=0):
    torch.manual_seed(seed)
    model = yolox.build_model("n", nc).train()
    x = yolox.preprocess(torch.randint(0, 256, (b, 3, 64, 64), dtype=torch.uint8))
    targets = torch.tensor([[0, 1, 4, 6, 40, 50], [0, 2, 20, 20, 30, 28], [1, 0, 10, 10, 60, 60]])
    return model, model(x), targets.float()


def test_loss_finite_with_and_without_targets_and_backprops():
    model, maps, targets = _maps_and_targets()
    loss = yolox.build_loss(model)
    assert loss.item_names == ("iou", "obj", "cls", "l1")
    total, items = loss(maps, targets, 2)
    assert items.shape == (4,) and not items.requires_grad
    assert torch.isfinite(total) and torch.isfinite(items).all()
    assert items[0] > 0 and items[2] > 0 and items[3] == 0  # L1 off
    assert total.item() == pytest.approx(items.sum().item(), rel=1e-5)
    total.backward()
    assert all(p.grad is not None for p in model.head.reg_preds.parameters())
    model.zero_grad()
    empty_total, empty_items = loss(model(yolox.preprocess(
        torch.zeros(2, 3, 64, 64, dtype=torch.uint8))), targets[:0], 2)
    assert torch.isfinite(empty_total) and empty_items[[0, 2, 3]].eq(0).all()
    empty_total.backward()
    assert loss.last_num_fg == 0


def test_l1_switch():
    model, maps, targets = _maps_and_targets()
    loss = yolox.build_loss(model)
    _, off = loss(maps, targets, 2)
    assert yolox.on_mosaic_disable(model, loss) is True and loss.use_l1
    total, on = loss(maps, targets, 2)
    assert on[3] > 0 and torch.allclose(off[:3], on[:3])
    assert total.item() == pytest.approx(on.sum().item(), rel=1e-5)


def test_l1_target_is_zero_for_a_perfect_prediction():
    model = yolox.build_model("n", 1)
    loss = YOLOXLoss(model)
    loss.use_l1 = True
    maps = [torch.full((1, 6, 8, 8), -10.0), torch.full((1, 6, 4, 4), -10.0),
            torch.full((1, 6, 2, 2), -10.0)]
    for m in maps:
        m[:, :4] = 0.0
    # a box exactly equal to the decoded prediction of stride-8 cell (2, 3): centre (24, 16),
    # size 8 x 8; every candidate of a zero-raw map predicts its own cell, so the matched
    # anchor(s) with IoU 1 give zero IoU and L1 loss
    targets = torch.tensor([[0, 0, 20.0, 12.0, 28.0, 20.0]])
    maps[0][0, 4, 2, 3] = 10.0
    _, items = loss(maps, targets, 1)
    assert loss.last_num_fg == 1
    assert items[0].item() == pytest.approx(0.0, abs=1e-6)
    assert items[3].item() == pytest.approx(0.0, abs=1e-5)


def test_loss_rejects_bad_outputs():
    model, maps, targets = _maps_and_targets()
    loss = yolox.build_loss(model)
    with pytest.raises(ValueError, match="output maps"):
        loss(maps[:2], targets, 2)
    with pytest.raises(ValueError, match="batch_size"):
        loss(maps, targets, 3)


def test_normalizer_reduce_hook():
    model, maps, targets = _maps_and_targets()
    loss = yolox.build_loss(model)
    _, base = loss(maps, targets, 2)
    loss.normalizer_reduce = lambda n: n * 2
    _, halved = loss(maps, targets, 2)
    assert torch.allclose(halved, base / 2, rtol=1e-5)


def test_simota_takes_no_anchor_inside_a_large_box_but_far_from_its_centre():
    """Centre prior only (YOLOX 0.3, LibreYOLO 1.6): being inside the box is not enough."""
    gt = torch.tensor([[100.0, 100.0, 160.0, 160.0]])
    centres = torch.tensor([[100.0, 100.0], [150.0, 100.0]])  # the second: inside, 50 px off
    fg, _, _ = _assign(gt.expand(2, 4), centres, gt)
    assert fg.tolist() == [True, False]
