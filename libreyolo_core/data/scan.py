"""One pass over a split's images and YOLO label files: ``scan_images(files, names)``.

Every image header is read (Pillow, in a thread pool) and every label file parsed; each
defect is fixed or dropped, warned about with the file and line, and counted. The result
(:class:`~libreyolo_core.data.report.ScanReport`) is cached next to the labels as
``<labels dir>.labels.cache`` and reused while no image/label file changed size or mtime.
The parts: :mod:`~libreyolo_core.data.labels` (label paths and parsing),
:mod:`~libreyolo_core.data.image_checks` (image headers, damage, 16-bit),
:mod:`~libreyolo_core.data.scan_cache` (the cache), :mod:`~libreyolo_core.data.report`
(the report and its defect kinds); this module runs them over a split.

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
clipped (kept) apart from the rows that were dropped (``ScanReport.rows_clipped``,
``ScanReport.rows_dropped``). 16-bit images are converted to 8 bits by ``value / 257``
(one log line with their count); a converted image whose brightest pixel is below
``DARK_16BIT_MAX`` (:mod:`~libreyolo_core.data.image_checks`) is warned about by name (its
data likely uses only the low byte).
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from libreyolo_core.data.config import DataConfig, is_image_file
from libreyolo_core.data.image_checks import check_image, decode_tolerantly
from libreyolo_core.data.labels import LabelIssue, label_path_for, parse_label_text
from libreyolo_core.data.report import (
    DEFECT_KINDS,
    DatasetError,
    DatasetWarning,
    ImageRecord,
    ScanReport,
)
from libreyolo_core.data.scan_cache import cache_key, cache_path, load_cache, save_cache

__all__ = ["MAX_WARNINGS_PER_KIND", "require_trainable", "scan_images", "scan_split"]

logger = logging.getLogger(__name__)

#: Per-kind cap on individual warnings in one scan; the rest are only counted.
MAX_WARNINGS_PER_KIND = 20


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
    damage: str | None = None  # why a tolerant decode is needed (set by the image check)
    bits16: bool = False
    dark16: int | None = None  # converted 8-bit maximum of a near-black 16-bit image


def _scan_one(im_file: Path, label_file: Path, nc: int) -> _Result:
    res = _Result(im_file, label_file)
    try:
        check = check_image(im_file)
    except Exception as e:  # any decoder error means: skip this image
        reason = str(e) or type(e).__name__
        res.skip_reason = reason
        res.issues.append(LabelIssue("unreadable_image", f"{im_file}: {reason}; image skipped"))
        return res
    res.shape, res.damage, res.bits16, res.dark16 = (check.shape, check.damage, check.bits16,
                                                     check.dark16)
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
        decode_tolerantly(res.im_file)
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
    cache_dir: str | Path | None = None,
) -> ScanReport:
    """Scan images and their label files; fix/drop defects; report and cache the result.

    Args:
        files: image paths of one split (e.g. ``DataConfig.train``).
        names: class id -> name (ids ``0..nc-1``); class ids outside are defects.
        cache: read/write ``<labels dir>.labels.cache``. A read-only folder (see
            :func:`~libreyolo_core.data.scan_cache.writable_dir`) is left untouched; any
            other write failure costs one :class:`DatasetWarning`; the scan continues
            without the cache either way.
        source: what the files are, for messages (``"coco.yaml: split 'train'"``).
        workers: threads for header reads (default ``min(16, 2 * cpu_count)``).
        cache_dir: keep the cache in this folder, named by its content key
            (:func:`~libreyolo_core.data.scan_cache.cache_path`), instead of next to the
            labels: nothing is written into the dataset's folders.

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

    key = cache_key(im_files, label_files, nc) if cache else None
    cache_file = cache_path(label_files, cache_dir, key) if cache else None
    report = load_cache(cache_file, key, names, im_files, label_files) if cache_file else None
    if report is None:
        report = _scan(im_files, label_files, names, workers)
        if cache_file is not None and key is not None:
            save_cache(cache_file, key, report)
    report.cache_path = cache_file
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


def scan_split(cfg: DataConfig, split: str, cache: bool = True,
               cache_dir: str | Path | None = None) -> ScanReport:
    """:func:`scan_images` on split ``split`` of a loaded dataset YAML (``cache_dir``: see
    :func:`scan_images`).

    Raises:
        DataConfigError: the split is not defined in the YAML.
        DatasetError: the split has no usable image (message names the YAML and split).
    """
    return scan_images(cfg.split(split), cfg.names, cache=cache, source=cfg.describe(split),
                       cache_dir=cache_dir)


def require_trainable(report: ScanReport, split: str) -> ScanReport:
    """``report`` when a run can use split ``split`` (a scan of it), for training, a
    profile or ``libreyolo checks``; the scan itself only reports.

    Raises:
        DatasetError: every label file sits beside its images instead of where the
            ``images/ -> labels/`` rule looks, or a train split has no usable box
            (:meth:`~libreyolo_core.data.report.ScanReport.unusable_reason`).
    """
    reason = report.unusable_reason(split)
    if reason is not None:
        raise DatasetError(reason)
    return report


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
    _flag_shared_labels(results)
    return _tally(results, names, n_images=len(im_files))


def _flag_shared_labels(results: list[_Result]) -> None:
    """Add a ``shared_label`` issue where images of different extensions share one label file."""
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


def _tally(results: list[_Result], names: dict[int, str], n_images: int) -> ScanReport:
    """The :class:`ScanReport` of per-image scan results: usable records, skips, defect counts
    and the messages to show (at most ``MAX_WARNINGS_PER_KIND`` per kind)."""
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
        n_images=n_images,
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
