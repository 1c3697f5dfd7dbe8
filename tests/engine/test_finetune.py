"""Fine-tuning from a weights file: transfer across class counts beats training from scratch,
and ``freeze=`` keeps weights and BatchNorm statistics bit-identical."""

from __future__ import annotations

import csv
import logging
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from libreyolo_core import LibreYOLO
from libreyolo_core.data.sample import generate_sample_dataset
from libreyolo_core.models import get_family

# no augmentation, one step per epoch, validation only at the end: the test measures what the
# weights bring, in as few CPU steps as it can
TINY = dict(imgsz=64, batch=4, workers=0, warmup_epochs=1, no_aug_epochs=0, seed=0, mosaic=0.0, mixup=0.0,
            hsv_prob=0.0, fliplr=0.0, scale=0.0, translate=0.0, degrees=0.0, shear=0.0, eval_interval=1000,
            save_period=0)


def _datasets(root: Path) -> tuple[Path, Path]:
    """16 synthetic 64-pixel images (4 classes), validated on themselves, and a relabelled copy
    with 3 classes (crosses become squares)."""
    root = root / "data"
    generate_sample_dataset(root / "pre", n_train=16, n_val=0, imgsz=64, seed=0)
    names = {0: "circle", 1: "square", 2: "triangle", 3: "cross"}
    (root / "pre" / "data.yaml").write_text(yaml.safe_dump(
        {"path": str(root / "pre"), "train": "images/train", "val": "images/train", "names": names}))
    shutil.copytree(root / "pre", root / "ft", ignore=shutil.ignore_patterns("*.cache"))
    for label in (root / "ft" / "labels").rglob("*.txt"):
        rows = [line.split() for line in label.read_text().splitlines() if line.strip()]
        label.write_text("".join(" ".join(["1" if r[0] == "3" else r[0], *r[1:]]) + "\n" for r in rows))
    (root / "ft" / "data.yaml").write_text(yaml.safe_dump(
        {"path": str(root / "ft"), "train": "images/train", "val": "images/train",
         "names": {0: "round", 1: "boxy", 2: "pointy"}}))
    return root / "pre" / "data.yaml", root / "ft" / "data.yaml"


@pytest.mark.slow
def test_finetune_across_class_counts_beats_scratch(tmp_path, caplog):
    pre_data, ft_data = _datasets(tmp_path)
    # Training this small from scratch is chaotic: the CPU's kernels (AVX-512 or AVX2, a
    # different summation order) and the last bit of a CIoU change the result as much as the
    # seed does. Measured over seeds 0-3 on both (ATEN_CPU_CAPABILITY=avx2
    # ONEDNN_MAX_CPU_ISA=AVX2 reproduces an AVX2 machine's numbers exactly): after 80
    # pre-training epochs, pre-train mAP50 0.34-1.0, fine-tuned 0.097-0.73, scratch 0.0 in
    # every run. So the mAP50 is only required to beat scratch's; the margin is asked of the
    # losses of the parts the weights carry over (backbone, neck, box and DFL branches; the
    # class branch is re-initialised): the fine-tuned run's last-epoch box + DFL loss was
    # 0.59x scratch's (1.96 against 3.31), and must be below 0.8x.
    pre = LibreYOLO("yolo9-t").train(data=pre_data, epochs=80, project=tmp_path, name="pre", **TINY)
    with caplog.at_level(logging.INFO, logger="libreyolo_core.facade"):
        tuned_model = LibreYOLO(pre["best_checkpoint"])
        tuned = tuned_model.train(data=ft_data, epochs=10, project=tmp_path, name="ft", **TINY)
    scratch = LibreYOLO("yolo9-t").train(data=ft_data, epochs=10, project=tmp_path, name="scratch", **TINY)
    line = next(r.getMessage() for r in caplog.records if "transferred" in r.getMessage())
    assert line == ("class count 4 -> 3: transferred 1332 of 1338 tensors; "
                    "re-initialised: head.cls.{0,1,2}.2.{bias,weight}")
    assert tuned_model.names == {0: "round", 1: "boxy", 2: "pointy"}  # names from the new dataset
    assert tuned["mAP50"] > scratch["mAP50"], (pre["mAP50"], tuned["mAP50"], scratch["mAP50"])
    box_dfl = {}
    for run in ("ft", "scratch"):
        last = list(csv.DictReader((tmp_path / run / "results.csv").read_text().splitlines()))[-1]
        box_dfl[run] = float(last["train/box_loss"]) + float(last["train/dfl_loss"])
    assert box_dfl["ft"] < 0.8 * box_dfl["scratch"], box_dfl


def test_freeze_keeps_weights_and_batchnorm_statistics(tmp_path):
    pre_data, _ = _datasets(tmp_path)
    from libreyolo_core.engine.checkpoint import save_checkpoint
    build_model = get_family("yolox").build_model

    net = build_model("n", 4)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    start = save_checkpoint({"model_family": "yolox", "size": "n", "task": "detect", "nc": 4, "imgsz": 96,
                             "names": {i: str(i) for i in range(4)}, "model": net.state_dict()},
                            tmp_path / "start.pt")
    LibreYOLO(start).train(data=pre_data, epochs=2, project=tmp_path, name="frozen", freeze=["backbone.backbone"],
               val=False, **{**TINY, "warmup_epochs": 0})
    after = torch.load(tmp_path / "frozen" / "weights" / "last.pt", weights_only=True)["train_model"]
    frozen = [k for k in before if k.startswith("backbone.backbone.")]
    moved = [k for k in before if k.startswith("head.") and k.endswith("running_mean")]
    assert frozen and all(torch.equal(before[k], after[k]) for k in frozen)  # weights and BN statistics
    assert any(not torch.equal(before[k], after[k]) for k in moved)  # the rest trained


def test_freeze_config_is_validated(tmp_path):
    from libreyolo_core.config import TrainConfig
    from libreyolo_core.engine.freeze import FreezeError, blocks, freeze_modules
    build_model = get_family("yolo9").build_model

    assert TrainConfig(freeze="10").freeze == 10 and TrainConfig(freeze="backbone,neck.up1").freeze == [
        "backbone", "neck.up1"]
    with pytest.raises(ValueError, match="freeze"):
        TrainConfig(freeze=-1)
    net = build_model("t", 2)
    assert blocks(net)[:3] == ["backbone.stem.0", "backbone.stem.1", "backbone.elan"] and len(blocks(net)) == 17
    assert freeze_modules(net, 10)[-1] == "backbone.spp"  # the backbone: upstream layers 0-9
    assert not any(p.requires_grad for p in net.backbone.parameters())
    assert all(p.requires_grad for p in net.neck.parameters())
    with pytest.raises(FreezeError, match="no module named neck.nope"):
        freeze_modules(net, ["neck.nope"])
