"""Registered weights files: one folder, ``<model_root>/<model id>.pt`` (and the ONNX
export ``<model id>.onnx`` with its ``.onnx.json`` once made), and the child
process that reads a file without importing torch into the API process.

Uploads are streamed to ``<model_root>/incoming/<model id>.part`` first; a file that the
inspector accepts is moved to its final name, anything else is deleted.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ModelStore", "WeightsRejected", "inspect_in_child"]

#: exit code of ``python -m libreyolo_core.weights inspect`` for a file it refuses.
REFUSED_EXIT = 4


class WeightsRejected(ValueError):
    """The weights file cannot be registered; ``str(exc)`` says why (for a 422 detail)."""


@dataclass(frozen=True)
class ModelStore:
    """Weights files under ``root``: ``<root>/<id>.pt`` and ``<root>/incoming/`` for uploads."""

    root: Path

    def path(self, model_id: str) -> Path:
        """Final place of a model's file (``<root>/<id>.pt``)."""
        return self.root / f"{model_id}.pt"

    def onnx_path(self, model_id: str) -> Path:
        """Final place of a model's ONNX export (``<root>/<id>.onnx``; its record beside it,
        ``<root>/<id>.onnx.json``)."""
        return self.root / f"{model_id}.onnx"

    def incoming(self, model_id: str) -> Path:
        """Where an upload is streamed before it is checked (folder created)."""
        folder = self.root / "incoming"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"{model_id}.part"

    def owns(self, path: str | Path) -> bool:
        """True when ``path`` is a model file of this store (a direct child named ``*.pt``)."""
        p = Path(path)
        return p.parent == self.root and p.suffix == ".pt"


def inspect_in_child(path: Path, *, python: str, timeout_s: float) -> dict[str, Any]:
    """Describe a weights file with ``python -m libreyolo_core.weights inspect PATH`` in a
    child process (the engine loads it with ``torch.load(weights_only=True)``).

    Returns:
        The inspector's JSON: ``family``, ``size``, ``nc``, ``names`` (``{"0": name}``),
        ``params``, ``format``, ``imgsz``, ``sha256``, ``bytes``.

    Raises:
        WeightsRejected: the inspector refused the file (its reason), ran past
            ``timeout_s`` seconds (killed), or failed in any other way (exit code and the
            last line of its output).
    """
    import libreyolo_core

    _check_magic(path)
    env = dict(os.environ)
    root = str(Path(libreyolo_core.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    try:
        proc = subprocess.run([python, "-m", "libreyolo_core.weights", "inspect", str(path)],
                              capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        raise WeightsRejected(f"reading the file took longer than {timeout_s:g} s") from None
    except OSError as exc:
        raise WeightsRejected(f"the weights inspector could not start: {exc}") from None
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    try:
        out = json.loads(last) if last else None
    except ValueError:
        out = None
    if proc.returncode == 0 and isinstance(out, dict) and "family" in out:
        return out
    if proc.returncode == REFUSED_EXIT and isinstance(out, dict) and out.get("error"):
        raise WeightsRejected(_reason(str(out["error"]), path))
    tail = (proc.stderr.strip().splitlines() or [last or "no output"])[-1]
    raise WeightsRejected(f"the weights inspector failed (exit {proc.returncode}): "
                          f"{_reason(tail, path)}")


#: a torch file begins as a zip archive (``torch.save`` since 1.6) or as a pickle (the
#: legacy format, protocol 2 and up: opcode PROTO = 0x80).
_TORCH_MAGIC = (b"PK\x03\x04", b"\x80")


def _check_magic(path: Path) -> None:
    """Refuse, without starting a child, a file that cannot be a torch file at all.

    Raises:
        WeightsRejected: the first bytes are neither a zip header nor a pickle header.
    """
    with path.open("rb") as fh:
        head = fh.read(4)
    if not head.startswith(_TORCH_MAGIC):
        raise WeightsRejected("not a torch file: it is neither a zip archive (torch.save) nor "
                              "a pickle (the legacy format)")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_REFUSED_GLOBAL = re.compile(r"(?:WeightsUnpickler error: )?(?P<why>[^\n]*GLOBAL[^\n]*?)"
                             r"(?: Please use.*)?$", re.M)


def _reason(message: str, path: Path) -> str:
    """The inspector's message for a client: no server-side temp path, no terminal colour
    codes, and of torch's long ``weights_only`` text only the line that names what was
    refused (e.g. ``Trying to load unsupported GLOBAL posix.system ...``)."""
    text = _ANSI.sub("", message).replace(str(path) + ": ", "").replace(str(path), "the file")
    if "Weights only load failed" in text:
        m = _REFUSED_GLOBAL.search(text)
        head = text.split("(", 1)[0].strip()
        why = (m["why"].replace("WeightsUnpickler error:", "").strip() if m
               else "it holds more than tensors and containers")
        text = f"{head}: the pickle needs code, which is never run ({why})"
    return " ".join(text.split())
