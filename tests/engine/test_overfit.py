"""The detectors measurably learn: yolo9-t and yolox-t overfit 8 coco128 images at imgsz 320
on CPU."""

from __future__ import annotations

import pytest
import yaml

from libreyolo_core import LibreYOLO

OVERFIT = dict(imgsz=320, batch=8, workers=0, mosaic=0.0, mixup=0.0, hsv_prob=0.0, fliplr=0.0,
               scale=0.0, translate=0.0, no_aug_epochs=0, warmup_epochs=3, seed=0)


@pytest.mark.slow
def test_yolo9t_overfits_eight_coco128_images(coco128_dir, tmp_path):
    result = LibreYOLO("yolo9-t").train(data=_eight(coco128_dir, tmp_path), epochs=200, eval_interval=100,
                                        project=tmp_path, **OVERFIT)
    assert result["mAP50"] >= 0.5, result


@pytest.mark.slow
def test_yoloxt_overfits_eight_coco128_images(coco128_dir, tmp_path):
    # YOLOX steps on the num_fg-normalised loss without clipping (its family defaults);
    # lr0 0.02 instead of 0.01 because 200 one-image-batch steps are few for that recipe
    # (measured: mAP50 0.34 at lr0 0.01, 0.87 at epoch 175 with 0.02).
    result = LibreYOLO("yolox-t").train(data=_eight(coco128_dir, tmp_path), epochs=200, eval_interval=100,
                                        project=tmp_path, lr0=0.02, degrees=0.0, shear=0.0, **OVERFIT)
    assert result["mAP50"] >= 0.5, result


def _eight(coco128_dir, tmp_path):
    """A dataset of the first 8 coco128 training images, validated on themselves."""
    images = sorted((coco128_dir / "images" / "train2017").iterdir())[:8]
    listing = tmp_path / "eight.txt"
    listing.write_text("\n".join(str(p) for p in images) + "\n")
    names = yaml.safe_load((coco128_dir / "coco128.yaml").read_text())["names"]
    data = tmp_path / "eight.yaml"
    data.write_text(yaml.safe_dump({"path": str(tmp_path), "train": "eight.txt", "val": "eight.txt",
                                    "names": names}))
    return data
