"""Shared helpers of the benchmarks: locate coco128 and copy it somewhere writable."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def coco128_copy() -> Path:
    """Copy coco128 (``$COCO128`` or ``../shared/datasets/coco128``) to a temp dir; returns its yaml.

    The source stays read-only: the scan writes its label cache into the copy.
    """
    src = Path(os.environ.get("COCO128", HERE.parent.parent / "shared" / "datasets" / "coco128"))
    if not (src / "coco128.yaml").is_file():
        raise SystemExit(f"coco128 not found at {src} (set COCO128=path/to/coco128)")
    dst = Path(tempfile.mkdtemp(prefix="bench-coco128-")) / "coco128"
    shutil.copytree(src, dst)
    return dst / "coco128.yaml"
