"""Optimizer parameter groups, gradient accumulation and the LR / momentum schedules.

Schedules follow LibreYOLO 1.6 (docs/architecture.md, Trainer): ``linear`` (YOLOv9: linear warm-up, then
linear decay to ``lr0 * min_lr_ratio``), ``cos`` / ``warmcos`` (linear warm-up, then
cosine), ``yoloxwarmcos`` (YOLOX, Ge et al. 2021: quadratic warm-up, cosine, then a flat
tail at the minimum for the last ``no_aug_epochs``). Momentum warms up linearly from
``warmup_momentum`` to ``momentum`` (Ultralytics' habit; Adam's beta1 likewise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["accumulate_steps", "build_optimizer", "LRSchedule"]


def accumulate_steps(batch: int, nbs: int | None) -> int:
    """Micro-batches per optimizer step: ``max(1, round(nbs / batch))``, or 1 without ``nbs``."""
    return 1 if not nbs else max(1, round(nbs / batch))


def build_optimizer(
    model: nn.Module, name: str, lr0: float, momentum: float, weight_decay: float, nesterov: bool
) -> torch.optim.Optimizer:
    """Three parameter groups: BatchNorm weights (no decay), other weights (decay), biases
    and bare parameters (no decay).

    Raises:
        ValueError: unknown optimizer name, or a model without trainable parameters.
    """
    bn, decay, bias = [], [], []
    seen: set[int] = set()
    for module in model.modules():
        for pname, p in module.named_parameters(recurse=False):
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                bn.append(p)
            elif pname == "weight" and p.ndim > 1:
                decay.append(p)
            else:
                bias.append(p)
    if not (bn or decay or bias):
        raise ValueError("the model has no trainable parameters")
    groups = [
        {"params": bn, "weight_decay": 0.0, "name": "bn"},
        {"params": decay, "weight_decay": weight_decay, "name": "weights"},
        {"params": bias, "weight_decay": 0.0, "name": "biases"},
    ]
    groups = [g for g in groups if g["params"]]
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr0, momentum=momentum, nesterov=nesterov and momentum > 0)
    if name == "adam":
        return torch.optim.Adam(groups, lr=lr0, betas=(momentum, 0.999))
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr0, betas=(momentum, 0.999))
    raise ValueError(f"optimizer={name!r} is unknown; use sgd, adam or adamw")


@dataclass
class LRSchedule:
    """LR and momentum as functions of the optimizer-step index ``it`` (0-based).

    Attributes are in optimizer steps; ``plateau`` is the flat tail of ``yoloxwarmcos``.
    """

    kind: str
    lr0: float
    min_lr: float
    total: int
    warmup: int
    warmup_lr_start: float
    momentum: float
    warmup_momentum: float
    plateau: int = 0

    @classmethod
    def from_config(cls, cfg, steps_per_epoch: int) -> LRSchedule:
        """Build from a TrainConfig; ``steps_per_epoch`` counts optimizer steps."""
        total = max(1, cfg.epochs * steps_per_epoch)
        warmup = min(int(round(cfg.warmup_epochs * steps_per_epoch)), total)
        plateau = cfg.no_aug_epochs * steps_per_epoch if cfg.scheduler == "yoloxwarmcos" else 0
        return cls(cfg.scheduler, cfg.lr0, cfg.lr0 * cfg.min_lr_ratio, total, warmup,
                   cfg.warmup_lr_start, cfg.momentum, cfg.warmup_momentum, min(plateau, total - warmup))

    def lr(self, it: int) -> float:
        if self.warmup and it < self.warmup:
            frac = it / self.warmup
            if self.kind == "yoloxwarmcos":
                frac = frac**2
            return self.warmup_lr_start + (self.lr0 - self.warmup_lr_start) * frac
        span = max(self.total - self.warmup - self.plateau, 1)
        pos = min(max(it - self.warmup, 0) / span, 1.0)
        if self.kind == "linear":
            return self.lr0 + (self.min_lr - self.lr0) * pos
        return self.min_lr + 0.5 * (self.lr0 - self.min_lr) * (1 + math.cos(math.pi * pos))

    def momentum_at(self, it: int) -> float:
        if self.warmup and it < self.warmup:
            return self.warmup_momentum + (self.momentum - self.warmup_momentum) * it / self.warmup
        return self.momentum

    def apply(self, optimizer: torch.optim.Optimizer, it: int) -> float:
        """Set every group's LR (and momentum / beta1) for step ``it``; returns the LR."""
        lr, mom = self.lr(it), self.momentum_at(it)
        for g in optimizer.param_groups:
            g["lr"] = lr
            if "momentum" in g:
                g["momentum"] = mom
            elif "betas" in g:
                g["betas"] = (mom, g["betas"][1])
        return lr
