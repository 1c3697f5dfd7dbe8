"""Model family registry: model names -> :class:`~libreyolo_core.models.family.Family`.

Torch-free: the API process imports it to validate requests (names, sizes, per-family
defaults). The registry is an explicit name -> family map that refuses a second family of
the same name; the built-in families are registered by ``libreyolo_core/models/__init__.py``
(which runs before any of its submodules), so the result never depends on import order.
"""

from __future__ import annotations

import difflib
from types import MappingProxyType
from typing import TypeVar

from libreyolo_core.models.family import Family

__all__ = [
    "ModelNameError",
    "register_family",
    "get_family",
    "families",
    "list_models",
    "parse_model_name",
]

F = TypeVar("F", bound=type[Family])


class ModelNameError(ValueError):
    """A model name that is not ``<family>-<size>`` of a registered family."""


_FAMILIES: dict[str, Family] = {}


def register_family(cls: F) -> F:
    """Class decorator: register one instance of the family ``cls`` under ``cls.name``.

    Raises:
        ValueError: a family of that name is already registered.
    """
    if cls.name in _FAMILIES:
        raise ValueError(f"model family {cls.name!r} is already registered "
                         f"({type(_FAMILIES[cls.name]).__qualname__})")
    _FAMILIES[cls.name] = cls()
    return cls


def get_family(name: str) -> Family:
    """Return the family registered as ``name``; ``ModelNameError`` names the choices."""
    try:
        return _FAMILIES[name]
    except KeyError:
        raise ModelNameError(
            f"unknown model family {name!r}; registered: {', '.join(sorted(_FAMILIES))}"
        ) from None


def families() -> MappingProxyType[str, Family]:
    """Read-only view of the registered families, in registration order."""
    return MappingProxyType(_FAMILIES)


def list_models() -> list[str]:
    """All model names ``<family>-<size>``, e.g. ``['yolo9-t', 'yolo9-s', ...]``."""
    return [f"{f.name}-{s}" for f in _FAMILIES.values() for s in f.sizes]


def parse_model_name(model: str) -> tuple[Family, str]:
    """Split ``'yolo9-t'`` into its family and size letter.

    Raises:
        ModelNameError: the name is not a registered ``<family>-<size>``; the message
            lists the valid names and suggests the closest one.
    """
    name = str(model).strip().lower()
    family, _, size = name.rpartition("-")
    if family in _FAMILIES and size in _FAMILIES[family].sizes:
        return _FAMILIES[family], size
    valid = list_models()
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ModelNameError(f"unknown model {model!r}.{hint} Valid models: {', '.join(valid)}")
