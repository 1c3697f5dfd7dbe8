"""Shared fixtures: the synthetic sample dataset and a writable copy of coco128."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
COCO128 = Path(os.environ.get("COCO128", REPO.parent / "shared" / "datasets" / "coco128"))


@pytest.fixture(scope="session")
def sample_yaml(tmp_path_factory) -> Path:
    """A small synthetic dataset (shapes on textures), generated once per session."""
    from libreyolo_core.data.sample import generate_sample_dataset

    return generate_sample_dataset(tmp_path_factory.mktemp("sample"), n_train=16, n_val=8, imgsz=160, seed=0)


@pytest.fixture(scope="session")
def coco128_dir(tmp_path_factory) -> Path:
    """A writable copy of coco128 (the shared copy is read-only)."""
    if not (COCO128 / "coco128.yaml").is_file():
        pytest.skip(f"coco128 not found at {COCO128}")
    dst = tmp_path_factory.mktemp("coco") / "coco128"
    shutil.copytree(COCO128, dst)
    return dst
