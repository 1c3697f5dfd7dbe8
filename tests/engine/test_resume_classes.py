"""Resume says what it does: a dataset with another class count fails before the scan,
naming both class lists and the fine-tune alternative (CLI exit 4)."""

from __future__ import annotations

import subprocess
import sys

import torch

from libreyolo_core.config import resolve_config
from libreyolo_core.engine.checkpoint import save_checkpoint
from libreyolo_core.models.registry import parse_model_name


def _dataset(root, names):
    from PIL import Image

    (root / "images" / "train").mkdir(parents=True)
    (root / "labels" / "train").mkdir(parents=True)
    Image.new("RGB", (64, 64), (90, 120, 150)).save(root / "images" / "train" / "a.png")
    (root / "labels" / "train" / "a.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    (root / "data.yaml").write_text(f"train: images/train\nnames: {names!r}\n")
    return root / "data.yaml"


def test_resume_with_another_class_count_fails_before_the_scan(tmp_path):
    three = _dataset(tmp_path / "three", ["cat", "dog", "fox"])
    four = _dataset(tmp_path / "four", ["cat", "dog", "fox", "owl"])
    family, size = parse_model_name("yolo9-t")
    model = family.build_model(size, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cfg = resolve_config({"model": "yolo9-t", "data": str(three), "epochs": 3})
    last = tmp_path / "runs" / "exp" / "weights" / "last.pt"
    save_checkpoint({"model": model.state_dict(), "model_family": "yolo9", "size": "t", "nc": 3,
                     "names": {0: "cat", 1: "dog", 2: "fox"}, "optimizer": opt.state_dict(), "epoch": 0,
                     "config": cfg.model_dump(mode="json")}, last)
    run = subprocess.run([sys.executable, "-m", "libreyolo_core.cli", "train", f"resume={last}", f"data={four}",
                          "device=cpu"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 4, run.stderr[-2000:]
    err = run.stderr
    assert "the checkpoint has nc=3 [cat, dog, fox], the dataset yaml has nc=4 [cat, dog, fox, owl]" in err
    assert f"start a new run with model={last}" in err and "resume continues a run" in err
    assert "Traceback" not in err and "state_dict" not in err
    assert not (tmp_path / "four" / "labels" / "train.labels.cache").exists()  # never scanned
    assert "images (" not in err  # no scan summary line


def test_the_batch_the_sampler_drops_is_logged(tmp_path, caplog):
    import logging

    from libreyolo_core.engine.trainer import Trainer

    data = _dataset(tmp_path / "ds", ["cat"])
    for i in range(4):  # 5 images, batch 2: one image a epoch is dropped
        (tmp_path / "ds" / "images" / "train" / f"b{i}.png").write_bytes(
            (tmp_path / "ds" / "images" / "train" / "a.png").read_bytes())
    cfg = resolve_config({"model": "yolo9-t", "data": str(data), "batch": 2, "workers": 0, "imgsz": 64,
                          "val": False, "device": "cpu", "project": str(tmp_path / "runs")})
    trainer = Trainer(cfg)
    with caplog.at_level(logging.INFO, logger="libreyolo_core"):
        trainer._setup()
    trainer.events.close()
    assert "the sampler drops the last 1 of 5 images of each epoch on each rank (a partial batch of 2)" in caplog.text


def test_a_batch_bigger_than_the_dataset_is_said(tmp_path, caplog):
    """#28.10: batch=128 on 64 images was accepted without a word."""
    import logging

    from libreyolo_core.engine.trainer import Trainer

    data = _dataset(tmp_path / "ds", ["cat"])
    for i in range(2):  # 3 images at batch 8
        (tmp_path / "ds" / "images" / "train" / f"b{i}.png").write_bytes(
            (tmp_path / "ds" / "images" / "train" / "a.png").read_bytes())
    cfg = resolve_config({"model": "yolo9-t", "data": str(data), "batch": 8, "workers": 0, "imgsz": 64,
                          "val": False, "device": "cpu", "project": str(tmp_path / "runs")})
    trainer = Trainer(cfg)
    with caplog.at_level(logging.INFO, logger="libreyolo_core"):
        trainer._setup()
    trainer.events.close()
    assert ("batch=8 is more than the 3 training images: every epoch is one partial batch of 3 "
            "(one optimizer step)") in caplog.text and "use batch=3 or less" in caplog.text
