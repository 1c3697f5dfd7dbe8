"""The detector measurably learns: yolo9-t overfits 8 coco128 images at imgsz 320 on CPU."""

from __future__ import annotations

import pytest
import yaml

from libreyolo_core import LibreYOLO

OVERFIT = dict(imgsz=320, batch=8, workers=0, mosaic=0.0, mixup=0.0, hsv_prob=0.0, fliplr=0.0,
               scale=0.0, translate=0.0, no_aug_epochs=0, warmup_epochs=3, seed=0)


@pytest.mark.slow
def test_yolo9t_overfits_eight_coco128_images(coco128_dir, tmp_path):
    images = sorted((coco128_dir / "images" / "train2017").iterdir())[:8]
    listing = tmp_path / "eight.txt"
    listing.write_text("\n".join(str(p) for p in images) + "\n")
    names = yaml.safe_load((coco128_dir / "coco128.yaml").read_text())["names"]
    data = tmp_path / "eight.yaml"
    data.write_text(yaml.safe_dump({"path": str(tmp_path), "train": "eight.txt", "val": "eight.txt",
                                    "names": names}))
    result = LibreYOLO("yolo9-t").train(data=data, epochs=200, eval_interval=100, project=tmp_path,
                                        **OVERFIT)
    assert result["mAP50"] >= 0.5, result
