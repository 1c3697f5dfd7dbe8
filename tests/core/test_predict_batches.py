"""#28.7: ``predict`` sends its images through the network in batches, as val does (one
forward pass per image woke every layer's thread pool 16 times as often: on a loaded
machine, 7x slower with 2 threads), with the same boxes as one image at a time."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def test_batched_predict_matches_one_image_at_a_time(tmp_path, monkeypatch):
    from PIL import Image

    import libreyolo_core.facade as facade
    from libreyolo_core import LibreYOLO

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    folder = tmp_path / "imgs"
    folder.mkdir()
    shapes = [(40, 64), (64, 40), (50, 50), (30, 70), (64, 64)]
    for i, (h, w) in enumerate(shapes):
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    model = LibreYOLO("yolo9-t")
    single = []
    monkeypatch.setattr(facade, "PREDICT_BATCH", 1)
    single = model.predict(str(folder), conf=0.0, imgsz=64, device="cpu")
    monkeypatch.setattr(facade, "PREDICT_BATCH", 2)  # 2 + 2 + a last partial batch of 1
    batched = model.predict(str(folder), conf=0.0, imgsz=64, device="cpu")
    assert [p.path for p in batched] == [str(folder / f"{i}.png") for i in range(5)]
    assert [p.orig_shape for p in batched] == shapes
    for a, b in zip(single, batched, strict=True):
        assert len(a) == len(b) > 0
        np.testing.assert_allclose(a.boxes, b.boxes, atol=1e-2)
        np.testing.assert_allclose(a.scores, b.scores, atol=1e-4)
        assert (a.classes == b.classes).all()


def test_predict_of_one_array_still_works():
    from libreyolo_core import LibreYOLO

    (p,) = LibreYOLO("yolo9-t").predict(np.zeros((48, 80, 3), np.uint8), conf=0.0, imgsz=64,
                                        device="cpu")
    assert p.path is None and p.orig_shape == (48, 80)
    assert p.boxes.shape[1] == 4 and ((p.boxes >= 0).all() or pytest.fail(str(p.boxes)))
