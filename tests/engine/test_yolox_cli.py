"""YOLOX checkpoints go through the same CLI and facade as YOLOv9's: train, val, predict."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from libreyolo_core import LibreYOLO
from libreyolo_core.engine.checkpoint import load_checkpoint


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "libreyolo_core.cli", *args], capture_output=True,
                          text=True, timeout=600, cwd=cwd)


@pytest.mark.slow
def test_yolox_checkpoint_trains_validates_and_predicts_through_the_cli(sample_yaml, tmp_path):
    train = _cli("train", "model=yolox-n", f"data={sample_yaml}", "epochs=2", "imgsz=128", "batch=8",
                 "workers=0", f"project={tmp_path}", "name=x", "no_aug_epochs=1", cwd=tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    best = tmp_path / "x" / "weights" / "best.pt"
    ckpt = load_checkpoint(best)
    assert ckpt["model_family"] == "yolox" and ckpt["size"] == "n" and ckpt["imgsz"] == 128

    val = _cli("val", f"model={best}", f"data={sample_yaml}", "imgsz=128", "json=true", cwd=tmp_path)
    assert val.returncode == 0, val.stderr[-3000:]
    metrics = json.loads(val.stdout.strip().splitlines()[-1])
    assert {"precision", "recall", "mAP50", "mAP50-95"} <= metrics.keys()
    assert 0.0 <= metrics["mAP50-95"] <= metrics["mAP50"] <= 1.0
    # the standalone validation of the stored (EMA) weights repeats the trainer's last one,
    # up to the float16 rounding of the lean best.pt
    assert metrics["mAP50"] == pytest.approx(ckpt["best_metrics"]["mAP50"], abs=0.02)

    images = Path(sample_yaml).parent / "images" / "val"
    pred = _cli("predict", f"model={best}", f"source={images}", "conf=0.0", "json=true", cwd=tmp_path)
    assert pred.returncode == 0, pred.stderr[-3000:]
    rows = [json.loads(line) for line in pred.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == len(list(images.iterdir()))
    assert all(len(r["boxes"]) == len(r["scores"]) for r in rows) and any(r["boxes"] for r in rows)
    # a size that is no multiple of the stride is rounded up (a warning), not a crash
    odd = _cli("predict", f"model={best}", f"source={images}", "imgsz=100", "json=true", cwd=tmp_path)
    assert odd.returncode == 0 and "using imgsz=128" in odd.stderr, odd.stderr[-3000:]
    info = _cli("info", "model=yolox-s", "imgsz=100", cwd=tmp_path)
    assert info.returncode == 0 and "at 128x128" in info.stdout, info.stderr[-3000:]
    facade = LibreYOLO(best)
    assert facade.name == "yolox-n" and facade.nc == 4
    assert facade.predict(next(images.iterdir()), conf=0.0)[0].boxes.shape[1] == 4
