"""ONNX export of every model at 640: the check's figure, ONNX vs PyTorch predict agreement,
and onnxruntime CPU latency against PyTorch CPU eager, measured alternately in one run.

Prints ONE line, e.g.::

    onnx_export imgsz=640 threads=1 | yolo9-t diff 2.1e-06 agree 8/8 ort 95 ms torch 180 ms (1.89x) | ...

Models are freshly built and made to behave like trained ones (BatchNorm statistics of the
coco8 images, class convs rescaled: ``tests/export/export_models.py``); no weights can be
downloaded here. "agree" counts the coco8 images whose detections are the same set (count, and each
detection matched to one of the same class, box within 1e-2 px, score within 1e-4) from ``LibreYOLO.predict`` and from
onnxruntime + our post-processing (:class:`~libreyolo_core.export.runtime.OnnxDetector`).
Latency: one image ``(1, 3, 640, 640)`` through the network (ONNX raw layout vs
``model(preprocess(x))`` under ``torch.inference_mode``), the median of ``--repeat``
alternated runs after one warm-up each, with the same thread count for both.

Usage: ``python bench/onnx_export.py [--models yolo9-t yolox-s] [--imgsz 640] [--repeat 5]
[--threads 1]``
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def same_detections(p, q, box_px: float = 1e-2, score: float = 1e-4) -> bool:
    """Whether two images' detections are the same set: as many, and each of ``p`` matched
    to its own one of ``q`` of the same class, box within ``box_px`` pixels and score within
    ``score``. A set, not a sequence: detections whose scores tie to float32 rounding come
    out of the two runtimes' sorts in either order (seen at 640 px, 300 boxes an image)."""
    import numpy as np

    if len(p) != len(q):
        return False
    free = np.ones(len(q), dtype=bool)
    for box, cls, conf in zip(p.boxes, p.classes, p.scores, strict=True):
        ok = (free & (q.classes == cls) & (np.abs(q.boxes - box).max(axis=1) <= box_px)
              & (np.abs(q.scores - conf) <= score))
        if not ok.any():
            return False
        free[np.flatnonzero(ok)[0]] = False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["yolo9-t", "yolo9-s", "yolox-n", "yolox-t", "yolox-s"])
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    warnings.simplefilter("ignore")
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(REPO / "tests" / "export"))
    from export_models import IMAGES, confident

    from libreyolo_core.export.runtime import OnnxDetector

    images = sorted(IMAGES.glob("*.jpg"))
    parts = [f"onnx_export imgsz={args.imgsz} threads={args.threads}"]
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            yolo = confident(name, size=args.imgsz)
            result = yolo.export(file=Path(tmp) / f"{name}.onnx", imgsz=args.imgsz)
            det = OnnxDetector(result.path, threads=args.threads)
            a = yolo.predict(images, imgsz=args.imgsz, device="cpu")
            b = det.predict(images)
            agree = sum(same_detections(p, q) for p, q in zip(a, b, strict=True))
            x = torch.from_numpy(np.random.default_rng(0).integers(
                0, 256, (1, 3, args.imgsz, args.imgsz), dtype=np.uint8))
            net = yolo.model.eval()
            times: dict[str, list[float]] = {"ort": [], "torch": []}

            def run_torch(net=net, family=yolo.family, x=x):
                with torch.inference_mode():
                    net(family.preprocess(x))

            def run_ort(det=det, x=x):
                det.run(x.numpy())

            run_torch(), run_ort()  # warm-up
            for _ in range(args.repeat):
                for key, fn in (("ort", run_ort), ("torch", run_torch)):
                    t0 = time.perf_counter()
                    fn()
                    times[key].append(time.perf_counter() - t0)
            ort_ms = statistics.median(times["ort"]) * 1e3
            torch_ms = statistics.median(times["torch"]) * 1e3
            n_det = sum(len(p) for p in a)
            parts.append(f"{name} diff {result.max_diff:.2g} agree {agree}/{len(images)} ({n_det} boxes) "
                         f"ort {ort_ms:.0f} ms torch {torch_ms:.0f} ms ({torch_ms / ort_ms:.2f}x)")
    print(" | ".join(parts))


if __name__ == "__main__":
    main()
