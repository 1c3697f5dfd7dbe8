"""Trainer guards: non-finite losses, nbs accumulation, patience, bad inputs."""

from __future__ import annotations

import logging

import pytest
import torch

from libreyolo_core import LibreYOLO
from libreyolo_core.engine.nonfinite import NonFiniteLossError

TINY = dict(imgsz=96, batch=4, workers=0, epochs=1, val=False, warmup_epochs=0, no_aug_epochs=0)


def _poison(steps: set[int] | None):
    """on_train_start callback: the loss of the listed micro-steps (all if None) becomes NaN."""

    def install(trainer):
        real = trainer.parts.loss_fn
        count = {"n": 0}

        def loss(outputs, targets, batch_size):
            total, items = real(outputs, targets, batch_size)
            n, count["n"] = count["n"], count["n"] + 1
            if steps is None or n in steps:
                total = total * float("nan")
            return total, items

        loss.item_names = real.item_names
        trainer.parts.loss_fn = loss

    return install


@pytest.mark.slow
def test_nonfinite_steps_are_skipped_and_counted(sample_yaml, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    model = LibreYOLO("yolo9-t")
    before = {k: v.clone() for k, v in model.model.state_dict().items()}
    seen = {}
    result = model.train(data=sample_yaml, project=tmp_path,
                         callbacks={"on_train_start": [_poison({0, 1, 2})],
                                    "on_epoch_end": [lambda t: seen.update(updates=t.parts.ema.updates)]},
                         **TINY)
    assert result["nonfinite_skipped"] == 3
    assert seen["updates"] == 4 - 3  # 16 images / batch 4 = 4 steps, 3 skipped
    assert "non-finite loss" in caplog.text and "optimizer step skipped" in caplog.text
    after = model.model.state_dict()
    assert all(torch.isfinite(v).all() for v in after.values() if v.is_floating_point())
    assert any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.slow
def test_ten_nonfinite_losses_in_a_row_stop_the_run(sample_yaml, tmp_path):
    # batch 2: 8 steps an epoch; steps 2-8 of epoch 1 and 1-3 of epoch 2 are non-finite
    # (each epoch takes a step, so the streak across epochs is what stops the run)
    # on the CPU AMP is off: the way out names only a tenth of lr0 (0.01 -> 0.001)
    with pytest.raises(NonFiniteLossError, match=r"10 non-finite losses in a row at epoch 2.*try a lower lr0 \(lr0=0.001\)"):
        LibreYOLO("yolo9-t").train(data=sample_yaml, project=tmp_path,
                                   callbacks={"on_train_start": [_poison(set(range(1, 11)))]},
                                   **{**TINY, "epochs": 2, "batch": 2})


@pytest.mark.slow
def test_nbs_accumulates_micro_batches(sample_yaml, tmp_path):
    seen = {}

    def grab(trainer):
        groups = {g["name"]: g for g in trainer.parts.optimizer.param_groups}
        seen.update(updates=trainer.parts.ema.updates, accumulate=trainer.parts.accumulate,
                    wd=groups["weights"]["weight_decay"], bn_wd=groups["bn"]["weight_decay"])

    LibreYOLO("yolo9-t").train(data=sample_yaml, project=tmp_path, nbs=8, weight_decay=1e-3,
                               callbacks={"on_epoch_end": [grab]}, **TINY)
    assert seen["accumulate"] == 2
    assert seen["updates"] == 2  # 4 micro-batches, 2 optimizer steps
    assert seen["wd"] == pytest.approx(1e-3)  # scaled by batch * accumulate / nbs = 4 * 2 / 8
    assert seen["bn_wd"] == 0.0


@pytest.mark.slow
def test_weight_decay_scales_with_nbs(sample_yaml, tmp_path):
    seen = {}

    def grab(trainer):
        seen["wd"] = {g["name"]: g for g in trainer.parts.optimizer.param_groups}["weights"]["weight_decay"]

    # batch 4, nbs 6 -> accumulate round(1.5) = 2, decay * 4 * 2 / 6
    LibreYOLO("yolo9-t").train(data=sample_yaml, project=tmp_path, nbs=6, weight_decay=1e-3,
                               callbacks={"on_epoch_end": [grab]}, **TINY)
    assert seen["wd"] == pytest.approx(1e-3 * 8 / 6)


def test_missing_data_is_named(tmp_path):
    from libreyolo_core.data.config import DataConfigError

    with pytest.raises((DataConfigError, FileNotFoundError), match="nope.yaml"):
        LibreYOLO("yolo9-t").train(data=tmp_path / "nope.yaml", project=tmp_path, **TINY)


def test_misspelled_callback_event_is_named(sample_yaml, tmp_path):
    with pytest.raises(ValueError, match="unknown event 'on_epoch_endd'. Did you mean 'on_epoch_end'"):
        LibreYOLO("yolo9-t").train(data=sample_yaml, project=tmp_path,
                                   callbacks={"on_epoch_endd": [print]}, **TINY)
    assert not any(tmp_path.iterdir())  # nothing ran
    for bad in (print, [42]):
        with pytest.raises(ValueError, match=r"callbacks\['on_epoch_end'\] must be a list of callables"):
            LibreYOLO("yolo9-t").train(data=sample_yaml, project=tmp_path,
                                       callbacks={"on_epoch_end": bad}, **TINY)


def test_warmup_longer_than_the_run_is_warned(sample_yaml, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    LibreYOLO("yolo9-t").train(data=sample_yaml, project=tmp_path, **{**TINY, "warmup_epochs": 3})
    assert "warmup_epochs=3 is longer than the run (epochs=1)" in caplog.text


def test_no_val_split_says_it_validates_on_train(sample_yaml, tmp_path, caplog):
    import yaml

    doc = yaml.safe_load(sample_yaml.read_text())
    doc.pop("val")
    doc["path"] = str(sample_yaml.parent / doc.get("path", "."))
    no_val = tmp_path / "no_val.yaml"
    no_val.write_text(yaml.safe_dump(doc))
    caplog.set_level(logging.WARNING)
    LibreYOLO("yolo9-t").train(data=no_val, project=tmp_path, **{**TINY, "val": True})
    said = [r.getMessage() for r in caplog.records if "validating on the train split" in r.getMessage()]
    assert len(said) == 1 and "no_val.yaml has no 'val:' split" in said[0], said
