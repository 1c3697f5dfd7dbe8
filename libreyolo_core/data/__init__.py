"""Data: dataset YAML, label scan, decoding, augmentation, dataset, loaders, sample set.

Contracts (see ``docs/architecture.md``, "Engine contracts / Data"):

- :func:`load_data_config` -> :class:`DataConfig` (errors: :class:`DataConfigError`);
- :func:`scan_images` / :func:`scan_split` -> :class:`ScanReport` (cached next to labels);
- :class:`YOLODataset` ``[i] -> (uint8 (3, S, S) RGB, float32 (n, 5) [cls, x1, y1, x2, y2]
  canvas pixels, meta)``;
- :func:`build_dataloader` / :func:`collate` -> :class:`Batch`;
- :func:`generate_sample_dataset` -> a synthetic dataset's ``data.yaml``.

The submodules that need torch (``dataset``, ``loader``) are imported lazily, so
``libreyolo_core.data.config`` and the scan (``scan``, ``labels``, ``image_checks``,
``scan_cache``, ``report``) stay usable without importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from libreyolo_core.data.config import (
    IMG_EXTENSIONS,
    DataConfig,
    DataConfigError,
    load_data_config,
)
from libreyolo_core.data.image import ImageDecodeError, load_image
from libreyolo_core.data.labels import label_path_for
from libreyolo_core.data.report import (
    DatasetError,
    DatasetWarning,
    ImageRecord,
    ScanReport,
    format_report,
)
from libreyolo_core.data.scan import scan_images, scan_split

_LAZY = {
    "YOLODataset": "libreyolo_core.data.dataset",
    "Batch": "libreyolo_core.data.loader",
    "build_dataloader": "libreyolo_core.data.loader",
    "collate": "libreyolo_core.data.loader",
    "generate_sample_dataset": "libreyolo_core.data.sample",
}

__all__ = [
    "IMG_EXTENSIONS",
    "DataConfig",
    "DataConfigError",
    "DatasetError",
    "DatasetWarning",
    "ImageDecodeError",
    "ImageRecord",
    "ScanReport",
    "format_report",
    "label_path_for",
    "load_data_config",
    "load_image",
    "scan_images",
    "scan_split",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'libreyolo_core.data' has no attribute {name!r}")
