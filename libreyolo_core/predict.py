"""What ``predict`` reads and what it saves.

Sources (:func:`expand_source`, :func:`iter_frames`): an image file, a folder of images
(recursive), a glob (``"imgs/**/*.jpg"``), a list file (``.txt``, one path a line,
relative paths from the list's folder, ``#`` comments), a video file (decoded with
OpenCV frame by frame: one frame in memory at a time), an in-memory image (PIL or numpy
RGB), or a list of any of these.

Saving (:class:`PredictSaver`, under ``runs/predict/<name>/``):

- ``save``: each image annotated (boxes, class names, scores) under its own name; a video
  as ``<stem>.mp4`` (mp4v, the source's frame rate), frame by frame;
- ``save_txt``: ``labels/<stem>.txt`` (a video: ``labels/<stem>_<frame>.txt``), YOLO
  format ``cls cx cy w h`` normalised to the image, ``save_conf`` adds the score column;
- ``save_json``: ``predictions.json``, COCO results format (``image_id`` as in the
  validation report: the file stem when it is a number, else the 1-based position; a
  video's frames are numbered from 1), each entry with ``file_name`` too.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from libreyolo_core.data.config import is_image_file

__all__ = ["SourceError", "Source", "expand_source", "iter_frames", "total_frames", "PredictSaver",
           "annotate", "VIDEO_EXTENSIONS", "Prediction", "as_rgb"]

VIDEO_EXTENSIONS = frozenset({".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".mpg", ".mpeg", ".wmv"})


@dataclass
class Prediction:
    """Detections of one image, in that image's original pixels.

    Attributes:
        boxes: (n, 4) float32 xyxy pixels.
        scores: (n,) float32 in [0, 1].
        classes: (n,) int64 class ids.
        names: class name of each detection (length n).
        path: source file, or ``None`` for in-memory images.
        orig_shape: (height, width) of the source image.
    """

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray
    names: list[str]
    path: str | None
    orig_shape: tuple[int, int]
    extra: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.scores)


def as_rgb(item: Any) -> np.ndarray:
    """``item`` (a PIL image, or an (H, W), (H, W, 3) or (H, W, 4) array) as a contiguous
    (H, W, 3) uint8 RGB array.

    Raises:
        ValueError: an array of another shape.
    """
    if hasattr(item, "convert"):  # PIL image
        return np.asarray(item.convert("RGB"))
    arr = np.asarray(item)
    if arr.ndim == 2:
        arr = np.repeat(arr[..., None], 3, axis=2)
    if arr.ndim != 3 or arr.shape[2] not in (3, 4):
        raise ValueError(f"an image array must be (H, W, 3) RGB uint8, got shape {arr.shape}")
    return np.ascontiguousarray(arr[..., :3].astype(np.uint8))


class SourceError(ValueError):
    """A predict source that cannot be read (a video OpenCV cannot open, a bad list file)."""


@dataclass
class Source:
    """One entry of an expanded source: ``kind`` is ``image``, ``video`` or ``array`` (an
    in-memory ``item``; its ``path`` is empty)."""

    kind: str
    path: Path = Path()
    item: Any = None


def _is_video(path: Path) -> bool:
    return path.suffix.lower() in VIDEO_EXTENSIONS


def _from_path(p: Path) -> list[Source]:
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and (is_image_file(f) or _is_video(f)))
        if not files:
            raise FileNotFoundError(f"no images or videos in folder {p}")
        return [Source("video" if _is_video(f) else "image", f) for f in files]
    if p.is_file():
        if _is_video(p):
            return [Source("video", p)]
        if p.suffix.lower() == ".txt":
            return _from_list_file(p)
        return [Source("image", p)]
    text = str(p)
    if any(ch in text for ch in "*?["):
        hits = sorted(Path(h) for h in glob.glob(text, recursive=True))
        hits = [h for h in hits if h.is_file() and (is_image_file(h) or _is_video(h))]
        if not hits:
            raise FileNotFoundError(f"no images or videos match {text}")
        return [Source("video" if _is_video(h) else "image", h) for h in hits]
    raise FileNotFoundError(f"image source not found: {p}")


def _from_list_file(p: Path) -> list[Source]:
    """The files a ``.txt`` list names, one a line (``#`` starts a comment; a relative path
    is relative to the list's folder).

    Raises:
        FileNotFoundError: a named file that does not exist (``<list>:<line>``), or no file.
    """
    out = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        q = Path(line) if Path(line).is_absolute() else p.parent / line
        if not q.is_file():
            raise FileNotFoundError(f"{p}:{n}: {line} not found")
        out.append(Source("video" if _is_video(q) else "image", q))
    if not out:
        raise FileNotFoundError(f"list file {p} names no files")
    return out


def expand_source(source: Any) -> list[Source]:
    """The entries of ``source`` (see the module), in order.

    Raises:
        FileNotFoundError: a path that does not exist, an empty folder or glob, a list
            file naming a missing file.
    """
    items = source if isinstance(source, list | tuple) else [source]
    out: list[Source] = []
    for item in items:
        if isinstance(item, str | os.PathLike):
            out += _from_path(Path(item))
        else:
            out.append(Source("array", Path(), item))
    return out


def _open_video(path: Path) -> Any:
    import cv2

    cap = cv2.VideoCapture(str(path))
    if not cap.isOpened():
        raise SourceError(f"{path}: OpenCV cannot open this video")
    return cap


def total_frames(sources: list[Source]) -> int:
    """Images plus video frames (as the containers declare them) in ``sources``."""
    import cv2

    n = 0
    for s in sources:
        if s.kind == "video":
            cap = _open_video(s.path)
            n += max(int(cap.get(cv2.CAP_PROP_FRAME_COUNT)), 1)
            cap.release()
        else:
            n += 1
    return n


def iter_frames(sources: list[Source], as_rgb: Any) -> Iterator[tuple[np.ndarray, Source, int | None, float]]:
    """``(image RGB uint8 (H, W, 3), source, frame index or None, fps)`` for every image
    and video frame; ``as_rgb`` converts an in-memory item."""
    import cv2

    from libreyolo_core.data.image import load_image

    for s in sources:
        if s.kind == "image":
            yield load_image(s.path), s, None, 0.0
        elif s.kind == "array":
            yield as_rgb(s.item), s, None, 0.0
        else:
            cap = _open_video(s.path)
            fps = float(cap.get(cv2.CAP_PROP_FPS)) or 30.0
            try:
                k = 0
                while True:
                    ok, frame = cap.read()
                    if not ok:
                        break
                    yield cv2.cvtColor(frame, cv2.COLOR_BGR2RGB), s, k, fps
                    k += 1
            finally:
                cap.release()


def _color(c: int) -> tuple[int, int, int]:
    """A stable, distinct colour per class id (golden-ratio hues)."""
    import colorsys

    r, g, b = colorsys.hsv_to_rgb((c * 0.618033988749895) % 1.0, 0.85, 0.9)
    return int(r * 255), int(g * 255), int(b * 255)


def annotate(img: np.ndarray, boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray,
             names: dict[int, str]) -> np.ndarray:
    """``img`` (RGB uint8) with each box drawn and labelled ``name score``; a new array."""
    from PIL import Image, ImageDraw

    from libreyolo_core.eval.plots import _box, _font

    pil = Image.fromarray(img)
    draw = ImageDraw.Draw(pil)
    side = max(img.shape[:2])
    font = _font(max(12, side // 50))
    width = max(2, side // 400)
    for b, s, c in sorted(zip(boxes, scores, classes, strict=True), key=lambda x: x[1]):
        _box(draw, b, _color(int(c)), f"{names.get(int(c), str(int(c)))} {float(s):.2f}", font, width)
    return np.asarray(pil)


class PredictSaver:
    """Writes what ``predict(save=..., save_txt=..., save_json=...)`` asks for under
    ``out_dir`` (see the module); call :meth:`add` per image or frame, then :meth:`close`."""

    def __init__(self, out_dir: Path, names: dict[int, str], save: bool = False, save_txt: bool = False,
                 save_conf: bool = False, save_json: bool = False):
        self.out, self.names = Path(out_dir), names
        self.save, self.save_txt, self.save_conf, self.save_json = save, save_txt, save_conf, save_json
        self.results: list[dict[str, Any]] = []
        self._writer: Any = None
        self._writer_src: Path | None = None
        self._count = 0
        self.files: list[str] = []

    def _stem(self, src: Source, frame: int | None) -> str:
        stem = src.path.stem if src.kind != "array" else f"image{self._count}"
        return stem if frame is None else f"{stem}_{frame}"

    def add(self, img: np.ndarray, pred: Any, src: Source, frame: int | None, fps: float) -> None:
        """Save one image's (or frame's) prediction (a ``Prediction``)."""
        self._count += 1
        h, w = img.shape[:2]
        if self.save:
            drawn = annotate(img, pred.boxes, pred.scores, pred.classes, self.names)
            if frame is None:
                self._close_video()
                name = src.path.name if src.kind != "array" else f"image{self._count}.jpg"
                if not Path(name).suffix:
                    name += ".jpg"
                from PIL import Image

                Image.fromarray(drawn).save(self.out / name)
                self.files.append(name)
            else:
                self._video(src, fps, w, h).write(drawn[..., ::-1].copy())
        if self.save_txt:
            labels = self.out / "labels"
            labels.mkdir(exist_ok=True)
            lines = []
            for b, s, c in zip(pred.boxes, pred.scores, pred.classes, strict=True):
                cx, cy = (b[0] + b[2]) / 2 / w, (b[1] + b[3]) / 2 / h
                bw, bh = (b[2] - b[0]) / w, (b[3] - b[1]) / h
                row = f"{int(c)} {cx:.6f} {cy:.6f} {bw:.6f} {bh:.6f}"
                lines.append(row + (f" {float(s):.5f}" if self.save_conf else ""))
            (labels / f"{self._stem(src, frame)}.txt").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
        if self.save_json:
            from libreyolo_core.eval.report import _image_id

            if frame is None:
                img_id: int | str = _image_id(str(src.path) if src.kind != "array" else "", self._count - 1)
            else:
                img_id = frame + 1
            fname = src.path.name if src.kind != "array" else None
            for b, s, c in zip(pred.boxes, pred.scores, pred.classes, strict=True):
                self.results.append({"image_id": img_id, "file_name": fname, "frame": frame, "category_id": int(c),
                                     "bbox": [round(float(b[0]), 3), round(float(b[1]), 3),
                                              round(float(b[2] - b[0]), 3), round(float(b[3] - b[1]), 3)],
                                     "score": round(float(s), 5)})

    def _video(self, src: Source, fps: float, w: int, h: int) -> Any:
        import cv2

        if self._writer is None or self._writer_src != src.path:
            self._close_video()
            name = f"{src.path.stem}.mp4"
            self._writer = cv2.VideoWriter(str(self.out / name), cv2.VideoWriter.fourcc(*"mp4v"), fps, (w, h))
            self._writer_src = src.path
            self.files.append(name)
        return self._writer

    def _close_video(self) -> None:
        if self._writer is not None:
            self._writer.release()
            self._writer, self._writer_src = None, None

    def close(self) -> None:
        """Finish the video being written and write ``predictions.json``."""
        self._close_video()
        if self.save_json:
            (self.out / "predictions.json").write_text(json.dumps(self.results), encoding="utf-8")
            self.files.append("predictions.json")
