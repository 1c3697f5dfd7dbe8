"""The validation report's pictures: curves and confusion matrices (matplotlib, Agg
backend, imported here and only when called), label statistics, and the detection
pictures (Pillow).

Colours of the detection pictures: TP green, FP red, FN (a missed ground-truth box)
orange; the left half shows the ground truth (found boxes blue, missed ones orange), the
right half the predictions at the report's confidence.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_curves", "plot_confusion", "plot_labels", "draw_detections",
           "TP_COLOR", "FP_COLOR", "FN_COLOR", "GT_COLOR"]

TP_COLOR = (30, 170, 60)
FP_COLOR = (220, 40, 40)
FN_COLOR = (255, 150, 0)
GT_COLOR = (40, 110, 230)
#: The longest side of one half of a detection picture, pixels.
PANEL_SIZE = 640
#: Classes drawn one by one in a curve plot; more are drawn thin and grey, unlabelled.
LEGEND_CLASSES = 12


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_curves(report: dict[str, Any], out: Path) -> dict[str, str]:
    """``PR_curve.png``, ``F1_curve.png``, ``P_curve.png``, ``R_curve.png`` from the report's
    ``pr_curve`` and ``confidence_curves``; returns ``{name: file}``."""
    plt = _pyplot()
    files = {}
    pr = report["pr_curve"]
    cc = report["confidence_curves"]
    many = len(pr["precision"]) > LEGEND_CLASSES

    def per_class(ax, x, series):
        if many:  # one artist for all the thin lines: cheap to draw
            from matplotlib.collections import LineCollection

            segs = [np.column_stack([x, y]) for y in series.values()]
            ax.add_collection(LineCollection(segs, colors="grey", linewidths=0.6, alpha=0.5))
            return
        for name, y in series.items():
            ax.plot(x, y, linewidth=1.2, label=name)

    def figure():
        fig = plt.figure(figsize=(8, 6), dpi=100)
        return fig, fig.add_axes((0.09, 0.09, 0.88, 0.84))

    fig, ax = figure()
    per_class(ax, pr["recall"], pr["precision"])
    ax.plot(pr["recall"], pr["mean"], color="blue", linewidth=3, label=f"all classes mAP50 {pr['mAP50']:.3f}")
    ax.set(xlabel="Recall", ylabel="Precision", xlim=(0, 1), ylim=(0, 1.02), title="Precision-Recall (IoU 0.50)")
    ax.legend(loc="lower left", fontsize=8)
    fig.savefig(out / "PR_curve.png")
    plt.close(fig)
    files["pr_curve"] = "PR_curve.png"
    fig, ax = figure()  # one figure for the three: its axes and ticks are made once
    for key, label, fname in (("f1", "F1", "F1_curve.png"), ("precision", "Precision", "P_curve.png"),
                              ("recall", "Recall", "R_curve.png")):
        for artist in [*ax.lines, *ax.collections]:
            artist.remove()
        ax.set_prop_cycle(None)  # the same class colours in each file
        per_class(ax, cc["conf"], cc[key])
        mean = np.asarray(cc["mean"][key])
        i = int(np.argmin(np.abs(np.asarray(cc["conf"]) - cc["best_conf"])))
        ax.plot(cc["conf"], mean, color="blue", linewidth=3,
                label=f"all classes {mean[i]:.2f} at {cc['best_conf']:.2f} (best F1)")
        ax.axvline(cc["best_conf"], color="blue", linestyle="--", linewidth=1)
        ax.set(xlabel="Confidence", ylabel=label, xlim=(0, 1), ylim=(0, 1.02), title=f"{label}-Confidence")
        ax.legend(loc="lower left" if key != "recall" else "upper right", fontsize=8)
        fig.savefig(out / fname)
        files[f"{key}_curve"] = fname
    plt.close(fig)
    return files


def plot_confusion(report: dict[str, Any], out: Path) -> dict[str, str]:
    """``confusion_matrix.png`` (counts) and ``confusion_matrix_normalized.png`` (rows
    sum to 1); returns ``{name: file}``."""
    plt = _pyplot()
    cm = report["confusion_matrix"]
    labels = cm["labels"]
    n = len(labels)
    # only the classes that occur (as truth or prediction) when there are many
    counts = np.asarray(cm["counts"])
    keep = np.arange(n) if n <= 31 else np.flatnonzero((counts.sum(0) + counts.sum(1)) > 0)
    k = len(keep)
    size = max(6.0, min(0.16 * k + 3, 13.0))
    # fixed margins (no tight_layout: it draws the figure once more to measure it); one
    # figure for both files: the ticks, the costly part with many classes, are made once
    margin = min(0.25, (0.1 * max(len(x) for x in labels) * 0.9 + 0.6) / size)
    fig = plt.figure(figsize=(size + 1, size), dpi=100)
    ax = fig.add_axes((margin, margin, 0.93 - margin - 1.2 / (size + 1), 0.95 - margin - 0.05))
    cax = fig.add_axes((0.95 - 0.9 / (size + 1), margin, 0.25 / (size + 1), 0.9 - margin))
    names = [labels[i] for i in keep]
    if k <= 31:
        ax.set_xticks(range(k), names, rotation=90, fontsize=8)
        ax.set_yticks(range(k), names, fontsize=8)
    else:  # many classes: plain texts, not ticks (a tick is five artists to lay out and draw)
        ax.set_xticks([])
        ax.set_yticks([])
        for i, name in enumerate(names):
            ax.text(i, k - 0.3, name, rotation=90, ha="center", va="top", fontsize=7, clip_on=False)
            ax.text(-0.8, i, name, ha="right", va="center", fontsize=7, clip_on=False)
    ax.set_xlabel("Predicted", labelpad=(8 if k <= 31 else 6.5 * max(len(x) for x in names) + 8))
    ax.set_ylabel("True", labelpad=(8 if k <= 31 else 6.5 * max(len(x) for x in names) + 8))
    im = None
    cells: list[Any] = []
    files = {}
    for key, fname, fmt in (("counts", "confusion_matrix.png", "d"), ("normalized", "confusion_matrix_normalized.png", ".2f")):
        m = np.asarray(cm[key])[np.ix_(keep, keep)]
        vmax = 1 if key == "normalized" else max(int(m.max()), 1)
        if im is None:
            im = ax.imshow(m, cmap="Blues", vmin=0, vmax=vmax)
            fig.colorbar(im, cax=cax)
        else:
            im.set_data(m)
            im.set_clim(0, vmax)
        for text in cells:
            text.remove()
        cells.clear()
        if k <= 31:
            thresh = (m.max() or 1) / 2
            for i in range(k):
                for j in range(k):
                    v = m[i, j]
                    if v:
                        cells.append(ax.text(j, i, format(v, fmt), ha="center", va="center", fontsize=7,
                                             color="white" if v > thresh else "black"))
        ax.set_title(f"Confusion matrix{' (row-normalised)' if key == 'normalized' else ' (counts)'}\n"
                     f"detections with conf >= {cm['conf']}, matched at IoU > {cm['iou']}", fontsize=10)
        fig.savefig(out / fname)
        files[f"confusion_matrix{'_normalized' if key == 'normalized' else ''}"] = fname
    plt.close(fig)
    return files


def plot_labels(labels: Sequence[np.ndarray], names: dict[int, str], path: Path) -> str:
    """``labels.png``: instances per class, box centres and box sizes (normalised) of the
    training labels (each (n, 5) ``[cls, cx, cy, w, h]``); returns the file name."""
    plt = _pyplot()
    rows = [np.asarray(x, np.float64).reshape(-1, 5) for x in labels]
    lab = np.concatenate(rows) if rows else np.zeros((0, 5))
    nc = len(names)
    counts = np.bincount(lab[:, 0].astype(np.int64), minlength=nc)[:nc]
    fig, axes = plt.subplots(1, 3, figsize=(18, 6), dpi=100)
    fig.subplots_adjust(left=0.05, right=0.98, bottom=0.22 if nc <= 40 else 0.12, top=0.93, wspace=0.25)
    ax = axes[0]
    ax.bar(range(nc), counts, color="steelblue")
    ax.set(ylabel="instances", title=f"Instances per class ({len(lab)} boxes, {len(rows)} images)")
    if nc <= 40:
        ax.set_xticks(range(nc), [names.get(i, str(i)) for i in range(nc)], rotation=90, fontsize=8)
    else:
        ax.set_xlabel("class id")
    for ax, (a, b), title, xl, yl in ((axes[1], (1, 2), "Box centres", "x", "y"),
                                      (axes[2], (3, 4), "Box sizes", "width", "height")):
        if len(lab) > 2000:  # many boxes: a density (a count of 1 still shows: vmin 0)
            ax.hist2d(lab[:, a], lab[:, b], bins=50, range=[[0, 1], [0, 1]], cmap="Blues", cmin=1, vmin=0)
        elif len(lab):
            ax.scatter(lab[:, a], lab[:, b], s=8, alpha=0.5, color="steelblue", linewidths=0)
        ax.set(xlim=(0, 1), ylim=(0, 1), title=title, xlabel=f"{xl} (fraction of image)",
               ylabel=f"{yl} (fraction of image)", aspect="equal")
    axes[1].invert_yaxis()  # image coordinates: y grows downwards
    fig.savefig(path)
    plt.close(fig)
    return path.name


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: the bitmap font, one size
        return ImageFont.load_default()


def _box(draw, box, color, text, font, width):
    x0, y0, x1, y1 = (float(v) for v in box)
    draw.rectangle([x0, y0, x1, y1], outline=color, width=width)
    if not text:
        return
    left, t, r, b = draw.textbbox((0, 0), text, font=font)
    tw, th = r - left, b - t + 4
    ty = y0 - th if y0 - th >= 0 else y0
    draw.rectangle([x0, ty, x0 + tw + 4, ty + th], fill=color)
    draw.text((x0 + 2, ty + 1 - t), text, fill=(255, 255, 255), font=font)


def draw_detections(pass_: Any, names: dict[int, str], out: Path, n: int, conf: float) -> list[dict[str, Any]]:
    """Draw the first ``n`` images of ``pass_`` (ground truth | predictions with score >=
    ``conf``) as ``out/NNN_<stem>.jpg``; returns the report's ``images`` entries (file
    relative to ``val/``, source, classes, tp, fp, fn, fp_classes, fn_classes)."""
    from PIL import Image, ImageDraw

    from libreyolo_core.data.image import load_image

    entries: list[dict[str, Any]] = []
    if n <= 0:
        return entries
    out.mkdir(parents=True, exist_ok=True)
    matches = pass_.metrics["detail"]["matches"]
    label = lambda c: names.get(int(c), str(int(c)))  # noqa: E731
    for i in range(min(n, len(pass_.paths))):
        det, tgt, mt, src = pass_.detections[i], pass_.targets[i], matches[i], pass_.paths[i]
        try:
            img = load_image(src)
        except Exception:  # noqa: BLE001 - a picture we cannot draw is skipped, not fatal
            continue
        h0, w0 = img.shape[:2]
        s = PANEL_SIZE / max(h0, w0)
        w, h = max(int(round(w0 * s)), 1), max(int(round(h0 * s)), 1)
        panel = Image.fromarray(img).resize((w, h), Image.Resampling.BILINEAR)
        head = 28
        canvas = Image.new("RGB", (2 * w + 8, h + head), (255, 255, 255))
        canvas.paste(panel, (0, head))
        canvas.paste(panel, (w + 8, head))
        draw = ImageDraw.Draw(canvas)
        font, big = _font(14), _font(16)
        width = 2
        gcls = np.asarray(tgt.classes).astype(np.int64).reshape(-1)
        gbox = np.asarray(tgt.boxes, np.float64).reshape(-1, 4) * s
        missed = mt.gt_score < conf
        for b, c, miss in zip(gbox, gcls, missed, strict=True):
            b = b + [0, head, 0, head]
            _box(draw, b, FN_COLOR if miss else GT_COLOR, f"{'FN ' if miss else ''}{label(c)}", font, width)
        dcls = np.asarray(det.classes).astype(np.int64).reshape(-1)
        dsc = np.asarray(det.scores, np.float64).reshape(-1)
        dbox = np.asarray(det.boxes, np.float64).reshape(-1, 4) * s
        shown = np.flatnonzero((dsc >= conf) & (mt.dt_state >= 0))
        shown = shown[np.argsort(dsc[shown])]  # the best on top
        tp = fp = 0
        fp_cls: set[str] = set()
        for k in shown:
            is_tp = mt.dt_state[k] == 1
            tp, fp = tp + int(is_tp), fp + int(not is_tp)
            if not is_tp:
                fp_cls.add(label(dcls[k]))
            b = dbox[k] + [w + 8, head, w + 8, head]
            _box(draw, b, TP_COLOR if is_tp else FP_COLOR,
                 f"{'' if is_tp else 'FP '}{label(dcls[k])} {dsc[k]:.2f}", font, width)
        fn = int(missed.sum())
        draw.text((4, 5), f"ground truth ({len(gcls)}; FN orange)", fill=(0, 0, 0), font=big)
        draw.text((w + 12, 5), f"predictions conf>={conf:g}: TP {tp} green, FP {fp} red", fill=(0, 0, 0), font=big)
        name = f"{i:03d}_{Path(src).stem}.jpg"
        canvas.save(out / name, quality=85)
        entries.append({"file": f"{out.name}/{name}", "source": Path(src).name,
                        "classes": sorted({label(c) for c in gcls} | {label(dcls[k]) for k in shown}),
                        "tp": tp, "fp": fp, "fn": fn, "fp_classes": sorted(fp_cls),
                        "fn_classes": sorted({label(c) for c, m in zip(gcls, missed, strict=True) if m})})
    return entries
