"""The training network's memory format: channels-last (NHWC) or contiguous (NCHW).

Convolutions in oneDNN (x86 CPUs) and cuDNN (NVIDIA GPUs, Tensor Cores) run faster on
channels-last activations; the weights' format decides the activations' (PyTorch's
"channels last memory format" tutorial). Measured on a 2-core x86 CPU, torch 2.14,
forward + backward in float32 (bench/channels_last.py): 17-21 % less time for yolo9-t,
yolo9-s and yolox-s at 320, 21 % for yolox-n at 416. Ultralytics turns it on for CUDA
training and for CPU inference.

Only the layout changes, not the arithmetic's definition: outputs differ from NCHW's in
float rounding (another summation order inside oneDNN's kernels). A checkpoint's weights
are written in NCHW whatever the training layout
(:func:`~libreyolo_core.engine.checkpoint.save_checkpoint`); the optimizer state keeps it.
"""

from __future__ import annotations

import logging
import platform

import torch
from torch import nn

__all__ = ["apply_memory_format", "channels_last_wanted"]

log = logging.getLogger(__name__)

_X86 = frozenset({"x86_64", "AMD64", "amd64", "i686", "x86"})


def channels_last_wanted(setting: bool | None, device: torch.device) -> tuple[bool, str]:
    """Whether a network trained on ``device`` uses channels-last, and why (for the log).

    Args:
        setting: the ``channels_last`` key: True, False, or None (auto: on for CUDA and for
            an x86 CPU with oneDNN; off elsewhere, e.g. MPS or an ARM CPU, where it is not
            measured).
        device: the training device.

    Returns:
        ``(on, reason)``; an explicit True on a device other than CUDA or CPU is refused
        (``False``, with the reason): MPS has known channels-last errors.
    """
    if device.type not in ("cuda", "cpu"):
        if setting:
            return False, f"channels_last=True ignored on {device.type} (CUDA and CPU only)"
        return False, f"channels_last: off on {device.type}"
    if setting is not None:
        return setting, f"channels_last={setting} (set)"
    if device.type == "cuda":
        return True, "channels_last: on (auto: CUDA; channels_last=False turns it off)"
    x86 = platform.machine() in _X86 and torch.backends.mkldnn.is_available()
    if x86:
        return True, ("channels_last: on (auto: x86 CPU with oneDNN, whose convolutions run "
                      "faster on NHWC; channels_last=False turns it off)")
    return False, f"channels_last: off (auto: a {platform.machine()} CPU is not measured)"


def apply_memory_format(model: nn.Module, setting: bool | None, device: torch.device, *,
                        announce: bool = True) -> bool:
    """Put ``model``'s 4-D parameters and buffers in channels-last when
    :func:`channels_last_wanted` says so, else in NCHW (a model that trained channels-last
    before and now trains with it off goes back); one log line when ``announce``. Returns
    whether it is channels-last. The model is changed in place
    (``nn.Module.to(memory_format=...)``)."""
    on, why = channels_last_wanted(setting, device)
    model.to(memory_format=torch.channels_last if on else torch.contiguous_format)
    if announce:
        refused = setting is True and not on  # asked for on a device that cannot
        (log.warning if refused else log.info)(why)
    return on
