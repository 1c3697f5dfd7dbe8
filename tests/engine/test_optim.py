"""Optimizer groups, accumulation and LR / momentum schedules."""

import math

import pytest
import torch
from torch import nn

from libreyolo_core.config import resolve_config
from libreyolo_core.engine.optim import LRSchedule, accumulate_steps, build_optimizer


def test_param_groups_exclude_bn_and_biases_from_decay():
    net = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.Conv2d(8, 4, 1))
    opt = build_optimizer(net, "sgd", 0.01, 0.9, 5e-4, True)
    groups = {g["name"]: g for g in opt.param_groups}
    assert groups["bn"]["weight_decay"] == 0.0 and len(groups["bn"]["params"]) == 2  # weight+bias
    assert groups["weights"]["weight_decay"] == 5e-4 and len(groups["weights"]["params"]) == 2
    assert groups["biases"]["weight_decay"] == 0.0 and len(groups["biases"]["params"]) == 1
    assert isinstance(build_optimizer(net, "adamw", 1e-3, 0.9, 0.05, False), torch.optim.AdamW)
    with pytest.raises(ValueError, match="optimizer='lion'"):
        build_optimizer(net, "lion", 0.01, 0.9, 0, False)


def test_accumulation_from_nbs():
    assert accumulate_steps(16, None) == 1
    assert accumulate_steps(16, 64) == 4
    assert accumulate_steps(128, 64) == 1
    assert accumulate_steps(24, 64) == 3


def test_linear_schedule_warms_up_then_decays_to_min():
    cfg = resolve_config(model="yolo9-t", epochs=10, lr0=0.02, warmup_epochs=2, warmup_lr_start=0.0,
                         min_lr_ratio=0.01)
    s = LRSchedule.from_config(cfg, steps_per_epoch=10)
    assert s.lr(0) == 0.0 and s.lr(10) == pytest.approx(0.01)
    assert s.lr(20) == pytest.approx(0.02)
    assert s.lr(100) == pytest.approx(0.0002)
    lrs = [s.lr(i) for i in range(20, 101)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:], strict=False))
    assert s.momentum_at(0) == pytest.approx(cfg.warmup_momentum)
    assert s.momentum_at(20) == pytest.approx(cfg.momentum)


def test_yolox_schedule_has_flat_tail():
    cfg = resolve_config(model="yolo9-t", epochs=10, scheduler="yoloxwarmcos", warmup_epochs=1,
                         no_aug_epochs=2, lr0=0.01, min_lr_ratio=0.05, warmup_lr_start=0.0)
    s = LRSchedule.from_config(cfg, steps_per_epoch=10)
    assert s.lr(5) == pytest.approx(0.01 * 0.25)  # quadratic warm-up
    assert s.lr(10) == pytest.approx(0.01)
    assert s.lr(80) == pytest.approx(0.0005) and s.lr(99) == pytest.approx(0.0005)
    mid = 10 + (80 - 10) // 2
    assert s.lr(mid) == pytest.approx(0.0005 + 0.5 * 0.0095 * (1 + math.cos(math.pi * 0.5)))


def test_apply_sets_lr_and_momentum_on_every_group():
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
    opt = build_optimizer(net, "sgd", 0.01, 0.937, 5e-4, True)
    cfg = resolve_config(model="yolo9-t", epochs=2, warmup_epochs=1)
    s = LRSchedule.from_config(cfg, steps_per_epoch=4)
    lr = s.apply(opt, 2)
    assert all(g["lr"] == lr for g in opt.param_groups)
    assert all(g["momentum"] == pytest.approx(s.momentum_at(2)) for g in opt.param_groups)
