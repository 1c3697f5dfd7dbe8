"""Model size and compute: parameter count and GFLOPs via ``torch.utils.flop_counter``."""

from __future__ import annotations

import copy
from typing import Any, cast

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["count_params", "count_gflops", "model_info"]


def count_params(model: nn.Module) -> int:
    """Total number of parameter elements (trainable or not)."""
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def count_gflops(model: nn.Module, imgsz: int | tuple[int, int] = 640) -> float:
    """GFLOPs of one eval-mode forward on a ``(1, 3, h, w)`` zero input.

    Counted by ``FlopCounterMode`` (convolutions and matrix products, reported as
    2 x multiply-accumulates; element-wise ops, BN and activations are not counted).
    The input is created on the model's device and dtype; the model's train/eval state
    is restored afterwards.
    """
    h, w = (imgsz, imgsz) if isinstance(imgsz, int) else imgsz
    p = next(model.parameters())
    x = torch.zeros(1, 3, h, w, device=p.device, dtype=p.dtype)
    was_training = model.training
    model.eval()
    try:
        with FlopCounterMode(display=False) as counter:
            model(x)
    finally:
        model.train(was_training)
    return counter.get_total_flops() / 1e9


def model_info(model: nn.Module, imgsz: int | tuple[int, int] = 640, fuse: bool = True) -> dict:
    """Parameter count of ``model`` and its GFLOPs at ``imgsz``.

    Args:
        model: the network (left unchanged).
        imgsz: square size or ``(h, w)``; multiples of 32 for YOLO models.
        fuse: count GFLOPs on a fused deep copy (``model.fuse()`` when available: BN and
            re-parameterised branches folded), as published tables do.

    Returns:
        ``{"params": int, "params_fused": int, "gflops": float, "fused": bool}``;
        ``params`` is the model as given (training form).
    """
    info: dict[str, Any] = {"params": count_params(model)}
    target = model
    fused = False
    if fuse and hasattr(model, "fuse"):
        target = copy.deepcopy(model).eval()
        cast(Any, target).fuse()  # the model's own method (nn.Module types it Tensor | Module)
        fused = True
    info["params_fused"] = count_params(target)
    info["gflops"] = count_gflops(target, imgsz)
    info["fused"] = fused
    return info
