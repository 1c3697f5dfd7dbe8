"""What a label scan found: :class:`ScanReport` with its :class:`ImageRecord` list, the
defect kinds, the scan's error and warning types, and :func:`format_report` for people."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DEFECT_KINDS", "ROW_DROPPED_KINDS", "DatasetError", "DatasetWarning", "ImageRecord",
           "ScanReport", "format_report"]

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
        dark_16bit: those of them whose converted maximum is below
            :data:`~libreyolo_core.data.image_checks.DARK_16BIT_MAX`.
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

    def unusable_reason(self, split: str) -> str | None:
        """Why this split cannot be trained on although images were read, or None.

        * every label file sits beside its images (or in a sibling folder), none where
          the ``images/ -> labels/`` rule looks: the rule is explained;
        * a train split (``split == "train"``) with no usable box at all: nothing to
          learn (e.g. every class id outside ``names``); the defect counts are named.
        """
        what = self.source or f"split {split!r}"
        elsewhere = self.defects.get("label_elsewhere", 0)
        if self.records and elsewhere and self.n_missing_labels == len(self.records):
            return (f"{what}: none of the {len(self.records)} images has its label file where "
                    f"LibreYOLO looks, and {elsewhere} have a .txt beside them or in a sibling "
                    "folder. The rule (YOLO/Ultralytics layout): the last 'images' folder of an "
                    "image's path becomes 'labels' and the extension '.txt', e.g. "
                    "d/images/train/a.jpg -> d/labels/train/a.txt. Move the .txt files there")
        if split == "train" and self.records and self.n_boxes == 0:
            found = ", ".join(f"{k} {v}" for k, v in self.defects.items() if v)
            why = f" (label rows dropped: {found})" if found else " (every image is a background)"
            hint = ""
            if self.defects.get("bad_class"):
                hint = (f"; names has {len(self.names)} entries, so class ids must be "
                        f"0..{len(self.names) - 1}: fix the labels or the yaml's names")
            return (f"{what}: no usable box in {len(self.records)} images{why}{hint}. "
                    "Training would learn nothing")
        return None

    def defect_summary(self) -> dict[str, Any]:
        """What a job's result keeps of the scan: ``images``, ``usable``, ``boxes``,
        ``n_defects``, ``defects`` (the kinds that occurred, with their counts),
        ``rows_dropped`` and ``skipped`` (images)."""
        return {"images": self.n_images, "usable": self.n_usable, "boxes": self.n_boxes,
                "n_defects": self.n_defects,
                "defects": {k: v for k, v in self.defects.items() if v},
                "rows_dropped": self.rows_dropped, "skipped": len(self.skipped)}

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
    for orphan in report.orphan_labels[:10]:
        lines.append(f"    {orphan}")
    if len(report.orphan_labels) > 10:
        lines.append(f"    ... and {len(report.orphan_labels) - 10} more")
    for p, reason in report.skipped[:10]:
        lines.append(f"  skipped image: {p} ({reason})")
    if report.cache_path is not None:
        lines.append(f"  cache:         {report.cache_path}")
    return "\n".join(lines)
