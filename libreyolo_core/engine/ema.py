"""Exponential moving average of model weights.

Reference: the ``ModelEMA`` of YOLOX (Ge et al. 2021) and Ultralytics, itself after
TensorFlow's ExponentialMovingAverage. Decay ramps up as ``d * (1 - exp(-updates / tau))``
so early, noisy weights are forgotten quickly.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

__all__ = ["ModelEMA", "unwrap"]


def unwrap(model: nn.Module) -> nn.Module:
    """The bare module behind DDP / ``torch.compile`` wrappers."""
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)


class ModelEMA:
    """EMA copy of a model, kept in eval mode without gradients.

    Every floating entry of the state dict (parameters and BatchNorm running stats) is
    updated in place with ``ema = d * ema + (1 - d) * model`` after each optimizer step.
    """

    def __init__(self, model: nn.Module, decay: float = 0.9999, tau: float = 2000.0, updates: int = 0):
        self.module = copy.deepcopy(unwrap(model)).eval()
        for p in self.module.parameters():
            p.requires_grad_(False)
        self.decay, self.tau, self.updates = decay, tau, updates
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def current_decay(self) -> float:
        return self.decay * (1 - math.exp(-self.updates / self.tau))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Blend ``model``'s weights into the EMA (one fused foreach op per dtype group)."""
        if self._pairs is None:
            src = unwrap(model).state_dict()
            self._pairs = [
                (v, src[k]) for k, v in self.module.state_dict().items() if v.dtype.is_floating_point
            ]
        self.updates += 1
        d = self.current_decay()
        ema_t = [e for e, _ in self._pairs]
        model_t = [m.detach() for _, m in self._pairs]
        torch._foreach_lerp_(ema_t, model_t, 1.0 - d)

    def state_dict(self) -> dict:
        return {"updates": self.updates, "decay": self.decay, "tau": self.tau}

    def load_state_dict(self, state: dict) -> None:
        self.updates = int(state.get("updates", 0))
