"""The detectors measurably learn: yolo9-t and yolox-t overfit 8 COCO images at imgsz 160
on CPU.

The 8 images are the first of coco128, bundled in ``tests/assets/coco8`` (264 KB, resized
to 320 px on the long side) so that these checks run in every clone.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from libreyolo_core import LibreYOLO

COCO8 = Path(__file__).resolve().parents[1] / "assets" / "coco8"
#: batch 2 gives four optimizer steps per epoch: on a fixed compute budget that learns much
#: faster than one batch of 8 (yolo9-t, imgsz 160: mAP50 0.68 after 100 epochs at batch 2, 0.36 after 80,
#: 0.0 after 75 and 0.51 after 150 at batch 8).
OVERFIT = dict(imgsz=160, batch=2, workers=0, mosaic=0.0, mixup=0.0, hsv_prob=0.0, fliplr=0.0,
               scale=0.0, translate=0.0, no_aug_epochs=0, warmup_epochs=3, seed=0)
#: pytest-timeout's limit for these two runs (the suite's is 900 s): a guard against a hang,
#: not a time budget: at load average 6-13 one of these runs (400 and 600 optimizer steps)
#: hit 900 s (#28.12). Fewer steps would need new seed sweeps on AVX-512 and AVX2 (see the
#: measurements below) to keep the same thresholds.
LOADED_MACHINE_TIMEOUT_S = 2700


@pytest.fixture
def coco8(tmp_path) -> Path:
    """A writable copy of the bundled 8 images (the scan writes a label cache beside them),
    trained and validated on themselves."""
    dst = tmp_path / "coco8"
    shutil.copytree(COCO8, dst)
    return dst / "coco8.yaml"


@pytest.mark.slow
@pytest.mark.timeout(LOADED_MACHINE_TIMEOUT_S)
def test_yolo9t_overfits_eight_coco_images(coco8, tmp_path):
    # Measured over seeds 0-2: mAP50 0.62-0.72 with AVX-512 kernels, 0.48-0.62 with AVX2
    # ones (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 reproduces an AVX2 machine's
    # numbers): a tiny run from scratch is chaotic, and the summation order alone moves it
    # as much as the seed. An untrained model scores 0.
    result = LibreYOLO("yolo9-t").train(data=coco8, epochs=100, eval_interval=100,
                                        project=tmp_path, **OVERFIT)
    assert result["mAP50"] >= 0.4, result


@pytest.mark.slow
@pytest.mark.timeout(LOADED_MACHINE_TIMEOUT_S)
def test_yoloxt_overfits_eight_coco_images(coco8, tmp_path):
    # YOLOX from scratch learns far more slowly on this budget than YOLOv9 (SimOTA has few
    # good candidates while the objectness head is untrained; its recipe steps on the
    # num_fg-normalised loss without clipping). Measured with these settings: mAP50 0.05 at
    # epoch 75, 0.12 at 125, 0.11 at 150 (lr0 0.05 and 0.1 diverge). So this asserts a
    # clear start of learning, not a fitted model: boxes found and every loss term falling.
    result = LibreYOLO("yolox-t").train(data=coco8, epochs=150, eval_interval=150,
                                        project=tmp_path, lr0=0.02, degrees=0.0, shear=0.0,
                                        **OVERFIT)
    assert result["mAP50"] >= 0.05, result
    rows = list(csv.DictReader((Path(result["save_dir"]) / "results.csv").read_text().splitlines()))
    for term in ("iou", "obj", "cls"):
        first, last = float(rows[0][f"train/{term}_loss"]), float(rows[-1][f"train/{term}_loss"])
        assert last < 0.7 * first, (term, first, last)
