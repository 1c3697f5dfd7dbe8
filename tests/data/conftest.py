"""Helpers for the data tests: tiny on-disk YOLO datasets and a private coco128 copy."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from data_helpers import make_yolo_dataset, writable_copy

#: ``$COCO128``, else ``shared/datasets/coco128`` beside the checkout (as tests/conftest.py)
COCO128 = Path(os.environ.get("COCO128", Path(__file__).resolve().parents[3] / "shared" / "datasets"
                              / "coco128"))


@pytest.fixture
def yolo_dataset(tmp_path: Path) -> Callable[..., Path]:
    """``yolo_dataset({stem: label_text_or_None}, names=..., split=...) -> data.yaml``."""

    def make(labels: Mapping[str, str | None], **kw) -> Path:
        return make_yolo_dataset(tmp_path / "ds", labels, **kw)

    return make


@pytest.fixture(scope="session")
def coco128_ro() -> Path:
    """The shared coco128 folder (read-only: never write into it)."""
    if not (COCO128 / "coco128.yaml").is_file():
        pytest.skip(f"coco128 not available at {COCO128} (set COCO128=path/to/coco128)")
    return COCO128


@pytest.fixture
def coco128(coco128_ro: Path, tmp_path: Path) -> Path:
    """A private, writable copy of coco128; returns its yaml path."""
    return writable_copy(coco128_ro, tmp_path / "coco128") / "coco128.yaml"
