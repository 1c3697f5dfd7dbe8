"""Non-finite guards: a skipped step leaves no trace, no checkpoint holds a NaN or an inf.

Three parts the trainer and the checkpoint writer call:

- :class:`BatchNormGuard`: BatchNorm updates its running statistics *during* the forward
  pass, before the loss can be checked. The guard copies every BatchNorm buffer
  (``running_mean``, ``running_var``, ``num_batches_tracked``) at the start of each
  accumulation window and copies them back, in place, when the window's step is skipped
  (a non-finite loss, or under fp16 AMP a step the ``GradScaler`` skipped for inf/NaN
  gradients). In-place copies keep tensor addresses, so CUDA-graph replays and DDP buffer
  broadcasts see the restored values. Cost: one fused ``_foreach_copy_`` of the BatchNorm
  buffers per window (yolo9-t: 442 tensors, ~0.04 MB; measured in docs/architecture.md).
- :func:`nonfinite_tensors`: the dotted keys of every floating tensor holding a NaN or an
  inf in a nested checkpoint dict; ``save_checkpoint`` refuses to write such a state.
- :func:`grads_finite`: whether every gradient is finite (fp32 steps: a finite loss can
  still back-propagate an inf; the fp16 ``GradScaler`` checks this itself).
- :func:`describe_nonfinite`: ``"box=nan, cls=inf"`` for the loss terms of a step.
- :class:`NonFiniteLossError`: the run diverged (raised by the trainer's guard,
  :class:`~libreyolo_core.engine.hooks.NonFiniteGuard`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["BatchNormGuard", "grads_finite", "nonfinite_tensors", "describe_nonfinite", "NonFiniteLossError"]


class NonFiniteLossError(RuntimeError):
    """The run diverged: ten consecutive non-finite losses, or an epoch in which no
    optimizer step could be taken (every step non-finite or skipped by the AMP scaler)."""


class BatchNormGuard:
    """Snapshot / restore of a model's BatchNorm buffers (see the module docstring).

    Args:
        model: the training model (DDP / compile wrappers are fine: the buffers are shared
            with the wrapped module). Build the guard after any SyncBatchNorm conversion.
    """

    def __init__(self, model: nn.Module):
        self._live = [
            buf
            for m in model.modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm)
            for buf in (m.running_mean, m.running_var, m.num_batches_tracked)
            if buf is not None
        ]
        self._saved = [b.detach().clone() for b in self._live]

    def __len__(self) -> int:
        return len(self._live)

    @torch.no_grad()
    def snapshot(self) -> None:
        """Remember the current statistics (call before the forward passes of a window)."""
        if self._live:
            torch._foreach_copy_(self._saved, self._live)

    @torch.no_grad()
    def restore(self) -> None:
        """Put the remembered statistics back, in place (call when the step is skipped)."""
        if self._live:
            torch._foreach_copy_(self._live, self._saved)


@torch.no_grad()
def grads_finite(params) -> bool:
    """True when every ``.grad`` of ``params`` is finite (one fused norm per dtype/device
    group and one host read)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return True
    norms = torch._foreach_norm(grads)
    return bool(torch.isfinite(torch.stack([n.float() for n in norms])).all())


def _walk(obj: Any, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield from _walk(v, f"{prefix}.{i}" if prefix else str(i))


def nonfinite_tensors(state: Any) -> list[str]:
    """Dotted keys (``"model.0.bn.running_var"``, ``"optimizer.state.3.momentum_buffer"``)
    of the floating-point tensors in ``state`` (nested dicts/lists) that hold a NaN or an
    inf. Integer tensors cannot and are skipped. Empty when everything is finite."""
    bad = []
    for key, t in _walk(state, ""):
        if (t.is_floating_point() or t.is_complex()) and t.numel() and not bool(torch.isfinite(t).all()):
            bad.append(key)
    return bad


def describe_nonfinite(names: Sequence[str], values: Sequence[float]) -> str:
    """``"box=nan, dfl=inf"``: the non-finite loss terms among ``names``/``values``
    (all terms, formatted, when every term is finite but the total is not)."""
    pairs = list(zip(names, values, strict=True))
    bad = [(n, v) for n, v in pairs if not math.isfinite(v)] or pairs
    return ", ".join(f"{n}={v:.4g}" for n, v in bad)
