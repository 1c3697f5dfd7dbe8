"""Training-loader throughput on coco128 (mosaic on, augment=True) at imgsz 640.

Prints ONE line, e.g.::

    data_throughput imgsz=640 workers=0: 55.1 img/s | workers=2: 98.3 img/s (ratio 1.78x)

coco128 is copied to a temporary folder first (the label cache is written there, never
into the shared copy). For each worker count: build the loader, load 1 warm-up batch
(worker start-up, first decodes), then time ``--batches`` batches, wrapping around epochs
(``set_epoch`` each time, as the trainer does). Augmentation = ``AugmentConfig()`` (TrainConfig
base defaults: mosaic 1.0, mixup 1.0, HSV, flips, affine) unless ``--no-mixup``.

Usage: ``python bench/data_throughput.py [--data DIR] [--imgsz 640] [--batch 16]
[--batches 12] [--workers 0 2]``
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

#: ``$COCO128``, else ``shared/datasets/coco128`` beside the checkout
COCO128 = Path(os.environ.get("COCO128", Path(__file__).resolve().parents[2] / "shared" / "datasets"
                              / "coco128"))


def measure(report, imgsz: int, batch: int, n_batches: int, workers: int, aug) -> float:
    """Images per second of the augmented training loader after one warm-up batch."""
    from libreyolo_core.data import YOLODataset, build_dataloader

    ds = YOLODataset(report, imgsz, augment=True, aug=aug, seed=0)
    loader = build_dataloader(ds, batch, workers, shuffle=True, seed=0, drop_last=True)

    def batches(loader):
        epoch = 0
        while True:
            ds.set_epoch(epoch)
            loader.sampler.set_epoch(epoch)
            yield from loader
            epoch += 1

    it = batches(loader)
    next(it)  # warm-up
    t0 = time.perf_counter()
    n = sum(len(next(it)) for _ in range(n_batches))
    dt = time.perf_counter() - t0
    it.close()
    del loader  # stop persistent workers before the next measurement
    return n / dt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=COCO128, help="coco128 folder (copied)")
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--batches", type=int, default=12, help="timed batches per setting")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--no-mixup", action="store_true", help="mixup 0 (YOLOv9 recipe)")
    a = p.parse_args()

    if importlib.util.find_spec("libreyolo_core") is None:  # run from a checkout, not installed
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    logging.disable(logging.INFO)
    warnings.simplefilter("ignore")
    from libreyolo_core.config import AugmentConfig
    from libreyolo_core.data import load_data_config, scan_split

    aug = AugmentConfig(mixup=0.0) if a.no_mixup else AugmentConfig()
    with tempfile.TemporaryDirectory() as tmp:
        dst = Path(tmp) / "coco128"
        shutil.copytree(a.data, dst)
        for dirpath, _, _ in os.walk(dst):  # the shared copy is read-only; the cache is not
            os.chmod(dirpath, 0o755)
        report = scan_split(load_data_config(dst / "coco128.yaml"), "train")
        rates = {w: measure(report, a.imgsz, a.batch, a.batches, w, aug) for w in a.workers}
    parts = [f"workers={w}: {r:.1f} img/s" for w, r in rates.items()]
    line = f"data_throughput imgsz={a.imgsz} " + " | ".join(parts)
    if len(rates) >= 2:
        first, last = rates[a.workers[0]], rates[a.workers[-1]]
        line += f" (ratio {last / first:.2f}x)"
    print(line)


if __name__ == "__main__":
    main()
