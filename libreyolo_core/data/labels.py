"""YOLO label files: where an image's label file is, and parsing one.

Label rows (YOLO detect format, LibreYOLO/Ultralytics): ``cls cx cy w h`` normalised to
the displayed (EXIF-rotated) image size. Rows with an odd number > 5 of fields are
polygons ``cls x1 y1 ... xn yn`` (segmentation labels) and become their bounding box. Each
defective row is fixed or dropped and reported as a :class:`LabelIssue` (the defect kinds
are listed in :mod:`libreyolo_core.data.scan`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["COORD_TOLERANCE", "LabelIssue", "label_path_for", "parse_label_text"]

#: Rounding slack for coordinates just outside [0, 1] (labels written with 5-6 decimals,
#: e.g. coco128's 1.0000005): snapped to the edge silently. Beyond it a row is ``clipped``.
COORD_TOLERANCE = 1e-5


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



@dataclass(frozen=True)
class LabelIssue:
    """One defect: ``kind`` (a key of :data:`~libreyolo_core.data.report.DEFECT_KINDS`) and its message, which starts
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
        and one issue (kind, message) per defect found (the kinds:
        :data:`libreyolo_core.data.report.DEFECT_KINDS`).
    """
    rows: list[tuple[float, float, float, float, float]] = []
    issues: list[LabelIssue] = []
    seen: set[tuple[float, ...]] = set()
    for lineno, line in enumerate(text.splitlines(), 1):
        tokens = line.split()
        if not tokens:
            continue
        vals, notes = _line_values(tokens, nc)
        if vals is not None and vals in seen:
            vals, notes = None, [("duplicate", "duplicate of an earlier line; dropped")]
        row = None
        if vals is not None:
            seen.add(vals)
            row, notes = _box_row(vals)
        issues.extend(LabelIssue(kind, f"{where}:{lineno}: {msg}") for kind, msg in notes)
        if row is not None:
            rows.append(row)
    labels = np.array(rows, dtype=np.float32).reshape(-1, 5)
    return labels, issues


_Note = tuple[str, str]  # (defect kind, message without the "<file>:<line>: " prefix)


def _line_values(tokens: list[str], nc: int) -> tuple[tuple[float, ...] | None, list[_Note]]:
    """The numbers of one non-empty label line, or ``None`` and the defect that drops it."""
    n = len(tokens)
    if n != 5 and not (n > 5 and n % 2 == 1):
        return None, [("malformed", f"{n} values; expected 5 (cls cx cy w h) or a polygon "
                       "(cls x1 y1 ... xn yn, n >= 3); line dropped")]
    try:
        vals = tuple(float(t) for t in tokens)
    except ValueError:
        bad = next(t for t in tokens if not _is_float(t))
        return None, [("non_numeric", f"non-numeric value {bad!r}; line dropped")]
    if not all(math.isfinite(v) for v in vals):
        return None, [("non_numeric", "non-finite value (nan/inf); line dropped")]
    c = vals[0]
    if not c.is_integer():
        return None, [("bad_class", f"class id {tokens[0]!r} is not an integer; line dropped")]
    if not 0 <= c < nc:
        return None, [("bad_class", f"class id {int(c)} outside names (0..{nc - 1}); line dropped")]
    return vals, []


def _box_row(
    vals: tuple[float, ...],
) -> tuple[tuple[float, float, float, float, float] | None, list[_Note]]:
    """One parsed line (a box or a polygon) as a ``[cls, cx, cy, w, h]`` row clipped to the
    image, or ``None`` when it is dropped; with the notes it earned."""
    c = vals[0]
    notes: list[_Note] = []
    if len(vals) > 5:
        xs, ys = vals[1::2], vals[2::2]
        x1, y1, x2, y2 = min(xs), min(ys), max(xs), max(ys)
        notes.append(("polygon", f"polygon ({len(xs)} points) converted to its bounding box"))
    else:
        _, cx, cy, w, h = vals
        if w <= 0 or h <= 0:
            return None, [("zero_area", f"box width/height {w:g}x{h:g} <= 0; line dropped")]
        if w > 1 + COORD_TOLERANCE or h > 1 + COORD_TOLERANCE:
            return None, [("oversize", f"box width/height {w:g}x{h:g}: more than the whole image "
                           "(normalised values are at most 1); line dropped")]
        x1, y1, x2, y2 = cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2
    tol = COORD_TOLERANCE
    x1r, y1r, x2r, y2r = x1, y1, x2, y2
    outside = x1 < -tol or y1 < -tol or x2 > 1 + tol or y2 > 1 + tol
    x1, y1, x2, y2 = (min(max(v, 0.0), 1.0) for v in (x1, y1, x2, y2))
    if x2 - x1 <= 0 or y2 - y1 <= 0:
        gone = "box lies outside the image" if outside else "zero-area box"
        notes.append(("out_of_bounds" if outside else "zero_area", f"{gone}; line dropped"))
        return None, notes
    if outside:
        notes.append(("clipped", f"box x {_span(x1r, x2r)} y {_span(y1r, y2r)} outside [0, 1]; "
                      "clipped to the image and kept"))
    return (c, (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1), notes


def _span(a: float, b: float) -> str:
    return f"{a:.6g}..{b:.6g}"


def _is_float(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True
