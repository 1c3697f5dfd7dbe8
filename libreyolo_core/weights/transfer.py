"""Start a model from another model's weights when the class count differs.

Every tensor whose name and shape match is copied; the rest (the class-dependent head
layers) keep their fresh initialisation. The report compacts the names, e.g.
``head.cls.{0,1,2}.2.{bias,weight}`` instead of six lines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["TransferReport", "transfer_weights", "compact_names"]


def compact_names(names: list[str]) -> list[str]:
    """Merge dotted names that differ in one component into ``a.{x,y}.b`` patterns.

    ``["h.0.w", "h.0.b", "h.1.w", "h.1.b"]`` -> ``["h.{0,1}.{b,w}"]``. Components are merged
    from the last to the first; the result is sorted.
    """
    items = {tuple(n.split(".")) for n in names}
    width = max((len(t) for t in items), default=0)
    for pos in range(width - 1, -1, -1):
        groups: dict[tuple, set[str]] = {}
        for t in items:
            if len(t) <= pos:
                groups.setdefault(t + ("\0",), set())
                continue
            groups.setdefault(t[:pos] + ("\0",) + t[pos + 1:], set()).add(t[pos])
        merged = set()
        for key, values in groups.items():
            if not values:
                merged.add(key[:-1])
                continue
            parts = sorted(v.strip("{}") for v in values)
            label = parts[0] if len(parts) == 1 else "{" + ",".join(parts) + "}"
            merged.add(key[:pos] + (label,) + key[pos + 1:])
        items = merged
    return sorted(".".join(t) for t in items)


@dataclass(frozen=True)
class TransferReport:
    """What :func:`transfer_weights` did.

    Attributes:
        transferred: names copied from the source.
        reinitialised: names of the destination left at their fresh values.
        total: tensors in the destination's state dict.
    """

    transferred: tuple[str, ...]
    reinitialised: tuple[str, ...]
    total: int

    def summary(self) -> str:
        """``"transferred N of M tensors; re-initialised: <compacted names>"``."""
        again = ", ".join(compact_names(list(self.reinitialised))) or "none"
        return f"transferred {len(self.transferred)} of {self.total} tensors; re-initialised: {again}"


def transfer_weights(dst: nn.Module, state: Mapping[str, torch.Tensor]) -> TransferReport:
    """Copy every tensor of ``state`` whose name and shape match ``dst`` (in place)."""
    own = dst.state_dict()
    keep = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    dst.load_state_dict(keep, strict=False)
    return TransferReport(tuple(k for k in own if k in keep), tuple(k for k in own if k not in keep), len(own))
