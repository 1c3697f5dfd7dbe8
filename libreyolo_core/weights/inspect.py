"""What a weights file holds: family, size, classes, parameter count, sha256.

The file is read with ``torch.load(weights_only=True)``: a pickle that needs code is refused,
never run. A zip file (``torch.save``) whose members fail their CRC-32 (a corrupted copy:
torch's reader does not check them) is refused, and so is a model with a NaN or infinite
value in any tensor.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["WeightsInfo", "inspect_weights"]


@dataclass(frozen=True)
class WeightsInfo:
    """Description of a loadable weights file.

    Attributes:
        family: registered family key (``yolo9``, ``yolox``).
        size: size letter (``t``, ``s``, ...).
        nc: number of classes of the detection head.
        names: class names ``{id: name}`` (``{i: str(i)}`` when the file has none).
        params: number of parameters of the model the file builds.
        format: the file's layout: ``libreyolo`` (ours or LibreYOLO 1.x, with metadata),
            ``yolov9-upstream`` (MultimediaTechLab/YOLO release), ``yolox-megvii`` (Megvii's
            ``{"model": ...}``) or ``state-dict`` (a bare state dict with LibreYOLO's names).
        imgsz: the training image size stored in the file, or ``None``.
        sha256: hex digest of the file's bytes.
        bytes: file size in bytes.
    """

    family: str
    size: str
    nc: int
    names: dict[int, str]
    params: int
    format: str
    imgsz: int | None
    sha256: str
    bytes: int

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (class ids as strings, as JSON object keys must be)."""
        out = asdict(self)
        out["names"] = {str(k): v for k, v in self.names.items()}
        return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def inspect_weights(path: str | Path) -> WeightsInfo:
    """Load ``path`` safely and describe the model it holds.

    Raises:
        CheckpointError: missing, unreadable, unsafe (needs code to unpickle; Ultralytics
            files are named as such), a zip member failing its CRC, a NaN or infinite
            value, a family or size we do not have, or tensors that fit none of our
            models; the message says which.
    """
    import zipfile

    import torch

    from libreyolo_core.weights.errors import CheckpointError
    from libreyolo_core.weights.load import load_weights

    path = Path(path)
    if path.is_file() and zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as zf:
                bad = zf.testzip()
        except (zipfile.BadZipFile, NotImplementedError, RuntimeError, OSError) as exc:
            raise CheckpointError(f"{path}: the zip archive is damaged ({exc})") from None
        if bad is not None:
            raise CheckpointError(f"{path}: member {bad!r} fails its CRC-32 check: the file is "
                                  "corrupted (copy it again)")
    weights = load_weights(path)
    for key, t in weights.state.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{path}: tensor {key!r} holds NaN or infinite values; "
                                  "a model must have finite weights")
    params = sum(int(t.numel()) for k, t in weights.state.items()
                 if not k.endswith(("running_mean", "running_var", "num_batches_tracked")))
    return WeightsInfo(
        family=weights.family, size=weights.size, nc=weights.nc, names=dict(weights.names), params=params,
        format=weights.format, imgsz=weights.imgsz, sha256=_sha256(path), bytes=path.stat().st_size,
    )
