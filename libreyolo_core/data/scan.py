"""One pass over a split's images and YOLO label files: ``scan_images(files, names)``.

Every image header is read (Pillow, in a thread pool) and every label file parsed; each
defect is fixed or dropped, warned about with the file and line, and counted. The result
(:class:`ScanReport`) is cached next to the labels as ``<labels dir>.labels.cache`` and
reused while no image/label file changed size or mtime.

Label rows (YOLO detect format, LibreYOLO/Ultralytics): ``cls cx cy w h`` normalised to
the displayed (EXIF-rotated) image size. Rows with an odd number > 5 of fields are
polygons ``cls x1 y1 ... xn yn`` (segmentation labels) and become their bounding box.

Defect treatment (kind: what happens):

==================  ==============================================================
``malformed``       wrong column count -> line dropped
``non_numeric``     a value is not a finite number -> line dropped
``bad_class``       class id not an integer or outside ``names`` -> line dropped
``clipped``         a corner outside [0, 1] by more than 1e-5 (label rounding) -> clipped
                    (xyxy) to the image and kept; each row named by file:line
``out_of_bounds``   the box lies wholly outside the image -> line dropped
``oversize``        width or height > 1 (more than the whole image) -> line dropped
``zero_area``       width or height <= 0 -> line dropped
``duplicate``       exact duplicate of an earlier line (same values) -> dropped
``polygon``         polygon row -> converted to its bounding box (a fix, kept)
``repaired_image``  damaged but decodable (a truncated JPEG/PNG) -> decoded with Pillow's
                    ``LOAD_TRUNCATED_IMAGES`` (the missing part grey, as OpenCV does) and used
``shared_label``    two images map to one label file (``x.jpg`` + ``x.JPG``/``x.png``) ->
                    both kept with that file's boxes, warned naming both
``label_elsewhere`` no label file where the ``images/ -> labels/`` rule looks, but a
                    ``<stem>.txt`` beside the image or in a sibling ``labels/`` folder ->
                    the image stays a background, warned naming both paths
``unreadable_image`` zero-byte / undecodable image -> image skipped
``unreadable_label`` label file unreadable (I/O or not UTF-8 text) -> image skipped
==================  ==============================================================

A missing or empty label file makes a *background* image (no boxes), without a warning,
unless a label file for it exists elsewhere (``label_elsewhere``) or no image of the split
has a label file at all (one warning stating the rule). Summaries count the rows that were
clipped (kept) apart from the rows that were dropped (:attr:`ScanReport.rows_clipped`,
:attr:`ScanReport.rows_dropped`). 16-bit images are converted to 8 bits by ``value / 257``
(one log line with their count); a converted image whose brightest pixel is below
:data:`DARK_16BIT_MAX` is warned about by name (its data likely uses only the low byte).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import stat
import warnings
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from libreyolo_core.data.config import DataConfig, is_image_file
from libreyolo_core.data.image import allow_truncated, exif_size, to_rgb_array

__all__ = [
    "CACHE_VERSION",
    "DEFECT_KINDS",
    "DatasetError",
    "DatasetWarning",
    "ImageRecord",
    "LabelIssue",
    "ScanReport",
    "format_report",
    "label_path_for",
    "parse_label_text",
    "scan_images",
    "scan_split",
    "writable_dir",
]

logger = logging.getLogger(__name__)

#: Bumped whenever the cache layout or the parsing rules change.
CACHE_VERSION = 2
#: Rounding slack for coordinates just outside [0, 1] (labels written with 5-6 decimals,
#: e.g. coco128's 1.0000005): snapped to the edge silently. Beyond it a row is ``clipped``.
COORD_TOLERANCE = 1e-5
#: A 16-bit image whose converted 8-bit maximum is below this is warned about as near-black.
DARK_16BIT_MAX = 16
#: Per-kind cap on individual warnings in one scan; the rest are only counted.
MAX_WARNINGS_PER_KIND = 20

#: Defect kind -> human description (also the display order of reports).
DEFECT_KINDS: dict[str, str] = {
    "malformed": "wrong column count (line dropped)",
    "non_numeric": "non-numeric or non-finite value (line dropped)",
    "bad_class": "class id not an integer or outside names (line dropped)",
    "out_of_bounds": "box wholly outside the image (line dropped)",
    "oversize": "width or height > 1 (line dropped)",
    "zero_area": "zero-area box (line dropped)",
    "duplicate": "exact duplicate line (dropped)",
    "clipped": "coordinates outside [0, 1] (box clipped to the image, kept)",
    "polygon": "polygon converted to its bounding box",
    "repaired_image": "truncated but decodable image (missing part grey; used)",
    "shared_label": "several images share one label file (all kept)",
    "label_elsewhere": "label file not where images/ -> labels/ looks (image is a background)",
    "unreadable_image": "unreadable or zero-byte image (image skipped)",
    "unreadable_label": "unreadable label file (image skipped)",
}
#: Defect kinds that drop a label row (the rest fix, keep or skip whole images).
ROW_DROPPED_KINDS = ("malformed", "non_numeric", "bad_class", "out_of_bounds", "oversize",
                     "zero_area", "duplicate")


class DatasetError(ValueError):
    """A split cannot be used at all (e.g. no usable images). Names the split/yaml."""


class DatasetWarning(UserWarning):
    """A data defect that was fixed or skipped; the message starts with ``file:line``."""


@dataclass(frozen=True, eq=False)
class ImageRecord:
    """One usable image.

    Attributes:
        im_file: image path.
        label_file: its label path (may not exist: background image).
        shape: ``(h, w)`` in pixels as displayed (EXIF orientation applied).
        labels: float32 ``(n, 5)`` rows ``[cls, cx, cy, w, h]`` normalised to ``shape``,
            after every fix; ``n == 0`` for a background image.
    """

    im_file: Path
    label_file: Path
    shape: tuple[int, int]
    labels: np.ndarray


@dataclass
class ScanReport:
    """Result of :func:`scan_images`.

    Attributes:
        records: usable images, in input order.
        names: class id -> name.
        n_images: image files given.
        n_missing_labels: usable images without a label file (a subset of backgrounds).
        defects: defect kind (see :data:`DEFECT_KINDS`) -> count (all kinds present).
        skipped: ``(image path, reason)`` of skipped images.
        orphan_labels: label files in the scanned label folders with no image beside them.
        messages: the individual warnings emitted (capped per kind).
        cache_path: where the cache lives (or would live); ``None`` when caching is off.
        from_cache: True when this report was loaded from the cache.
        source: description of the split (e.g. ``"/d/coco.yaml: split 'train'"``).
        n_16bit: usable 16-bit images (converted to 8 bits by ``value / 257``).
        dark_16bit: those of them whose converted maximum is below :data:`DARK_16BIT_MAX`.
    """

    records: list[ImageRecord]
    names: dict[int, str]
    n_images: int
    n_missing_labels: int
    defects: dict[str, int]
    skipped: list[tuple[str, str]] = field(default_factory=list)
    orphan_labels: list[Path] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    cache_path: Path | None = None
    from_cache: bool = False
    source: str | None = None
    n_16bit: int = 0
    dark_16bit: list[str] = field(default_factory=list)

    @property
    def rows_clipped(self) -> int:
        """Label rows clipped to the image and kept."""
        return self.defects.get("clipped", 0)

    @property
    def rows_dropped(self) -> int:
        """Label rows dropped (malformed, non-numeric, bad class, outside, oversize,
        zero-area, duplicate)."""
        return sum(self.defects.get(k, 0) for k in ROW_DROPPED_KINDS)

    @property
    def n_usable(self) -> int:
        """Images that can be trained on (``n_images`` minus skipped ones)."""
        return len(self.records)

    @property
    def n_backgrounds(self) -> int:
        """Usable images with no boxes (missing/empty label file, or every line dropped)."""
        return sum(1 for r in self.records if len(r.labels) == 0)

    @property
    def n_boxes(self) -> int:
        """Boxes over all usable images, after fixes."""
        return sum(len(r.labels) for r in self.records)

    @property
    def class_counts(self) -> dict[int, int]:
        """Class id -> number of boxes, for classes with at least one box (sorted by id)."""
        if not self.records:
            return {}
        cls = np.concatenate([r.labels[:, 0] for r in self.records]).astype(np.int64)
        ids, counts = np.unique(cls, return_counts=True)
        return {int(i): int(c) for i, c in zip(ids, counts, strict=True)}

    @property
    def classes_present(self) -> list[int]:
        """Sorted class ids that have at least one box."""
        return list(self.class_counts)

    @property
    def n_defects(self) -> int:
        """Sum of all defect counts."""
        return sum(self.defects.values())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (no per-image labels)."""
        return {
            "source": self.source,
            "images": self.n_images,
            "usable": self.n_usable,
            "backgrounds": self.n_backgrounds,
            "missing_labels": self.n_missing_labels,
            "boxes": self.n_boxes,
            "classes_named": len(self.names),
            "classes_present": len(self.classes_present),
            "class_counts": {self.names.get(k, str(k)): v for k, v in self.class_counts.items()},
            "defects": dict(self.defects),
            "rows_clipped": self.rows_clipped,
            "rows_dropped": self.rows_dropped,
            "images_16bit": self.n_16bit,
            "dark_16bit": list(self.dark_16bit),
            "skipped": [{"image": p, "reason": r} for p, r in self.skipped],
            "orphan_labels": [str(p) for p in self.orphan_labels],
            "cache": str(self.cache_path) if self.cache_path else None,
            "from_cache": self.from_cache,
        }


def label_path_for(im_file: str | Path) -> Path:
    """Label file of an image: the LAST ``images`` path segment becomes ``labels`` and the
    extension ``.txt`` (``/d/images/train/a.jpg -> /d/labels/train/a.txt``). Without an
    ``images`` segment the label sits next to the image."""
    p = Path(im_file)
    parts = list(p.parts)
    for i in range(len(parts) - 2, -1, -1):  # directories only, never the file name
        if parts[i] == "images":
            parts[i] = "labels"
            break
    return Path(*parts).with_suffix(".txt")


# --------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class LabelIssue:
    """One defect: ``kind`` (a key of :data:`DEFECT_KINDS`) and its message, which starts
    with ``"<file>:<line>: "`` (``"<file>: "`` for whole-file problems)."""

    kind: str
    message: str


def parse_label_text(
    text: str, nc: int, where: str = "<labels>"
) -> tuple[np.ndarray, list[LabelIssue]]:
    """Parse the text of one YOLO label file, fixing or dropping defective lines.

    Args:
        text: file content.
        nc: number of classes; ids must be integers in ``[0, nc)``.
        where: file name used in messages (``"<where>:<line>: ..."``).

    Returns:
        ``(labels, issues)``: float32 ``(n, 5)`` rows ``[cls, cx, cy, w, h]`` normalised,
        and one issue (kind, message) per defect found (see module docstring).
    """
    rows: list[tuple[float, float, float, float, float]] = []
    issues: list[LabelIssue] = []
    seen: set[tuple[float, ...]] = set()

    def issue(kind: str, lineno: int, msg: str) -> None:
        issues.append(LabelIssue(kind, f"{where}:{lineno}: {msg}"))

    for lineno, line in enumerate(text.splitlines(), 1):
        tokens = line.split()
        n = len(tokens)
        if n == 0:
            continue
        is_polygon = n > 5 and n % 2 == 1
        if n != 5 and not is_polygon:
            issue(
                "malformed",
                lineno,
                f"{n} values; expected 5 (cls cx cy w h) or a polygon "
                "(cls x1 y1 ... xn yn, n >= 3); line dropped",
            )
            continue
        try:
            vals = tuple(float(t) for t in tokens)
        except ValueError:
            bad = next(t for t in tokens if not _is_float(t))
            issue("non_numeric", lineno, f"non-numeric value {bad!r}; line dropped")
            continue
        if not all(math.isfinite(v) for v in vals):
            issue("non_numeric", lineno, "non-finite value (nan/inf); line dropped")
            continue
        c = vals[0]
        if not c.is_integer():
            issue("bad_class", lineno, f"class id {tokens[0]!r} is not an integer; line dropped")
            continue
        if not 0 <= c < nc:
            issue(
                "bad_class",
                lineno,
                f"class id {int(c)} outside names (0..{nc - 1}); line dropped",
            )
            continue
        if vals in seen:
            issue("duplicate", lineno, "duplicate of an earlier line; dropped")
            continue
        seen.add(vals)
        if is_polygon:
            xs, ys = vals[1::2], vals[2::2]
            x1, y1, x2, y2 = min(xs), min(ys), max(xs), max(ys)
            issue("polygon", lineno, f"polygon ({len(xs)} points) converted to its bounding box")
        else:
            _, cx, cy, w, h = vals
            if w <= 0 or h <= 0:
                issue("zero_area", lineno, f"box width/height {w:g}x{h:g} <= 0; line dropped")
                continue
            if w > 1 + COORD_TOLERANCE or h > 1 + COORD_TOLERANCE:
                issue("oversize", lineno, f"box width/height {w:g}x{h:g}: more than the whole image "
                      "(normalised values are at most 1); line dropped")
                continue
            x1, y1, x2, y2 = cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2
        tol = COORD_TOLERANCE
        x1r, y1r, x2r, y2r = x1, y1, x2, y2
        outside = x1 < -tol or y1 < -tol or x2 > 1 + tol or y2 > 1 + tol
        x1, y1, x2, y2 = (min(max(v, 0.0), 1.0) for v in (x1, y1, x2, y2))
        if x2 - x1 <= 0 or y2 - y1 <= 0:
            if outside:
                issue("out_of_bounds", lineno, "box lies outside the image; line dropped")
            else:
                issue("zero_area", lineno, "zero-area box; line dropped")
            continue
        if outside:
            issue("clipped", lineno, f"box x {_span(x1r, x2r)} y {_span(y1r, y2r)} outside [0, 1]; "
                  "clipped to the image and kept")
        rows.append((c, (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1))
    labels = np.array(rows, dtype=np.float32).reshape(-1, 5)
    return labels, issues


def _span(a: float, b: float) -> str:
    return f"{a:.6g}..{b:.6g}"


def _is_float(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------- per image


@dataclass
class _Result:
    im_file: Path
    label_file: Path
    shape: tuple[int, int] | None = None
    labels: np.ndarray | None = None
    label_missing: bool = False
    issues: list[LabelIssue] = field(default_factory=list)
    skip_reason: str | None = None
    damage: str | None = None  # why a tolerant decode is needed (set by the header read)
    bits16: bool = False
    dark16: int | None = None  # converted 8-bit maximum of a near-black 16-bit image


def _read_image_header(im_file: Path, res: _Result) -> tuple[int, int]:
    """Displayed ``(h, w)`` of an image; notes damage (truncated / failed checks) and
    16-bit conversion on ``res``. Raises ``ValueError`` (or an ``OSError``) when the file
    cannot even be opened (zero-byte, unknown format)."""
    if os.path.getsize(im_file) == 0:
        raise ValueError("zero-byte file")
    with Image.open(im_file) as im:
        fmt = im.format
        w, h = exif_size(im)
        mode = im.mode
    if w < 1 or h < 1:
        raise ValueError(f"invalid size {w}x{h}")
    try:
        with Image.open(im_file) as im:
            im.verify()  # structure / CRC checks without a full decode
    except Exception as e:  # noqa: BLE001 - any check failure: try a tolerant decode later
        res.damage = str(e) or type(e).__name__
    if fmt == "JPEG" and res.damage is None:
        with open(im_file, "rb") as f:
            f.seek(-min(64, os.path.getsize(im_file)), os.SEEK_END)
            tail = f.read()
        if not tail.rstrip(b"\x00\r\n ").endswith(b"\xff\xd9"):
            res.damage = "truncated JPEG (no end-of-image marker)"
    if res.damage is None and (mode.startswith("I;16") or mode == "I"):
        _check_16bit(im_file, res)
    return h, w


def _check_16bit(im_file: Path, res: _Result) -> None:
    """Decode a 16/32-bit integer image: flag it when :func:`to_rgb_array` scales it by
    1/257, and note a near-black result (all data in the low byte)."""
    with Image.open(im_file) as im:
        im.load()
        raw = np.asarray(im)
        mode = im.mode
        if mode == "I" and int(raw.max(initial=0)) <= 255:
            return  # 8-bit values in a 32-bit container: copied as is
        res.bits16 = True
        top = int(to_rgb_array(im).max(initial=0))
    if top < DARK_16BIT_MAX:
        res.dark16 = top


def _scan_one(im_file: Path, label_file: Path, nc: int) -> _Result:
    res = _Result(im_file, label_file)
    try:
        res.shape = _read_image_header(im_file, res)
    except Exception as e:  # any decoder error means: skip this image
        reason = str(e) or type(e).__name__
        res.skip_reason = reason
        res.issues.append(LabelIssue("unreadable_image", f"{im_file}: {reason}; image skipped"))
        return res
    try:
        text = label_file.read_text(encoding="utf-8-sig")  # tolerate a UTF-8 BOM
    except FileNotFoundError:
        res.label_missing = True
        res.labels = np.zeros((0, 5), np.float32)
        elsewhere = _label_elsewhere(im_file, label_file)
        if elsewhere is not None:
            res.issues.append(LabelIssue(
                "label_elsewhere",
                f"{im_file}: no label file at {label_file} (the images/ -> labels/ rule), but "
                f"{elsewhere} exists; the image is used as a background. Move the labels to "
                "the rule's place (or put the images under an 'images' folder)"))
        return res
    except (OSError, UnicodeDecodeError) as e:
        res.skip_reason = f"unreadable label file {label_file}: {e}"
        res.issues.append(
            LabelIssue("unreadable_label", f"{label_file}: cannot read ({e}); image skipped")
        )
        return res
    res.labels, res.issues = parse_label_text(text, nc, str(label_file))
    return res


def _label_elsewhere(im_file: Path, label_file: Path) -> Path | None:
    """A ``<stem>.txt`` for this image outside the rule's place: beside the image, or in a
    ``labels`` folder beside the image's folder (``d/imgs/a.jpg`` -> ``d/labels/a.txt``)."""
    stem = im_file.stem + ".txt"
    for cand in (im_file.parent / stem, im_file.parent.parent / "labels" / stem,
                 im_file.parent.parent / "labels" / im_file.parent.name / stem):
        if cand != label_file and cand.is_file():
            return cand
    return None


def _repair(res: _Result) -> None:
    """Decode a damaged image tolerating truncation (serially: the Pillow flag is global);
    a success keeps the image with a ``repaired_image`` warning, a failure skips it."""
    try:
        with allow_truncated(), Image.open(res.im_file) as im:
            im.load()
        res.issues.insert(0, LabelIssue(
            "repaired_image", f"{res.im_file}: {res.damage}; decoded with the missing part grey "
            "and used (re-save the file to silence this)"))
    except Exception as e:  # noqa: BLE001 - undecodable even when tolerant
        reason = f"{res.damage}; not decodable ({e})"
        res.skip_reason = reason
        res.issues = [LabelIssue("unreadable_image", f"{res.im_file}: {reason}; image skipped")]


# --------------------------------------------------------------------------- scan


def scan_images(
    files: Sequence[str | Path],
    names: dict[int, str],
    cache: bool = True,
    *,
    source: str | None = None,
    workers: int | None = None,
) -> ScanReport:
    """Scan images and their label files; fix/drop defects; report and cache the result.

    Args:
        files: image paths of one split (e.g. ``DataConfig.train``).
        names: class id -> name (ids ``0..nc-1``); class ids outside are defects.
        cache: read/write ``<labels dir>.labels.cache``. A read-only folder (see
            :func:`writable_dir`) is left untouched; any other write failure costs one
            :class:`DatasetWarning`; the scan continues without the cache either way.
        source: what the files are, for messages (``"coco.yaml: split 'train'"``).
        workers: threads for header reads (default ``min(16, 2 * cpu_count)``).

    Returns:
        A :class:`ScanReport`. Each defect is also emitted as a :class:`DatasetWarning`
        whose message starts with ``"<file>:<line>: "`` (``"<image>: "`` for images); at most
        :data:`MAX_WARNINGS_PER_KIND` per kind, then one summary warning. A cached scan
        replays the same warnings and reports the same counts.

    Raises:
        DatasetError: ``files`` is empty or no image is usable (names ``source``).
    """
    what = source or "the given image list"
    im_files = [Path(f) for f in files]
    if not im_files:
        raise DatasetError(f"{what}: no images to scan")
    label_files = [label_path_for(f) for f in im_files]
    nc = len(names)

    cache_path = _cache_path(label_files) if cache else None
    key = _cache_key(im_files, label_files, nc) if cache else None
    report = _load_cache(cache_path, key, names, im_files, label_files) if cache_path else None
    if report is None:
        report = _scan(im_files, label_files, names, workers)
        if cache_path is not None and key is not None:
            _save_cache(cache_path, key, report)
    report.cache_path = cache_path
    report.source = source
    report.orphan_labels = _find_orphans(im_files, label_files)

    for msg in report.messages:
        warnings.warn(msg, DatasetWarning, stacklevel=2)
    shown = len(report.messages)
    if report.n_defects > shown:
        warnings.warn(
            f"{what}: {report.n_defects - shown} more data issues not shown individually "
            f"({_defect_summary(report.defects)})",
            DatasetWarning,
            stacklevel=2,
        )
    if report.n_16bit:
        warnings.warn(
            f"{what}: {report.n_16bit} 16-bit image(s) converted to 8 bits by value / 257 "
            f"(65535 -> 255){f'; {len(report.dark_16bit)} of them near-black' if report.dark_16bit else ''}",
            DatasetWarning,
            stacklevel=2,
        )
    if report.n_usable == 0:
        raise DatasetError(
            f"{what}: no usable images among {report.n_images} "
            f"({_defect_summary(report.defects) or 'none readable'})"
        )
    logger.info(
        "%s: %d images (%d usable, %d backgrounds), %d boxes, %d defects "
        "(%d label rows clipped, %d dropped)%s",
        what,
        report.n_images,
        report.n_usable,
        report.n_backgrounds,
        report.n_boxes,
        report.n_defects,
        report.rows_clipped,
        report.rows_dropped,
        " (cached)" if report.from_cache else "",
    )
    return report


def scan_split(cfg: DataConfig, split: str, cache: bool = True) -> ScanReport:
    """:func:`scan_images` on split ``split`` of a loaded dataset YAML.

    Raises:
        DataConfigError: the split is not defined in the YAML.
        DatasetError: the split has no usable image (message names the YAML and split).
    """
    return scan_images(cfg.split(split), cfg.names, cache=cache, source=cfg.describe(split))


def _scan(
    im_files: list[Path], label_files: list[Path], names: dict[int, str], workers: int | None
) -> ScanReport:
    nc = len(names)
    n_threads = workers or min(16, 2 * (os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=max(1, n_threads)) as pool:
        results = list(
            pool.map(lambda a: _scan_one(a[0], a[1], nc), zip(im_files, label_files, strict=True))
        )
    for res in results:
        if res.damage is not None and res.skip_reason is None:
            _repair(res)
    by_label: dict[Path, list[_Result]] = {}
    for res in results:
        if res.skip_reason is None and not res.label_missing:
            by_label.setdefault(res.label_file, []).append(res)
    for label_file, group in by_label.items():
        if len(group) > 1:
            shown = " and ".join(str(r.im_file) for r in group)
            group[0].issues.append(LabelIssue(
                "shared_label", f"{label_file}: shared by {shown} (same name, different "
                "extension); every one of them gets its boxes. Rename the images that are not "
                "of these labels"))
    defects = dict.fromkeys(DEFECT_KINDS, 0)
    messages: list[str] = []
    records: list[ImageRecord] = []
    skipped: list[tuple[str, str]] = []
    n_missing = 0
    n_16bit, dark = 0, []
    for res in results:
        for iss in res.issues:
            defects[iss.kind] += 1
            if defects[iss.kind] <= MAX_WARNINGS_PER_KIND:
                messages.append(iss.message)
        if res.skip_reason is not None:
            skipped.append((str(res.im_file), res.skip_reason))
            continue
        assert res.shape is not None and res.labels is not None
        n_missing += res.label_missing
        n_16bit += res.bits16
        if res.dark16 is not None:
            dark.append(str(res.im_file))
            messages.append(f"{res.im_file}: 16-bit image converted to 8 bits (value / 257) is "
                            f"near-black (brightest pixel {res.dark16}/255): its data likely uses "
                            "only the low byte; rescale the file to the full 16-bit range")
        records.append(ImageRecord(res.im_file, res.label_file, res.shape, res.labels))
    if records and n_missing == len(records):
        messages.append(f"{records[0].label_file.parent}: none of the {len(records)} images has a "
                        "label file (rule: the last 'images' folder of an image path becomes "
                        "'labels', the extension '.txt'); all are backgrounds")
    return ScanReport(
        records=records,
        names=dict(names),
        n_images=len(im_files),
        n_missing_labels=n_missing,
        defects=defects,
        skipped=skipped,
        messages=messages,
        n_16bit=n_16bit,
        dark_16bit=dark,
    )


def _find_orphans(im_files: list[Path], label_files: list[Path]) -> list[Path]:
    """Label files (``*.txt``) in the label folders of this split with no image of the same
    stem in the matching image folder. Folders where labels sit next to images are skipped
    (any ``.txt`` there could be a list file)."""
    pairs = {(lf.parent, im.parent) for im, lf in zip(im_files, label_files, strict=True)}
    orphans: list[Path] = []
    for label_dir, image_dir in sorted(pairs):
        if label_dir == image_dir:
            continue
        try:
            image_stems = {Path(n).stem for n in os.listdir(image_dir) if is_image_file(n)}
            label_names = os.listdir(label_dir)
        except OSError:
            continue
        orphans.extend(
            label_dir / n
            for n in sorted(label_names)
            if n.endswith(".txt") and Path(n).stem not in image_stems
        )
    return orphans


def _defect_summary(defects: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in defects.items() if v)


# --------------------------------------------------------------------------- cache


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


def _cache_path(label_files: list[Path]) -> Path:
    common = Path(os.path.commonpath([str(p.parent) for p in label_files]))
    return common.with_name(common.name + ".labels.cache")


def _stat(p: Path) -> tuple[int, int]:
    try:
        st = os.stat(p)
    except OSError:
        return (-1, -1)
    return (st.st_size, st.st_mtime_ns)


def _cache_key(im_files: list[Path], label_files: list[Path], nc: int) -> str:
    """Hash of the parsing rules, nc, and every image/label path, size and mtime."""
    h = hashlib.sha256(f"v{CACHE_VERSION} nc={nc} tol={COORD_TOLERANCE}\n".encode())
    for im, lb in zip(im_files, label_files, strict=True):
        h.update(f"{im}\0{_stat(im)}\0{lb}\0{_stat(lb)}\n".encode())
    return h.hexdigest()


def _save_cache(path: Path, key: str, report: ScanReport) -> None:
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
    arrays = {
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
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
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
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def _load_cache(
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


# --------------------------------------------------------------------------- report


def format_report(report: ScanReport) -> str:
    """Human-readable multi-line summary of a :class:`ScanReport`."""
    present = report.classes_present
    missing = [report.names[i] for i in report.names if i not in set(present)]
    lines = [
        f"dataset scan: {report.source or 'images'}" + (" (cached)" if report.from_cache else ""),
        f"  images:        {report.n_images}",
        f"  usable:        {report.n_usable}",
        f"  backgrounds:   {report.n_backgrounds} ({report.n_missing_labels} without a label file)",
        f"  boxes:         {report.n_boxes}",
        f"  classes:       {len(report.names)} named, {len(present)} present",
    ]
    if missing:
        shown = ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else "")
        lines.append(f"  no boxes for:  {shown}")
    lines.append(f"  defects:       {report.n_defects}")
    lines.append(f"  label rows:    {report.rows_clipped} clipped (kept), {report.rows_dropped} dropped")
    if report.n_16bit:
        lines.append(f"  16-bit images: {report.n_16bit} converted by value / 257, "
                     f"{len(report.dark_16bit)} near-black")
    for kind, desc in DEFECT_KINDS.items():
        lines.append(f"    {kind:<17} {report.defects.get(kind, 0):>6}  {desc}")
    lines.append(f"  orphan label files (no image): {len(report.orphan_labels)}")
    for p in report.orphan_labels[:10]:
        lines.append(f"    {p}")
    if len(report.orphan_labels) > 10:
        lines.append(f"    ... and {len(report.orphan_labels) - 10} more")
    for p, reason in report.skipped[:10]:
        lines.append(f"  skipped image: {p} ({reason})")
    if report.cache_path is not None:
        lines.append(f"  cache:         {report.cache_path}")
    return "\n".join(lines)
