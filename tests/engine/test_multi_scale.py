"""``multi_scale=True``: random training sizes in [0.5, 1.5] x imgsz (Ultralytics' rule),
boxes scaled with the images, the sizes a function of (seed, epoch, step)."""

from __future__ import annotations

import csv

import torch

from libreyolo_core import LibreYOLO
from libreyolo_core.engine import trainer as trainer_module
from libreyolo_core.engine.multi_scale import multi_scale_size, rescale_batch


def test_sizes_follow_the_rule_and_repeat():
    sizes = [multi_scale_size(640, 32, 0, epoch, step) for epoch in range(3) for step in range(200)]
    assert all(s % 32 == 0 and 320 <= s <= 960 for s in sizes)
    assert min(sizes) == 320 and max(sizes) == 960 and len(set(sizes)) == 21  # every multiple
    assert sizes == [multi_scale_size(640, 32, 0, e, k) for e in range(3) for k in range(200)]
    assert sizes != [multi_scale_size(640, 32, 1, e, k) for e in range(3) for k in range(200)]
    # never below one stride; 1.5 x 32 = 48 is rounded up to the stride
    assert {multi_scale_size(32, 32, 0, 0, k) for k in range(50)} == {32, 64}


def test_rescale_batch_scales_boxes_with_pixels():
    img = torch.zeros(2, 3, 64, 64)
    img[1, :, 16:32, 8:40] = 1.0  # a bright box x 8..40, y 16..32 in image 1
    targets = torch.tensor([[1.0, 3.0, 8.0, 16.0, 40.0, 32.0]])
    out, t = rescale_batch(img.contiguous(memory_format=torch.channels_last), targets, 96)
    assert out.shape == (2, 3, 96, 96) and out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(t, torch.tensor([[1.0, 3.0, 12.0, 24.0, 60.0, 48.0]]))
    assert targets[0, 2] == 8.0  # the input is not changed
    ys, xs = torch.nonzero(out[1, 0] > 0.5, as_tuple=True)
    assert (xs.min(), xs.max() + 1, ys.min(), ys.max() + 1) == (12, 60, 24, 48)
    same, same_t = rescale_batch(img, targets, 64)
    assert same is img and same_t is targets


def test_a_multi_scale_run_trains_at_the_drawn_sizes(sample_yaml, tmp_path, monkeypatch):
    seen = []
    real = trainer_module.rescale_batch

    def spy(images, targets, size):
        out = real(images, targets, size)
        seen.append((images.shape[-1], out[0].shape[-1]))
        return out

    monkeypatch.setattr(trainer_module, "rescale_batch", spy)
    LibreYOLO("yolo9-t").train(data=sample_yaml, epochs=2, imgsz=64, batch=4, workers=0, device="cpu",
                               seed=3, multi_scale=True, plots=False, project=tmp_path, name="ms")
    expected = [multi_scale_size(64, 32, 3, e, k) for e in range(2) for k in range(4)]
    assert seen == [(64, s) for s in expected] and len(set(expected)) > 1
    rows = list(csv.DictReader((tmp_path / "ms" / "results.csv").read_text().splitlines()))
    assert len(rows) == 2 and all(float(r["train/box_loss"]) > 0 for r in rows)
