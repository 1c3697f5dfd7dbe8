"""YOLOv9 network: sizes, forward contract, fusion, anchors, FLOPs."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from libreyolo_core.models import get_family
from libreyolo_core.models.common import Conv, dist2bbox, make_anchors
from libreyolo_core.models.flops import model_info
from libreyolo_core.models.yolo9.nn import RepConvN

yolo9 = get_family("yolo9")


@pytest.fixture(autouse=True)
def _one_thread():
    """Single intra-op thread: these tensors are small, and on a shared CPU spinning
    OpenMP workers make the tests many times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.fixture(scope="module")
def model_t() -> nn.Module:
    torch.manual_seed(0)
    return yolo9.build_model("t", 80)


@pytest.mark.parametrize(
    ("size", "total", "parts", "fused"),
    [
        ("t", 2_036_544, (708_720, 729_696, 598_128), 2_001_824),
        ("s", 7_226_192, (2_820_576, 2_903_744, 1_501_872), 7_105_872),
    ],
)
def test_param_counts_match_reference(size, total, parts, fused):
    model = yolo9.build_model(size, 80)
    got = n_params(model)
    assert abs(got - total) / total < 0.02
    assert got == total
    assert (n_params(model.backbone), n_params(model.neck), n_params(model.head)) == parts
    assert n_params(model.eval().fuse()) == fused


def test_build_model_rejects_bad_args():
    with pytest.raises(ValueError, match="size"):
        yolo9.build_model("x", 80)
    with pytest.raises(ValueError, match="nc"):
        yolo9.build_model("t", 0)
    assert tuple(yolo9.sizes) == ("t", "s")


def test_train_mode_returns_raw_maps(model_t):
    model_t.train()
    maps = model_t(torch.rand(2, 3, 320, 320))
    assert isinstance(maps, list)
    assert [tuple(m.shape) for m in maps] == [(2, 144, 40, 40), (2, 144, 20, 20), (2, 144, 10, 10)]


def test_eval_mode_decodes_boxes_and_scores():
    torch.manual_seed(1)
    model = yolo9.build_model("t", 3).eval()
    with torch.no_grad():
        decoded, maps = model(torch.rand(1, 3, 640, 480))
    a = 80 * 60 + 40 * 30 + 20 * 15
    assert decoded.shape == (1, 4 + 3, a)
    assert [tuple(m.shape) for m in maps] == [(1, 67, 80, 60), (1, 67, 40, 30), (1, 67, 20, 15)]
    scores = decoded[:, 4:]
    assert scores.min() >= 0 and scores.max() <= 1
    # independent decode of the raw maps: softmax expectation per side, times stride
    x = torch.cat([m.flatten(2) for m in maps], 2)[0]  # (67, A)
    dist = (x[:64].view(4, 16, -1).softmax(1) * torch.arange(16.0)[:, None]).sum(1)
    points, stride = make_anchors([(80, 60), (40, 30), (20, 15)], (8, 16, 32))
    boxes = dist2bbox(dist.T * stride, points)
    torch.testing.assert_close(decoded[0, :4].T, boxes, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(scores[0], x[64:].sigmoid())
    assert (boxes[:, 2:] >= boxes[:, :2]).all()


def test_bias_priors():
    model = yolo9.build_model("t", 20)
    for box, cls, s in zip(model.head.box, model.head.cls, (8, 16, 32), strict=True):
        assert torch.all(box[-1].bias == 1.0)
        assert torch.allclose(cls[-1].bias, torch.full((20,), math.log(5 / 20 / (640 / s) ** 2)))


def test_head_widths_follow_nc():
    # class tower width = max(ch0, min(nc, 100)); box tower 64
    assert yolo9.build_model("t", 80).head.cls[0][0].conv.out_channels == 80
    assert yolo9.build_model("t", 1).head.cls[0][0].conv.out_channels == 64
    assert yolo9.build_model("s", 80).head.cls[0][0].conv.out_channels == 128
    assert yolo9.build_model("t", 80).head.box[0][0].conv.out_channels == 64


def _randomise_bn(model: nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(c, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(c, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(c, generator=g) * 0.1)


@pytest.mark.parametrize("size", ["t", "s"])
def test_fused_model_matches_unfused(size):
    torch.manual_seed(0)
    model = yolo9.build_model(size, 5)
    _randomise_bn(model)
    model.eval()
    x = torch.rand(2, 3, 128, 160)
    with torch.no_grad():
        ref_dec, ref_maps = model(x)
        model.fuse()
        dec, maps = model(x)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert all(m.conv2 is None for m in model.modules() if isinstance(m, RepConvN))
    assert all(m.fused for m in model.modules() if isinstance(m, Conv))
    for a, b in zip(maps, ref_maps, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dec[:, 4:], ref_dec[:, 4:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dec[:, :4], ref_dec[:, :4], rtol=1e-4, atol=1e-3)
    with torch.no_grad():  # idempotent
        torch.testing.assert_close(model.fuse()(x)[0], dec)


def test_anchor_cache_reused_per_shape(model_t):
    model_t.eval()
    head = model_t.head
    head._anchor_cache.clear()
    with torch.no_grad():
        model_t(torch.rand(1, 3, 64, 64))
        first = next(iter(head._anchor_cache.values()))
        model_t(torch.rand(1, 3, 64, 64))
        assert len(head._anchor_cache) == 1
        assert next(iter(head._anchor_cache.values()))[0] is first[0]
        model_t(torch.rand(1, 3, 96, 64))
    assert len(head._anchor_cache) == 2


def test_make_anchors_layout():
    points, stride = make_anchors([(2, 3), (1, 1)], (8, 16))
    assert points.shape == (7, 2) and stride.shape == (7, 1)
    # row-major: x varies fastest, cell centres
    assert points[:4].tolist() == [[4, 4], [12, 4], [20, 4], [4, 12]]
    assert points[-1].tolist() == [8, 8] and stride[:, 0].tolist() == [8] * 6 + [16]


def test_preprocess_scales_uint8():
    img = torch.tensor([0, 51, 255], dtype=torch.uint8).view(1, 3, 1, 1).expand(2, 3, 4, 4)
    out = yolo9.preprocess(img)
    assert out.dtype == torch.float32 and out.shape == (2, 3, 4, 4)
    assert out[0, :, 0, 0].tolist() == pytest.approx([0.0, 0.2, 1.0])
    with pytest.raises(ValueError):
        yolo9.preprocess(torch.zeros(3, 4, 4, dtype=torch.uint8))


def test_model_info_reports_fused_gflops(model_t):
    info = model_info(model_t, 640)
    assert info["params"] == 2_036_544 and info["params_fused"] == 2_001_824
    assert info["fused"] is True
    assert info["gflops"] == pytest.approx(7.71, rel=0.01)
    assert n_params(model_t) == 2_036_544  # the model itself was not fused


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_forward_is_sync_free_and_cuda_graph_capturable():
    model = yolo9.build_model("t", 80).cuda()
    x = torch.rand(2, 3, 128, 128, device="cuda")
    for train in (True, False):
        model.train(train)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.no_grad():
            for _ in range(2):
                model(x)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.set_sync_debug_mode("error")
        try:
            with torch.no_grad():
                model(x)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        g = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g):
            out = model(x)
        g.replay()
        torch.cuda.synchronize()
        got = out if train else [out[0], *out[1]]
        assert all(torch.isfinite(o).all() for o in got)
        if not train:
            with torch.no_grad():
                torch.testing.assert_close(out[0], model(x)[0], rtol=1e-3, atol=1e-2)
