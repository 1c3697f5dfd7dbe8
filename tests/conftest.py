"""Shared fixtures: the synthetic sample dataset and a writable copy of coco128."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
COCO128 = Path(os.environ.get("COCO128", REPO.parent / "shared" / "datasets" / "coco128"))
#: the test-only reference ``libreyolo==1.6.0``, installed by ``make setup`` beside the venv
#: (``pip install --target``) so that its ``libreyolo`` command never replaces ours.
REFERENCE = Path(os.environ.get("LIBREYOLO_REFERENCE", REPO / ".venv" / "reference"))


def pytest_configure(config) -> None:
    """Make the reference library importable by the equivalence tests (appended last, so
    nothing of ours is ever shadowed by it)."""
    if REFERENCE.is_dir() and str(REFERENCE) not in sys.path:
        sys.path.append(str(REFERENCE))


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
