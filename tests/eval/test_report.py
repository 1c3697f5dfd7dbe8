"""The validation report: a real 1-epoch training run and ``libreyolo val`` write it;
its numbers agree with pycocotools re-scoring its own ``predictions.json``; the
confusion matrix and the table on constructed cases."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from libreyolo_core import LibreYOLO
from libreyolo_core.engine.events import read_events
from libreyolo_core.eval.coco import ImageDetections, ImageTargets, coco_metrics
from libreyolo_core.eval.report import CONFUSION_CONF, confusion_matrix, format_table, write_report
from libreyolo_core.eval.validate import ValPredictions

FAST = dict(imgsz=128, batch=8, workers=0, warmup_epochs=1, no_aug_epochs=1, seed=3, lr0=0.01)
PLOTS = {"PR_curve.png", "F1_curve.png", "P_curve.png", "R_curve.png", "confusion_matrix.png",
         "confusion_matrix_normalized.png", "labels.png"}


def _rescore(val: Path) -> tuple[float, float]:
    """pycocotools on the report's own COCO files."""
    pytest.importorskip("pycocotools")
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(val / "ground_truth.json"))
        res = json.loads((val / "predictions.json").read_text())
        if not res:
            return 0.0, 0.0
        ev = COCOeval(gt, gt.loadRes(res), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return max(float(ev.stats[0]), 0.0), max(float(ev.stats[1]), 0.0)


def _check_report(val: Path, nc: int, n_images: int) -> dict:
    report = json.loads((val / "report.json").read_text())
    assert {p.name for p in val.iterdir()} >= PLOTS
    for name in PLOTS:
        with Image.open(val / name) as im:
            assert im.width >= 400 and im.height >= 300
    assert report["table"][0]["class"] == "all" and len(report["table"]) == nc + 1
    assert report["table"][0]["images"] == n_images
    pr = report["pr_curve"]
    assert len(pr["recall"]) == 101 and all(len(v) == 101 for v in pr["precision"].values())
    assert pr["mAP50"] == report["metrics"]["mAP50"]
    cm = report["confusion_matrix"]
    assert len(cm["counts"]) == nc + 1 and cm["labels"][-1] == "background"
    assert cm["conf"] == CONFUSION_CONF and cm["iou"] == 0.45
    assert len(report["confidence_curves"]["conf"]) == 101
    # the report's mAP is what pycocotools gives on its own predictions.json
    m5095, m50 = _rescore(val)
    assert report["metrics"]["mAP50-95"] == pytest.approx(m5095, abs=1e-4)
    assert report["metrics"]["mAP50"] == pytest.approx(m50, abs=1e-4)
    return report


def test_training_writes_the_report(sample_yaml, tmp_path, capsys):
    result = LibreYOLO("yolo9-t").train(data=sample_yaml, epochs=1, project=tmp_path, plot_images=3, **FAST)
    run = Path(result["save_dir"])
    report = _check_report(run / "val", 4, 8)
    assert report["epoch"] == 1 and report["plot_images"] == 3
    assert len(report["images"]) == 3
    for img in report["images"]:
        with Image.open(run / "val" / img["file"]) as im:  # ground truth | predictions side by side
            assert im.width > im.height
        assert {"tp", "fp", "fn", "classes", "fp_classes", "fn_classes"} <= set(img)
    out = capsys.readouterr().out
    assert "mAP50-95" in out and "circle" in out and "report:" in out
    arts = {e.path: e.kind for e in read_events(run / "events.jsonl") if e.event == "artifact"}
    assert arts["val/report.json"] == "report" and arts["val/PR_curve.png"] == "plot"
    assert arts["val/predictions.json"] == "predictions"
    assert sum(k == "detections" for k in arts.values()) == 3
    kinds = [e.event for e in read_events(run / "events.jsonl")]
    assert kinds[-1] == "run_end"  # the report's artifacts come before the end


def test_val_command_writes_the_report(sample_yaml, tmp_path, capsys):
    from libreyolo_core.cli import run

    model = LibreYOLO("yolo9-t", nc=4, names={0: "circle", 1: "square", 2: "triangle", 3: "star"})
    model.train(data=sample_yaml, epochs=1, project=tmp_path / "t", val=False, **FAST)
    ckpt = Path(model.checkpoint)
    assert run(["val", f"model={ckpt}", f"data={sample_yaml}", "imgsz=128", "workers=0", "plot_images=2",
                f"project={tmp_path / 'v'}"]) == 0
    out = capsys.readouterr().out
    assert "Instances" in out and "report:" in out
    report = _check_report(tmp_path / "v" / "exp", 4, 8)
    assert len(report["images"]) == 2 and report["epoch"] is None
    # plots=false: the JSON files only
    assert run(["val", f"model={ckpt}", f"data={sample_yaml}", "imgsz=128", "workers=0", "plots=false",
                f"project={tmp_path / 'v'}", "json=true"]) == 0
    second = tmp_path / "v" / "exp2"
    assert {p.name for p in second.iterdir()} == {"report.json", "predictions.json", "ground_truth.json"}
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(line)["save_dir"] == str(second)


def test_confusion_matrix_rows_are_truth_with_background():
    tgts = [ImageTargets(np.array([[0, 0, 10, 10], [20, 20, 30, 30], [50, 50, 60, 60]]), np.array([0, 1, 1]), 100, 100)]
    dets = [ImageDetections(np.array([[0, 0, 10, 10], [20, 20, 30, 31], [80, 80, 90, 90], [50, 50, 60, 60]]),
                            np.array([0.9, 0.8, 0.7, 0.1]), np.array([0, 0, 1, 1]))]
    cm = confusion_matrix(dets, tgts, nc=2)
    # true 0 -> pred 0; true 1 -> pred 0 (wrong class); true 1 missed (score 0.1 < 0.25);
    # a class-1 detection on background
    assert cm.tolist() == [[1, 0, 0], [1, 0, 1], [0, 1, 0]]


def test_table_marks_classes_without_instances(tmp_path):
    img = tmp_path / "a.png"
    Image.fromarray(np.full((40, 60, 3), 128, np.uint8)).save(img)
    tgts = [ImageTargets(np.array([[5, 5, 20, 20]]), np.array([0]), 60, 40)]
    dets = [ImageDetections(np.array([[5, 5, 20, 21], [30, 10, 50, 30]]), np.array([0.9, 0.6]), np.array([0, 2]))]
    kept = ValPredictions(dets, tgts, [str(img)], coco_metrics(dets, tgts, 3, detail=True))
    report = write_report(tmp_path / "val", kept, {0: "cat", 1: "dog", 2: "cow"}, plot_images=1,
                          train_labels=[np.array([[0, 0.5, 0.5, 0.2, 0.2]])])
    rows = {r["class"]: r for r in report["table"]}
    assert rows["dog"]["no_instances"] and rows["dog"]["mAP50"] is None
    assert rows["cow"]["no_instances"] and not rows["cat"]["no_instances"]
    assert rows["cat"]["mAP50"] == pytest.approx(1.0)
    text = format_table(report)
    assert "dog" in text and "(no instances in this split)" in text
    assert report["images"][0]["fp_classes"] == ["cow"] and report["images"][0]["tp"] == 1
    assert set(report["pr_curve"]["precision"]) == {"cat"}


def test_sdk_reads_the_engine_report_typed(tmp_path):
    """The SDK's :class:`ValReport` parses what :func:`write_report` writes (the contract
    between the engine and ``job.report()``)."""
    from libreyolo_client import ValReport

    tgts = [ImageTargets(np.array([[5, 5, 20, 20], [30, 5, 50, 25]]), np.array([0, 1]), 60, 40)]
    dets = [ImageDetections(np.array([[5, 5, 20, 21]]), np.array([0.9]), np.array([0]))]
    kept = ValPredictions(dets, tgts, [str(tmp_path / "none.png")], coco_metrics(dets, tgts, 3, detail=True))
    written = write_report(tmp_path / "val", kept, {0: "cat", 1: "dog", 2: "cow"}, plots=False)
    typed = ValReport.model_validate(json.loads((tmp_path / "val" / "report.json").read_text()))
    assert [r.name for r in typed.table] == ["all", "cat", "dog", "cow"]
    assert typed.row("cat").mAP50 == pytest.approx(1.0) and typed.row("dog").recall == 0.0
    assert typed.row("cow").no_instances and typed.row("cow").mAP50_95 is None
    assert typed.row("all").mAP50_95 == written["metrics"]["mAP50-95"]
    with pytest.raises(KeyError, match="no class 'horse'"):
        typed.row("horse")


def test_a_class_never_predicted_has_precision_zero_not_one():
    """The P curve is drawn at 1.0 where no detection is left (Ultralytics' convention);
    the table and the metrics say 0.0 for a class that was never predicted."""
    tgts = [ImageTargets(np.array([[0, 0, 10, 10], [20, 20, 30, 30]]), np.array([0, 1]), 50, 50)]
    dets = [ImageDetections(np.array([[0, 0, 10, 10]]), np.array([0.9]), np.array([0]))]
    m = coco_metrics(dets, tgts, 2, detail=True)
    assert m["precision"] == pytest.approx(0.5) and m["recall"] == pytest.approx(0.5)
    assert m["detail"]["curves"]["precision"][1].tolist() == [1.0] * 101  # the drawing
    assert m["detail"]["curves"]["p_best"].tolist() == [1.0, 0.0]
