"""Read a torch file without running code from it.

``torch.load(weights_only=True)`` refuses any pickle global outside torch's allow-list.
Two widened cases, both explicit:

* numpy scalars and dtypes in metadata (LibreYOLO 1.x and other trainers write e.g. a
  ``numpy.float64`` fitness): allowed through ``torch.serialization.safe_globals`` scoped
  to this one load, then turned into Python numbers (:func:`plain`).
* everything else is refused. When the refusal names classes of a package (Ultralytics'
  ``DetectionModel``, ...), the message says whose file it is and why we will not open it:
  such files store the model as a pickled Python object, and unpickling it would run that
  package's code.
"""

from __future__ import annotations

import pickletools
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from libreyolo_core.weights.errors import CheckpointError

__all__ = ["read_torch_file", "plain", "pickled_globals"]


def _numpy_safe_globals() -> list[Any]:
    """The numpy objects a pickled numpy scalar needs: ``scalar`` and the dtype classes."""
    core = getattr(np, "_core", None) or np.core  # numpy 2 renamed numpy.core
    dtypes = [type(np.dtype(t)) for t in ("float16", "float32", "float64", "int8", "int16", "int32",
                                           "int64", "uint8", "bool")]
    return [core.multiarray.scalar, np.dtype, *dtypes]


def pickled_globals(path: Path) -> list[str]:
    """The ``module.name`` globals a torch file's pickle refers to, read with
    :mod:`pickletools` (which decodes opcodes and executes nothing): the ``data.pkl`` of a
    torch zip file, or the file itself for a legacy (non-zip) pickle."""
    try:
        with zipfile.ZipFile(path) as zf:
            name = next((n for n in zf.namelist() if n.endswith("data.pkl")), None)
            data = zf.read(name) if name is not None else b""
    except zipfile.BadZipFile:
        data = path.read_bytes()[: 64 << 20]
    except OSError:
        return []
    found: list[str] = []
    strings: list[str] = []
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
                strings.append(str(arg))
            elif op.name == "GLOBAL":
                found.append(str(arg).replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.append(f"{strings[-2]}.{strings[-1]}")
    except Exception:  # noqa: BLE001 - not a pickle, or a damaged one: report what was read
        pass
    return sorted(set(found))


_ALLOWED = ("torch.", "numpy.", "collections.OrderedDict", "_codecs.encode")


#: torch globals that are code, not tensors: a pickled nn.Module (``torch.save(model)``)
_CODE = ("torch.nn.modules.", "torch.nn.parallel.", "torch.optim.", "torch.jit.")


def _reason(exc: Exception) -> str:
    """The first sentence of an unpickling error, whole (torch's run to a page and suggest
    ``weights_only=False``, which we never do)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    for stop in (" Weights only load failed", " Re-running", " In PyTorch 2.6", " (Could this"):
        text = text.split(stop, 1)[0]
    text = text.split(". ", 1)[0].rstrip(". ")
    if "weights_only" in text:
        text = "the file needs more than tensors and plain values to load"
    if len(text) > 300:
        text = text[:300].rsplit(" ", 1)[0] + " ..."
    return text


def _refusal(path: Path, exc: Exception) -> CheckpointError:
    foreign = [g for g in pickled_globals(path) if not g.startswith(_ALLOWED) or g.startswith(_CODE)]
    # what torch's weights-only unpickler itself refused (an allowed prefix, a class of it)
    foreign += [g for g in re.findall(r"Unsupported global: GLOBAL ([\w.]+)", str(exc))
                if g not in foreign]
    if any(g.startswith("ultralytics.") for g in foreign):
        return CheckpointError(
            f"{path}: an Ultralytics checkpoint, which cannot be loaded safely: it stores the model "
            f"as a pickled Python object ({', '.join(foreign[:3])}), and opening it would run "
            "Ultralytics code, which we never do. Export its weights as a plain state_dict "
            "(torch.save(model.state_dict(), ...)) in a trusted environment, or start from a "
            "LibreYOLO / upstream YOLOv9 / Megvii YOLOX file")
    if foreign:
        return CheckpointError(
            f"{path}: cannot be loaded safely: it needs code to unpickle ({', '.join(foreign[:5])}); "
            "weights files are read with torch.load(weights_only=True): tensors and plain values "
            "only. If you made this file and trust it, save its weights instead: "
            "torch.save(model.state_dict(), path)")
    return CheckpointError(f"{path}: not a readable torch weights file, truncated or damaged "
                           f"({type(exc).__name__}: {_reason(exc)})")


def read_torch_file(path: str | Path) -> Any:
    """``torch.load(path, map_location="cpu", weights_only=True)``, numpy scalars allowed.

    Raises:
        CheckpointError: missing file, not a torch file, truncated, or a pickle that needs
            code (named, with Ultralytics files recognised and explained).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        with torch.serialization.safe_globals(_numpy_safe_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - every unpickling failure is a bad file
        raise _refusal(path, exc) from exc


def plain(value: Any) -> Any:
    """``value`` with numpy scalars and arrays turned into Python numbers and lists,
    recursively through dicts, lists and tuples (tensors are left as they are)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(plain(v) for v in value)
    return value
