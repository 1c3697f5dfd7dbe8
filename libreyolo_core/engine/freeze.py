"""``freeze=``: keep some modules' weights and BatchNorm statistics fixed while training.

A frozen module's parameters get ``requires_grad=False`` (no gradient, so the optimizer
leaves them alone and weight decay does not touch them), and its BatchNorm layers are put
back in eval mode after every ``model.train()`` (:func:`keep_frozen_eval`), so their running
mean and variance do not move either.

``freeze=N`` freezes the first ``N`` of :func:`blocks` (the model's blocks in forward order);
``freeze=[names]`` freezes the named modules and everything under them.
"""

from __future__ import annotations

from torch import nn

from libreyolo_core.config import ConfigError

__all__ = ["blocks", "freeze_modules", "keep_frozen_eval", "FreezeError"]

_OPENED = ("backbone", "neck")


class FreezeError(ConfigError):
    """A ``freeze`` value that names no module of the model, or counts past its blocks
    (a configuration error: the CLI exits 2)."""


def blocks(model: nn.Module) -> list[str]:
    """The model's blocks in forward order: its children, with ``backbone`` / ``neck``
    wrappers and ``nn.Sequential`` / ``nn.ModuleList`` containers opened, modules without
    parameters left out, the head one block. For yolo9-t that is ``backbone.stem.0``,
    ``backbone.stem.1``, ``backbone.elan``, ``backbone.stages.0.0`` ... ``head`` (the
    upstream release's numbered layers)."""
    out: list[str] = []

    def visit(module: nn.Module, prefix: str) -> None:
        for name, child in module.named_children():
            path = f"{prefix}{name}"
            if not any(True for _ in child.parameters()):
                continue
            if name in _OPENED or isinstance(child, nn.Sequential | nn.ModuleList):
                visit(child, path + ".")
            else:
                out.append(path)

    visit(model, "")
    return out


def freeze_modules(model: nn.Module, selection: int | list[str] | None) -> list[str]:
    """Freeze the modules ``selection`` selects; returns their names (empty for ``None``).

    Raises:
        FreezeError: a count larger than the number of blocks, or a name that is no module
            of ``model`` (the message lists the blocks).
    """
    if not selection:
        return []
    units = blocks(model)
    modules = dict(model.named_modules())
    if isinstance(selection, int):
        if selection > len(units):
            raise FreezeError("freeze", selection, f"at most {len(units)}",
                              f"freeze={selection} but the model has {len(units)} blocks: {', '.join(units)}")
        names = units[:selection]
    else:
        unknown = [n for n in selection if n not in modules]
        if unknown:
            raise FreezeError("freeze", selection, "module names of the model",
                              f"freeze: no module named {', '.join(unknown)}; blocks are {', '.join(units)}")
        names = list(selection)
    for name in names:
        for p in modules[name].parameters():
            p.requires_grad_(False)
    keep_frozen_eval(model, names)
    return names


def keep_frozen_eval(model: nn.Module, names: list[str]) -> None:
    """Put the BatchNorm layers under ``names`` in eval mode (call after ``model.train()``)."""
    if not names:
        return
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and any(
                name == n or name.startswith(n + ".") for n in names):
            module.eval()
