"""The label scan's cache: ``<labels dir>.labels.cache`` next to the labels (or, with a
``cache_dir``, ``<cache_dir>/labels/<content key>.labels.cache``: a service keeps every
cache in a folder of its own and never writes into a dataset folder), an ``.npz``
of the report (shapes, boxes, counts, warnings), reused while no image or label file
changed size or mtime and the parsing rules (:data:`CACHE_VERSION`, ``nc``, the
coordinate tolerance) are the same. Never trusted blindly: a stale, foreign or corrupt
cache is ignored and the split scanned again.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import socket
import stat
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from libreyolo_core.data.labels import COORD_TOLERANCE
from libreyolo_core.data.report import DEFECT_KINDS, DatasetWarning, ImageRecord, ScanReport

__all__ = ["CACHE_VERSION", "cache_key", "cache_path", "load_cache", "save_cache",
           "writable_dir"]

logger = logging.getLogger(__name__)

#: Bumped whenever the cache layout or the parsing rules change.
CACHE_VERSION = 2


def writable_dir(path: Path) -> bool:
    """True when ``path`` is an existing folder we may write caches into.

    A folder without any write permission bit (e.g. a dataset shared read-only, mode
    ``r-xr-xr-x``) counts as read-only even for root, who could technically write to it.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISDIR(mode) and bool(mode & 0o222) and os.access(path, os.W_OK | os.X_OK)


def cache_path(label_files: list[Path], cache_dir: str | Path | None = None,
               key: str | None = None) -> Path:
    """Where the cache of a split with these label files lives:
    ``<their common folder>.labels.cache``; with ``cache_dir`` (and the split's
    :func:`cache_key`), ``<cache_dir>/labels/<key>.labels.cache``, keyed by the content
    (every image and label path, size and mtime) instead of by the dataset's folder."""
    if cache_dir is not None:
        if key is None:
            raise ValueError("cache_path: a cache_dir needs the split's cache key")
        folder = Path(cache_dir) / "labels"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"{key[:40]}.labels.cache"
    common = Path(os.path.commonpath([str(p.parent) for p in label_files]))
    return common.with_name(common.name + ".labels.cache")


def _stat(p: Path) -> tuple[int, int]:
    try:
        st = os.stat(p)
    except OSError:
        return (-1, -1)
    return (st.st_size, st.st_mtime_ns)


def cache_key(im_files: list[Path], label_files: list[Path], nc: int) -> str:
    """Hash of the parsing rules, nc, and every image/label path, size and mtime."""
    h = hashlib.sha256(f"v{CACHE_VERSION} nc={nc} tol={COORD_TOLERANCE}\n".encode())
    for im, lb in zip(im_files, label_files, strict=True):
        h.update(f"{im}\0{_stat(im)}\0{lb}\0{_stat(lb)}\n".encode())
    return h.hexdigest()


def save_cache(path: Path, key: str, report: ScanReport) -> None:
    """Write ``report`` under ``key`` (atomically); a read-only folder is left alone (one log
    line), another failure is one :class:`DatasetWarning`."""
    meta = {
        "version": CACHE_VERSION,
        "key": key,
        "n_images": report.n_images,
        "n_missing_labels": report.n_missing_labels,
        "defects": report.defects,
        "skipped": report.skipped,
        "messages": report.messages,
        "n_16bit": report.n_16bit,
        "dark_16bit": report.dark_16bit,
        "files": [str(r.im_file) for r in report.records],
    }
    labels = [r.labels for r in report.records]
    arrays: dict[str, Any] = {  # Any: savez also takes a bool keyword (allow_pickle)
        "meta": np.array(json.dumps(meta)),
        "shapes": np.array([r.shape for r in report.records], np.int64).reshape(-1, 2),
        "counts": np.array([len(x) for x in labels], np.int64),
        "labels": np.concatenate(labels, 0) if labels else np.zeros((0, 5), np.float32),
    }
    if not path.parent.is_dir():  # no label folder at all (all backgrounds): nothing to do
        return
    if not writable_dir(path.parent):
        logger.info("%s: folder is read-only; label scan not cached", path.parent)
        return
    # host and pid: ranks of a multi-node job may write it at once on a shared filesystem
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    try:
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        tmp.write_bytes(buf.getvalue())
        os.replace(tmp, path)
    except OSError as e:
        warnings.warn(
            f"{path}: cannot write label cache ({e.strerror or e}); continuing without it",
            DatasetWarning,
            stacklevel=3,
        )
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def load_cache(
    path: Path,
    key: str | None,
    names: dict[int, str],
    im_files: Iterable[Path],
    label_files: list[Path],
) -> ScanReport | None:
    """The cached report, or ``None`` when absent, stale or unreadable (never raises)."""
    if key is None or not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            if meta.get("version") != CACHE_VERSION or meta.get("key") != key:
                return None
            shapes, counts, labels = z["shapes"], z["counts"], z["labels"]
        label_of = dict(zip(map(str, im_files), label_files, strict=True))
        records = []
        offsets = np.concatenate([[0], np.cumsum(counts)])
        for i, f in enumerate(meta["files"]):
            records.append(
                ImageRecord(
                    im_file=Path(f),
                    label_file=label_of[f],
                    shape=(int(shapes[i, 0]), int(shapes[i, 1])),
                    labels=labels[offsets[i] : offsets[i + 1]].astype(np.float32),
                )
            )
        return ScanReport(
            records=records,
            names=dict(names),
            n_images=int(meta["n_images"]),
            n_missing_labels=int(meta["n_missing_labels"]),
            defects={k: int(meta["defects"].get(k, 0)) for k in DEFECT_KINDS},
            skipped=[(str(p), str(r)) for p, r in meta["skipped"]],
            messages=[str(m) for m in meta["messages"]],
            from_cache=True,
            n_16bit=int(meta.get("n_16bit", 0)),
            dark_16bit=[str(p) for p in meta.get("dark_16bit", [])],
        )
    except Exception as e:  # corrupt/foreign cache: rescan
        logger.info("ignoring unreadable label cache %s: %s", path, e)
        return None
