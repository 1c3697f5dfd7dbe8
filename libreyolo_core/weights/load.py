"""One loader for every weights file we accept (:func:`load_weights`).

Formats (``LoadedWeights.format``):

* ``libreyolo`` — ours or LibreYOLO 1.x: ``{"model": state_dict, "model_family", "size",
  "nc", "names", "imgsz", ...}`` (``state_dict`` instead of ``model`` accepted);
  YOLOv9 tensors under LibreYOLO's names.
* ``yolov9-upstream`` — the MultimediaTechLab/YOLO release: a bare state dict of numbered
  layers; the PGI auxiliary branch (layers 23 and above) is dropped, said in one log line.
* ``yolox-megvii`` — Megvii's ``{"model": state_dict, "start_epoch", "optimizer", ...}``.
* ``state-dict`` — a bare state dict with LibreYOLO's (= our) names.

Whatever the layout, DDP's ``module.`` prefixes are stripped, family and size come from the
metadata or, without it, from the tensors (:func:`detect_model`), and the class count from the
class-dependent head tensors.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from libreyolo_core.models.family import Family
from libreyolo_core.models.registry import families, get_family, list_models
from libreyolo_core.weights.errors import CheckpointError
from libreyolo_core.weights.names import (
    LIBREYOLO_AUX_PREFIXES,
    is_libreyolo_yolo9,
    is_upstream_yolo9,
    strip_wrappers,
    to_ours,
    yolo9_from_upstream,
)
from libreyolo_core.weights.reader import plain, read_torch_file

__all__ = ["LoadedWeights", "load_weights", "detect_model", "build_from_state"]

log = logging.getLogger(__name__)


@dataclass
class LoadedWeights:
    """A weights file read into our names.

    Attributes:
        path: the file.
        family, size: registered family key and size letter.
        nc: class count of the head. names: ``{id: name}``.
        imgsz: training image size in the file, or ``None``.
        format: ``libreyolo``, ``yolov9-upstream``, ``yolox-megvii`` or ``state-dict``.
        state: float32 tensors under our names (what ``build()`` loads).
        arch: extra ``build_model`` keywords (YOLOv9's class-tower width).
        meta: every other key of the file (numpy scalars made plain), e.g. our resume state.
    """

    path: Path
    family: str
    size: str
    nc: int
    names: dict[int, str]
    imgsz: int | None
    format: str
    state: dict[str, torch.Tensor]
    arch: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def model_name(self) -> str:
        return f"{self.family}-{self.size}"

    def build(self) -> nn.Module:
        """Our model with these weights (CPU, float32).

        Raises:
            CheckpointError: the tensors do not fit the model (names the first difference).
        """
        return build_from_state(get_family(self.family), self.size, self.nc, self.state,
                                source=self.path)


def build_from_state(family: Family, size: str, nc: int, state: Mapping[str, torch.Tensor],
                     source: Path | str = "weights") -> nn.Module:
    """``family.build_model(size, nc, **family.arch_from_state(state))`` with ``state`` loaded.

    Raises:
        CheckpointError: ``state`` does not fit (the message names ``source`` and the reason).
    """
    model = family.build_model(size, nc, **family.arch_from_state(dict(state)))
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        detail = " ".join(str(exc).split())[:400]
        raise CheckpointError(f"{source}: its tensors do not fit {family.name}-{size} "
                              f"({detail})") from None
    return model


def _class_count(family: Family, state: Mapping[str, torch.Tensor]) -> int | None:
    weights = [k for k in family.class_tensors(list(state)) if k.endswith("weight")]
    return int(state[weights[0]].shape[0]) if weights else None


def _fits(family: Family, size: str, nc: int, state: Mapping[str, torch.Tensor]) -> bool:
    with torch.device("meta"):
        model = family.build_model(size, nc, **family.arch_from_state(dict(state)))
    own = model.state_dict()
    return own.keys() == state.keys() and all(own[k].shape == state[k].shape for k in own)


def detect_model(state: Mapping[str, torch.Tensor]) -> tuple[str, str] | None:
    """``(family, size)`` whose model has exactly these tensor names and shapes (our names),
    or ``None``. Each candidate is built on the ``meta`` device (no memory, no compute)."""
    for family in families().values():
        nc = _class_count(family, state)
        if nc is None:
            continue
        for size in family.sizes:
            if _fits(family, size, nc, state):
                return family.name, size
    return None


def _split(raw: Any, path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], bool]:
    """``(state, meta, wrapped)`` of a loaded file; ``wrapped``: the state sat under a key."""
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: not a weights file (holds a {type(raw).__name__}, not a dict)")
    ema = raw.get("ema")
    if isinstance(ema, dict) and ema and all(isinstance(v, torch.Tensor) for v in ema.values()):
        # a file with the raw weights under 'model' and their moving average under 'ema'
        # (YOLOX-style and other trainers' checkpoints): the average is what was validated
        others = [k for k in ("model", "state_dict") if isinstance(raw.get(k), dict)]
        log.info("%s: using its 'ema' entry (the averaged weights)%s", path.name,
                 f", not '{others[0]}' (the raw training weights)" if others else "")
        return ema, {k: v for k, v in raw.items() if k not in ("ema", *others)}, True
    for key in ("model", "state_dict"):
        if isinstance(raw.get(key), dict):
            return raw[key], {k: v for k, v in raw.items() if k != key}, True
    if raw and all(isinstance(v, torch.Tensor) for v in raw.values()):
        return raw, {}, False
    keys = ", ".join(sorted(str(k) for k in raw)[:8])
    raise CheckpointError(f"{path}: no model weights in it (no 'model' or 'state_dict' key; keys: {keys})")


def _family_size_from_meta(meta: Mapping[str, Any], path: Path) -> tuple[str, str] | None:
    family, size = meta.get("model_family"), meta.get("size")
    if not family:
        return None
    if str(family) not in families() or str(size) not in families()[str(family)].sizes:
        raise CheckpointError(f"{path}: a {family}-{size} checkpoint; this engine has {', '.join(list_models())}")
    return str(family), str(size)


def _names(meta: Mapping[str, Any], nc: int) -> dict[int, str]:
    names = meta.get("names")
    if isinstance(names, list | tuple):
        names = dict(enumerate(names))
    if not isinstance(names, dict) or len(names) != nc:
        return {i: str(i) for i in range(nc)}
    try:
        return {int(k): str(v) for k, v in names.items()}
    except (TypeError, ValueError):
        return {i: str(i) for i in range(nc)}


def load_weights(path: str | Path, expect: str | None = None) -> LoadedWeights:
    """Read ``path`` (``torch.load(weights_only=True)``) in any accepted format.

    Args:
        path: the weights file.
        expect: the model the caller asked for (``"yolo9-t"``); a file of another family or
            size is still loaded as what it is, with one log line naming both.

    Raises:
        CheckpointError: missing, unreadable, a pickle that needs code (Ultralytics files
            named as such), no weights in it, a family or size we do not have, or tensors
            that fit none of our models.
    """
    path = Path(path)
    raw = read_torch_file(path)
    state, meta, wrapped = _split(raw, path)
    bad = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(f"{path}: the weights hold non-tensor values ({', '.join(map(str, bad[:3]))})")
    state = strip_wrappers(state)
    meta = plain(meta)

    fmt = "libreyolo" if meta.get("model_family") else ("state-dict" if not wrapped else "")
    if is_upstream_yolo9(state):
        state, aux = yolo9_from_upstream(state)
        fmt = "yolov9-upstream"
        log.info("%s: upstream YOLOv9 layout; %s", path.name,
                 f"dropped the PGI auxiliary branch ({aux} tensors, training-only)" if aux
                 else "no PGI auxiliary branch in the file")
    elif is_libreyolo_yolo9(state):
        aux = sum(k.startswith(LIBREYOLO_AUX_PREFIXES) for k in state)
        if aux:
            log.info("%s: dropped YOLOv9's PGI auxiliary branch (%d tensors, training-only)", path.name, aux)
        state = to_ours("yolo9", state)

    named = _family_size_from_meta(meta, path)
    found = detect_model(state)
    if found is None:
        what = f"a {named[0]}-{named[1]} checkpoint whose" if named else "its"
        raise CheckpointError(f"{path}: {what} tensors match none of our models "
                              f"({', '.join(list_models())})")
    if named is not None and named != found:
        log.warning("%s: metadata says %s-%s but the tensors are a %s-%s; using the tensors", path.name,
                    *named, *found)
    family, size = found
    if not fmt:
        fmt = "yolox-megvii" if family == "yolox" else "state-dict"
    if expect is not None and str(expect).lower() != f"{family}-{size}":
        log.warning("%s holds a %s-%s, not the %s asked for; loading it as %s-%s", path.name, family, size,
                    expect, family, size)
    family_mod = get_family(family)
    nc = _class_count(family_mod, state)
    assert nc is not None  # detect_model found the family by its class tensors
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    imgsz = meta.get("imgsz")
    return LoadedWeights(
        path=path, family=family, size=size, nc=int(nc), names=_names(meta, int(nc)),
        imgsz=int(imgsz) if isinstance(imgsz, int | float) and imgsz else None, format=fmt, state=state,
        arch=family_mod.arch_from_state(state), meta=meta,
    )
