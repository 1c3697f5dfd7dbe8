"""Tensor-name maps between our modules and the published layouts.

* YOLOX: our names *are* LibreYOLO 1.x's and Megvii's (``backbone.backbone.stem...``,
  ``head.cls_preds.0...``); nothing to map.
* YOLOv9, LibreYOLO 1.x layout: the same 1,338 tensors in the same module order, only
  12 names equal. Pairing our ``state_dict()`` with LibreYOLO 1.6.0's, position by position,
  gives equal shapes everywhere and one module-prefix rename per block; the table
  :data:`YOLO9_LIBREYOLO_PREFIXES` is that pairing (derived by module order and shape and
  checked against the installed reference in ``tests/models/test_weights_equivalence.py``).
* YOLOv9, upstream release layout (MultimediaTechLab/YOLO): numbered layers ``0.`` ...
  ``22.`` for the detection path and ``23.`` ... ``30.`` for the PGI auxiliary branch;
  inside a layer the blocks name their convs ``conv1`` ... ``conv5``, the RepNCSP repeats
  ``bottleneck.N`` and the head ``heads.N.anchor_conv`` / ``heads.N.class_conv``
  (:func:`yolo9_from_upstream`).

Our checkpoints store ``model`` under LibreYOLO's names (so LibreYOLO 1.6.0 loads them);
the engine renames to its own names on load (:func:`to_ours`) and back on save
(:func:`to_libreyolo`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

__all__ = [
    "YOLO9_LIBREYOLO_PREFIXES",
    "UPSTREAM_YOLO9_LAYERS",
    "to_ours",
    "to_libreyolo",
    "yolo9_from_upstream",
    "is_upstream_yolo9",
    "is_libreyolo_yolo9",
    "strip_wrappers",
]

# our module prefix -> LibreYOLO 1.x module prefix (YOLOv9 t and s)
YOLO9_LIBREYOLO_PREFIXES: dict[str, str] = {
    "backbone.stem.0": "backbone.conv0",
    "backbone.stem.1": "backbone.conv1",
    "backbone.elan": "backbone.elan1",
    "backbone.stages.0.0.cv1": "backbone.down2.cv",
    "backbone.stages.0.1": "backbone.elan2",
    "backbone.stages.1.0.cv1": "backbone.down3.cv",
    "backbone.stages.1.1": "backbone.elan3",
    "backbone.stages.2.0.cv1": "backbone.down4.cv",
    "backbone.stages.2.1": "backbone.elan4",
    "neck.up1": "neck.elan_up1",
    "neck.up2": "neck.elan_up2",
    "neck.down1_conv.cv1": "neck.down1.cv",
    "neck.down1": "neck.elan_down1",
    "neck.down2_conv.cv1": "neck.down2.cv",
    "neck.down2": "neck.elan_down2",
    "head.box": "head.cv2",
    "head.cls": "head.cv3",
}
_LIBREYOLO_TO_OURS = {v: k for k, v in YOLO9_LIBREYOLO_PREFIXES.items()}

# upstream layer index -> our module prefix (detection path; 10, 11, 13, 14, 17, 20 are
# upsample / concat layers without tensors; 23 and above are the PGI auxiliary branch)
UPSTREAM_YOLO9_LAYERS: dict[int, str] = {
    0: "backbone.stem.0", 1: "backbone.stem.1", 2: "backbone.elan",
    3: "backbone.stages.0.0", 4: "backbone.stages.0.1",
    5: "backbone.stages.1.0", 6: "backbone.stages.1.1",
    7: "backbone.stages.2.0", 8: "backbone.stages.2.1",
    9: "backbone.spp", 12: "neck.up1", 15: "neck.up2",
    16: "neck.down1_conv", 18: "neck.down1", 19: "neck.down2_conv", 21: "neck.down2",
    22: "head",
}
UPSTREAM_AUX_FIRST = 23
_ACONV_LAYERS = {3, 5, 7, 16, 19}

# LibreYOLO keeps YOLOv9's PGI auxiliary branch for training under these prefixes
LIBREYOLO_AUX_PREFIXES = ("aux.", "aux_head.")


def _rename_prefix(key: str, table: Mapping[str, str]) -> str:
    """``key`` with its longest dotted-component prefix found in ``table`` replaced."""
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        new = table.get(".".join(parts[:cut]))
        if new is not None:
            return ".".join([new, *parts[cut:]])
    return key


def to_libreyolo(family: str, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our ``state_dict`` of ``family`` under LibreYOLO 1.x's tensor names (same tensors)."""
    if family != "yolo9":
        return dict(state)
    return {_rename_prefix(k, YOLO9_LIBREYOLO_PREFIXES): v for k, v in state.items()}


def is_libreyolo_yolo9(state: Mapping[str, torch.Tensor]) -> bool:
    """True when ``state`` carries LibreYOLO 1.x's YOLOv9 names (``backbone.conv0`` ...)."""
    return "backbone.conv0.conv.weight" in state or any(k.startswith("head.cv3.") for k in state)


def to_ours(family: str, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A LibreYOLO-named (or already our-named) ``state_dict`` under our names.

    YOLOv9 tensors of LibreYOLO's PGI auxiliary branch (``aux.*``, ``aux_head.*``) are
    dropped: we build the detection path only (the caller logs it).
    """
    if family != "yolo9" or not is_libreyolo_yolo9(state):
        return dict(state)
    return {_rename_prefix(k, _LIBREYOLO_TO_OURS): v for k, v in state.items()
            if not k.startswith(LIBREYOLO_AUX_PREFIXES)}


_UPSTREAM_HEAD = re.compile(r"^\d+\.heads\.\d+\.(anchor_conv|class_conv)\.")


def is_upstream_yolo9(state: Mapping[str, torch.Tensor]) -> bool:
    """True for the upstream numbered layout (``22.heads.0.class_conv...``)."""
    return any(_UPSTREAM_HEAD.match(k) for k in state)


def _upstream_suffix(layer: int, parts: list[str]) -> list[str] | None:
    """Rename the components inside one upstream layer to ours (``None``: no tensor of ours)."""
    if layer == 22:  # heads.N.anchor_conv.* -> box.N.*, heads.N.class_conv.* -> cls.N.*
        if len(parts) < 3 or parts[0] != "heads" or parts[2] not in ("anchor_conv", "class_conv"):
            return None  # anc2vec: the fixed DFL projection, rebuilt by our head
        return ["box" if parts[2] == "anchor_conv" else "cls", parts[1], *parts[3:]]
    if layer in _ACONV_LAYERS:  # AConv: conv.* -> cv1.*
        return ["cv1", *parts[1:]] if parts[0] == "conv" else None
    out: list[str] = []
    for i, part in enumerate(parts):
        if part == "bottleneck":
            out.append("m")
        elif re.fullmatch(r"conv[1-5]", part):
            # inside a RepNCSP bottleneck (m.N.cv1.*) the RepConv keeps conv1 / conv2
            in_repconv = i >= 3 and out[i - 3] == "m" and out[i - 1] == "cv1"
            out.append(part if in_repconv else "cv" + part[4:])
        else:
            out.append(part)
    return out


def yolo9_from_upstream(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int]:
    """Rename an upstream YOLOv9 ``state_dict`` to our names.

    Returns:
        ``(state, aux)``: the detection-path tensors under our names and the number of
        PGI auxiliary-branch tensors (layers 23 and above) that were dropped.
    """
    out: dict[str, torch.Tensor] = {}
    aux = 0
    for key, value in state.items():
        head, _, rest = key.partition(".")
        if not head.isdigit():
            continue
        layer = int(head)
        if layer >= UPSTREAM_AUX_FIRST:
            aux += 1
            continue
        prefix = UPSTREAM_YOLO9_LAYERS.get(layer)
        suffix = _upstream_suffix(layer, rest.split(".")) if prefix else None
        if prefix and suffix is not None:
            out[".".join([prefix, *suffix])] = value
    return out, aux


def strip_wrappers(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop the prefixes that wrappers add to every key: DDP's ``module.``, torch.compile's
    ``_orig_mod.`` and a ``model.`` in front of numbered upstream layers."""
    out = dict(state)
    for prefix in ("module.", "_orig_mod.", "model."):
        if out and all(k.startswith(prefix) for k in out):
            if prefix == "model." and not all(k[6:7].isdigit() for k in out):
                continue
            out = {k[len(prefix):]: v for k, v in out.items()}
    return out
