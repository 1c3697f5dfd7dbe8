"""Shared helpers of the data tests (a uniquely named module, importable from the tests
because pytest puts this folder on ``sys.path``)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from PIL import Image


def write_image(path: Path, h: int = 48, w: int = 64, colour=(90, 120, 150), fmt=None) -> Path:
    """Write a solid-colour RGB image (format from the suffix unless ``fmt``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.empty((h, w, 3), np.uint8)
    arr[:] = colour
    Image.fromarray(arr).save(path, format=fmt)
    return path


def make_yolo_dataset(
    root: Path,
    labels: Mapping[str, str | None],
    names: list[str] | None = None,
    split: str = "train",
    size: tuple[int, int] = (48, 64),
) -> Path:
    """Create ``root/images/<split>/<stem>.png`` (+ ``labels/<split>/<stem>.txt`` unless the
    label text is ``None``) for every ``stem -> label text`` and a ``data.yaml``; return it."""
    names = names or ["a", "b", "c"]
    for stem, text in labels.items():
        write_image(root / "images" / split / f"{stem}.png", *size)
        if text is not None:
            lp = root / "labels" / split / f"{stem}.txt"
            lp.parent.mkdir(parents=True, exist_ok=True)
            lp.write_text(text, encoding="utf-8")
    yaml_path = root / "data.yaml"
    yaml_path.write_text(f"path: .\n{split}: images/{split}\nnames: {names!r}\n", encoding="utf-8")
    return yaml_path


def writable_copy(src: Path, dst: Path) -> Path:
    """Copy a folder tree and make the copy user-writable (the shared datasets are
    read-only and ``copytree`` keeps their modes)."""
    shutil.copytree(src, dst)
    for dirpath, _, filenames in os.walk(dst):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)
    return dst
