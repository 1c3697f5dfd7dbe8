"""A non-finite step leaves no trace: weights, BatchNorm buffers and EMA stay finite; an
epoch without one good step is an error; no checkpoint is written with a NaN or an inf."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from libreyolo_core import LibreYOLO
from libreyolo_core.engine.checkpoint import (
    NonFiniteCheckpointError,
    load_checkpoint,
    save_checkpoint,
)
from libreyolo_core.engine.nonfinite import BatchNormGuard, NonFiniteLossError, nonfinite_tensors

RUN = dict(imgsz=64, batch=2, workers=0, epochs=2, val=False, warmup_epochs=0, no_aug_epochs=0)


@pytest.fixture
def eight_images(tmp_path):
    """8 images 64x64, one box each, ``names: [a]`` (the issue's case)."""
    root = tmp_path / "ds"
    rng = np.random.default_rng(0)
    for i in range(8):
        (root / "images" / "train").mkdir(parents=True, exist_ok=True)
        (root / "labels" / "train").mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(
            root / "images" / "train" / f"{i}.png")
        (root / "labels" / "train" / f"{i}.txt").write_text("0 0.5 0.5 0.4 0.3\n")
    (root / "data.yaml").write_text("path: .\ntrain: images/train\nnames: [a]\n")
    return root / "data.yaml"


def _inf_on_first_conv(steps: set[int] | None):
    """on_train_start callback: the first Conv2d's output times inf in training mode, on the
    listed 1-based forward passes (every one if None)."""

    def install(trainer):
        conv = next(m for m in trainer.parts.model.modules() if isinstance(m, nn.Conv2d))
        count = {"n": 0}

        def hook(module, inputs, output):
            if not module.training:
                return None
            count["n"] += 1
            if steps is None or count["n"] in steps:
                return output * float("inf")
            return None

        conv.register_forward_hook(hook)

    return install


@pytest.mark.slow
def test_every_step_nonfinite_stops_the_run_naming_step_and_term(eight_images, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    events = []
    with pytest.raises(NonFiniteLossError) as err:
        LibreYOLO("yolo9-t").train(data=eight_images, project=tmp_path / "runs",
                                   callbacks={"on_train_start": [_inf_on_first_conv(None)],
                                              "on_epoch_end": [lambda t: events.append(t.state.epoch)]},
                                   **RUN)
    msg = str(err.value)
    assert "epoch 1: no optimizer step was taken in 4 steps" in msg
    assert "the first at step 1/4 (box=nan" in msg
    assert events == []  # no epoch completed
    assert caplog.text.count("optimizer step skipped") == 4
    assert not (tmp_path / "runs" / "exp" / "weights" / "best.pt").exists()
    assert not (tmp_path / "runs" / "exp" / "weights" / "last.pt").exists()
    end = [line for line in (tmp_path / "runs" / "exp" / "events.jsonl").read_text().splitlines()
           if '"run_end"' in line]
    assert '"status": "failed"' in end[0] and "no optimizer step" in end[0]


@pytest.mark.slow
def test_skipped_steps_leave_no_trace_in_bn_buffers_or_ema(eight_images, tmp_path):
    result = LibreYOLO("yolo9-t").train(data=eight_images, project=tmp_path / "runs",
                                        callbacks={"on_train_start": [_inf_on_first_conv({3, 4, 5})]},
                                        **RUN)
    assert result["nonfinite_skipped"] == 3
    ckpt = load_checkpoint(tmp_path / "runs" / "exp" / "weights" / "last.pt")
    assert nonfinite_tensors({k: ckpt[k] for k in ("model", "train_model", "optimizer")}) == []
    assert ckpt["ema_updates"] == 8 - 3


def test_bn_guard_restores_running_stats_in_place():
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.SiLU(), nn.BatchNorm2d(4)).train()
    guard = BatchNormGuard(net)
    assert len(guard) == 6
    before = {k: v.clone() for k, v in net.state_dict().items()}
    ptr = net[1].running_var.data_ptr()
    guard.snapshot()
    net(torch.full((1, 3, 8, 8), float("inf")))
    assert not torch.isfinite(net[1].running_mean).all()
    guard.restore()
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert net[1].running_var.data_ptr() == ptr  # same storage: graphs / DDP see the restore


def test_checkpoint_with_a_nonfinite_tensor_is_never_written(tmp_path):
    good = {"model": {"w": torch.ones(2)}, "model_family": "yolo9", "size": "t", "nc": 1, "names": {0: "a"}}
    path = save_checkpoint(good, tmp_path / "last.pt")
    bad = {**good, "model": {"w": torch.ones(2), "bn.running_var": torch.tensor([1.0, float("nan")])},
           "optimizer": {"state": {0: {"momentum_buffer": torch.tensor([float("inf")])}}}}
    with pytest.raises(NonFiniteCheckpointError, match=r"last.pt: not written: 2 tensor\(s\) hold NaN or inf "
                                                       r"\(model.bn.running_var, optimizer.state.0.momentum_buffer\)"):
        save_checkpoint(bad, path)
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.ones(2))  # the old file is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]  # no temp file left


@pytest.mark.slow
@pytest.mark.parametrize(("amp", "clip"), [(True, 10.0), (False, 10.0), (False, None)],
                         ids=["scaler", "fp32", "fp32-noclip"])
def test_steps_with_inf_gradients_leave_no_trace(eight_images, tmp_path, amp, clip):
    """Gradients that turn inf on forward passes 2 and 6 while the loss stays finite (an
    fp16 backward overflow). ``scaler``: CPU stand-in for fp16 AMP, an enabled GradScaler
    skips the steps; ``fp32``: the trainer's own gradient check does, reading the clip's
    total norm; ``fp32-noclip``: the check computes the norms itself (YOLOX's default)."""
    seen = {}

    def install(trainer):
        if amp:
            trainer.parts.amp.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
        param = next(p for p in trainer.parts.model.parameters() if p.requires_grad)
        state = {"n": 0, "on": False}

        def count(module, inputs, output):
            if module.training:
                state["n"] += 1
                state["on"] = state["n"] in (2, 6)

        trainer.parts.model.register_forward_hook(count)
        param.register_hook(lambda g: g * float("inf") if state["on"] else g)

    def after_epoch(trainer):
        seen.setdefault("updates", []).append(trainer.parts.ema.updates)

    result = LibreYOLO("yolo9-t").train(data=eight_images, project=tmp_path / "runs",
                                        callbacks={"on_train_start": [install],
                                                   "on_epoch_end": [after_epoch]},
                                        clip_max_norm=clip, **RUN)
    assert (result["amp_skipped"], result["nonfinite_skipped"]) == ((2, 0) if amp else (0, 2))
    assert seen["updates"] == [3, 6]  # 8 steps, 2 skipped by the scaler
    ckpt = load_checkpoint(tmp_path / "runs" / "exp" / "weights" / "last.pt")
    assert nonfinite_tensors({k: ckpt[k] for k in ("model", "train_model", "optimizer")}) == []


def _fp16_like_scaler(init_scale: float, overflow_above: float | None):
    """on_train_start callback: an enabled GradScaler (the CPU's stands in for CUDA's fp16
    one) and a gradient hook that turns the first Conv2d's weight gradient into inf while
    the scale is above ``overflow_above`` (every step if None): what fp16 weight gradients
    do while the scaler's scale is too large for them."""

    def install(trainer):
        scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
        trainer.parts.amp.scaler = scaler
        conv = next(m for m in trainer.parts.model.modules() if isinstance(m, nn.Conv2d))

        def hook(grad):
            if overflow_above is None or scaler.get_scale() > overflow_above:
                return grad * float("inf")
            return grad

        conv.weight.register_hook(hook)

    return install


@pytest.mark.slow
def test_an_epoch_the_fp16_scaler_spends_calibrating_is_not_a_divergence(eight_images, tmp_path,
                                                                         caplog):
    """The GradScaler starts at 2**16 and halves per skipped step; an epoch all of whose
    steps it skips while finding its scale goes on with one warning (on a GPU, fp16 yolo9-t
    on 16 images at batch 4 failed here: every step skipped, 'the run diverged')."""
    caplog.set_level(logging.WARNING)
    result = LibreYOLO("yolo9-t").train(
        data=eight_images, project=tmp_path / "runs", nbs=2,
        callbacks={"on_train_start": [_fp16_like_scaler(2.0**16, overflow_above=2.0**12)]}, **RUN)
    assert result["amp_skipped"] == 4  # epoch 1: 2**16 .. 2**13 skipped, 2**12 fits
    assert "skipped every optimizer step of the epoch while it finds its scale (now 4096" in caplog.text
    ckpt = load_checkpoint(tmp_path / "runs" / "exp" / "weights" / "last.pt")
    assert ckpt["epoch"] == 1 and nonfinite_tensors({"model": ckpt["model"]}) == []


@pytest.mark.slow
def test_gradients_nonfinite_below_scale_one_are_a_divergence(eight_images, tmp_path):
    with pytest.raises(NonFiniteLossError, match="no optimizer step was taken in 4 steps: every "
                                                 "step had non-finite gradients"):
        LibreYOLO("yolo9-t").train(
            data=eight_images, project=tmp_path / "runs", nbs=2,
            callbacks={"on_train_start": [_fp16_like_scaler(4.0, overflow_above=None)]}, **RUN)
