"""COCO metrics through faster-coco-eval: perfect, partial, empty and absent-class cases."""

import numpy as np
import pytest

from libreyolo_core.eval.coco import ImageDetections, ImageTargets, coco_metrics


def _targets():
    return [
        ImageTargets(np.array([[10, 10, 50, 60], [100, 100, 200, 180]]), np.array([0, 2]), 640, 480),
        ImageTargets(np.zeros((0, 4)), np.zeros(0), 640, 480),  # background image
        ImageTargets(np.array([[5, 5, 30, 30]]), np.array([1]), 320, 320),
    ]


def test_ground_truth_as_predictions_scores_one():
    tgts = _targets()
    dets = [ImageDetections(t.boxes, np.ones(len(t.classes)), t.classes) for t in tgts]
    m = coco_metrics(dets, tgts, nc=5)
    assert m["mAP50-95"] == pytest.approx(1.0)
    assert m["mAP50"] == pytest.approx(1.0)
    assert m["precision"] == pytest.approx(1.0) and m["recall"] == pytest.approx(1.0)
    # classes 3 and 4 are absent from every image: not in the per-class table
    assert set(m["per_class_AP"]) == {0, 1, 2}


def test_missed_class_and_false_positive_lower_the_score():
    tgts = _targets()
    dets = [ImageDetections(t.boxes, np.ones(len(t.classes)), t.classes) for t in tgts]
    # image 0: class 2 missed, a false positive of class 3 (absent from ground truth)
    dets[0] = ImageDetections(np.array([[10, 10, 50, 60], [300, 300, 400, 400]]),
                              np.array([0.9, 0.95]), np.array([0, 3]))
    m = coco_metrics(dets, tgts, nc=5)
    assert m["per_class_AP"][2] == 0.0
    assert m["per_class_AP"][0] == pytest.approx(1.0)
    assert m["mAP50-95"] == pytest.approx(2 / 3)
    assert m["recall"] < 1.0


def test_shifted_box_counts_at_50_not_at_95():
    tgts = [ImageTargets(np.array([[0, 0, 100, 100]]), np.array([0]), 200, 200)]
    dets = [ImageDetections(np.array([[10, 0, 110, 100]]), np.array([0.9]), np.array([0]))]
    m = coco_metrics(dets, tgts, nc=1)  # IoU = 90/110 = 0.818
    assert m["mAP50"] == pytest.approx(1.0)
    assert 0.3 < m["mAP50-95"] < 0.8


def test_no_predictions_and_no_ground_truth():
    tgts = _targets()
    empty = [ImageDetections(np.zeros((0, 4)), np.zeros(0), np.zeros(0)) for _ in tgts]
    m = coco_metrics(empty, tgts, nc=5)
    assert m["mAP50-95"] == 0.0 and m["per_class_AP"] == {0: 0.0, 1: 0.0, 2: 0.0}
    bg = [ImageTargets(np.zeros((0, 4)), np.zeros(0), 10, 10)]
    assert coco_metrics(empty[:1], bg, nc=5)["mAP50"] == 0.0


def test_bad_class_id_is_an_error():
    tgts = [ImageTargets(np.array([[0, 0, 10, 10]]), np.array([7]), 20, 20)]
    with pytest.raises(ValueError, match="class id outside"):
        coco_metrics([ImageDetections(np.zeros((0, 4)), [], [])], tgts, nc=5)
