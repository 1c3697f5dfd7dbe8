"""Detection post-processing: multi-label selection, caps, NMS and the letterbox inverse."""

from __future__ import annotations

import pytest
import torch

from libreyolo_core.models import get_family
from libreyolo_core.models import postprocess as pp

yolo9 = get_family("yolo9")


def make_decoded(rows: list[tuple[list[float], list[float]]]) -> torch.Tensor:
    """(1, 4 + nc, A) from per-anchor ``(box, class scores)``."""
    boxes = torch.tensor([r[0] for r in rows], dtype=torch.float32)
    scores = torch.tensor([r[1] for r in rows], dtype=torch.float32)
    return torch.cat((boxes, scores), 1).T[None]


def test_multi_label_keeps_every_class_above_conf():
    dec = make_decoded([([0, 0, 10, 10], [0.9, 0.6, 0.1]), ([50, 50, 60, 60], [0.2, 0.3, 0.25])])
    (out,) = pp.select_detections(dec, conf=0.25, iou=0.5, max_det=10)
    assert out.shape == (3, 6) and out.dtype == torch.float32
    assert out[:, 4].tolist() == pytest.approx([0.9, 0.6, 0.3])  # sorted by score
    assert out[:, 5].tolist() == [0, 1, 1]
    assert out[0, :4].tolist() == [0, 0, 10, 10]
    (single,) = pp.select_detections(dec, conf=0.25, iou=0.5, max_det=10, multi_label=False)
    assert single[:, 5].tolist() == [0, 1] and single[:, 4].tolist() == pytest.approx([0.9, 0.3])


def test_conf_is_strict_and_empty_output_shape():
    dec = make_decoded([([0, 0, 10, 10], [0.25, 0.1])])
    (out,) = pp.select_detections(dec, conf=0.25, iou=0.5, max_det=10)
    assert out.shape == (0, 6)


def test_nms_suppresses_same_class_duplicates_only():
    dec = make_decoded(
        [
            ([-20, -20, 10, 10], [0.9, 0.0]),
            ([-19, -19, 11, 11], [0.8, 0.0]),  # duplicate of the first: suppressed
            ([-19, -19, 11, 11], [0.0, 0.7]),  # same place, other class: kept
            ([100, 100, 130, 130], [0.6, 0.0]),  # elsewhere: kept
        ]
    )
    (out,) = pp.select_detections(dec, conf=0.1, iou=0.5, max_det=10)
    assert out[:, 4].tolist() == pytest.approx([0.9, 0.7, 0.6])
    assert out[:, 5].tolist() == [0, 1, 0]


def test_caps_and_non_finite_rows(monkeypatch):
    g = torch.Generator().manual_seed(0)
    n = 50
    xy = torch.arange(n, dtype=torch.float32)[:, None] * 20  # disjoint boxes
    boxes = torch.cat((xy, xy, xy + 10, xy + 10), 1)
    scores = torch.rand(n, 1, generator=g) * 0.5 + 0.5
    boxes[3] = float("nan")
    dec = torch.cat((boxes, scores), 1).T[None]
    (out,) = pp.select_detections(dec, conf=0.1, iou=0.5, max_det=300)
    assert out.shape[0] == n - 1 and torch.isfinite(out).all()
    (out,) = pp.select_detections(dec, conf=0.1, iou=0.5, max_det=7)
    assert out.shape[0] == 7
    top = scores[torch.arange(n) != 3, 0].sort(descending=True).values[:7]
    assert out[:, 4].tolist() == pytest.approx(top.tolist())
    # pre-NMS candidate cap: only the highest max(max_det, cap) scores enter NMS
    monkeypatch.setattr(pp, "MAX_NMS_CANDIDATES", 10)
    (out,) = pp.select_detections(dec, conf=0.1, iou=0.5, max_det=5)
    assert out.shape[0] == 5
    (out,) = pp.select_detections(dec, conf=0.1, iou=0.5, max_det=1)
    assert out.shape[0] == 1
    (out,) = pp.select_detections(dec, conf=0.1, iou=0.5, max_det=20)
    assert out.shape[0] <= 20


def test_batch_and_family_wrapper():
    a = make_decoded([([0, 0, 10, 10], [0.9])])
    b = make_decoded([([5, 5, 20, 20], [0.1])])
    dec = torch.cat((a, b))
    res = yolo9.postprocess((dec, []), conf=0.25, iou=0.45, max_det=300)
    assert len(res) == 2 and res[0].shape == (1, 6) and res[1].shape == (0, 6)
    with pytest.raises(ValueError):
        pp.select_detections(dec[:, :4], 0.25, 0.45, 300)
    with pytest.raises(ValueError):
        pp.select_detections(dec, 0.25, 0.45, 0)


def test_scale_boxes_inverts_letterbox():
    orig_h, orig_w = 480, 640
    ratio = 320 / 640  # 640x480 -> 320x240 placed at (0, 40) on a 320x320 canvas
    pad = (0.0, 40.0)
    boxes = torch.tensor([[10.0, 20.0, 300.0, 400.0], [600.0, 0.0, 640.0, 480.0]])
    canvas = boxes * ratio + torch.tensor([pad[0], pad[1], pad[0], pad[1]])
    back = pp.scale_boxes(canvas, ratio, pad, (orig_h, orig_w))
    torch.testing.assert_close(back, boxes)
    assert canvas[0, 1] == 50  # the input is not modified in place
    # boxes reaching into the padding are clipped to the image
    out = pp.scale_boxes(torch.tensor([[-5.0, 10.0, 330.0, 300.0]]), (0.5, 0.5), pad, (480, 640))
    assert out.tolist() == [[0.0, 0.0, 640.0, 480.0]]


def test_scale_detections_drops_zero_area():
    dets = torch.tensor([[10.0, 50.0, 20.0, 60.0, 0.9, 1.0], [0.0, 0.0, 5.0, 30.0, 0.8, 0.0]])
    out = pp.scale_detections(dets, 1.0, (0.0, 40.0), (100, 100))
    assert out.shape == (1, 6)
    assert out[0].tolist() == [10.0, 10.0, 20.0, 20.0, pytest.approx(0.9), 1.0]
