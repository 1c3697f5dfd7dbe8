"""Mixed precision policy (docs/architecture.md, Trainer).

- CUDA + ``amp``: autocast with ``amp_dtype``; float16 gets a working ``GradScaler``,
  bfloat16 a constructed but disabled one (same optimizer path).
- bfloat16 asked on a GPU without bf16 support: float16, with one warning.
- CPU / MPS: no autocast, fp32, one log line.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import torch

__all__ = ["AmpPolicy", "resolve_amp"]

log = logging.getLogger(__name__)


@dataclass
class AmpPolicy:
    """Resolved precision: ``enabled`` autocast of ``dtype`` on ``device_type`` + ``scaler``."""

    enabled: bool
    dtype: torch.dtype
    device_type: str
    scaler: torch.amp.GradScaler

    def autocast(self, cache_enabled: bool = True):
        """Context for forward + loss; a no-op context when disabled."""
        if not self.enabled:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype, cache_enabled=cache_enabled)

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.") if self.enabled else "float32"


def resolve_amp(amp: bool, amp_dtype: str, device: torch.device, bf16_supported=None) -> AmpPolicy:
    """Decide the precision of a run.

    Args:
        amp: the ``amp`` key.
        amp_dtype: ``"float16"`` or ``"bfloat16"``.
        device: the training device.
        bf16_supported: override of ``torch.cuda.is_bf16_supported()`` (tests).
    """
    if device.type != "cuda":
        if amp:
            log.info("amp ignored on %s: training in float32", device.type)
        return AmpPolicy(False, torch.float32, device.type, torch.amp.GradScaler("cpu", enabled=False))
    if not amp:
        return AmpPolicy(False, torch.float32, "cuda", torch.amp.GradScaler("cuda", enabled=False))
    dtype = torch.bfloat16 if amp_dtype == "bfloat16" else torch.float16
    if dtype is torch.bfloat16:
        ok = torch.cuda.is_bf16_supported() if bf16_supported is None else bf16_supported
        if not ok:
            log.warning("amp_dtype=bfloat16 is not supported on this GPU: using float16 instead")
            dtype = torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=dtype is torch.float16)
    return AmpPolicy(True, dtype, "cuda", scaler)
