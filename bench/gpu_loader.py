"""Training-loader throughput: the CPU loader (N workers) against ``loader=gpu``, same set.

Prints ONE line, e.g.::

    gpu_loader coco128 imgsz=640 batch=16 device=cuda: cpu loader (workers=8) 310.2 img/s |
    loader=gpu (workers=2) 1402.7 img/s (ratio 4.52x)

Both loaders serve the same augmented recipe (``AugmentConfig()``: mosaic 1.0, mixup 1.0,
affine, HSV, flips; ``--no-mixup`` for the YOLOv9 recipe) from the same dataset: coco128
(copied to a temporary folder, ``bench/_common.py``) when it is found, else a synthetic set
of ``--images`` 640-wide JPEGs (``--synthetic`` forces it). For each loader: 2 warm-up
batches (worker start-up, nvjpeg and kernel initialisation), then ``--batches`` timed
batches, epochs wrapping as the trainer does. The GPU loader's batches are finished on the
device before the clock stops (one ``synchronize`` at the end), so its figure includes the
device-side decode and augmentation. Runs on a CPU too (``--device cpu``: the same tensor
code, in the main process) so it can be tried without a GPU.

Usage: ``python bench/gpu_loader.py [--device cuda|cpu] [--workers 8] [--gpu-workers 2]
[--imgsz 640] [--batch 16] [--batches 10] [--synthetic] [--no-mixup]``
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _batches(loader: Any, ds: Any) -> Iterator[Any]:
    epoch = 0
    while True:
        ds.set_epoch(epoch)
        loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def measure(loader: Any, ds: Any, n_batches: int, device: Any) -> float:
    """Images per second over ``n_batches`` after 2 warm-up batches (device work included)."""
    import torch

    cuda = getattr(device, "type", "cpu") == "cuda"
    it = _batches(loader, ds)
    for _ in range(2):
        next(it)
    if cuda:
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    n = sum(len(next(it)) for _ in range(n_batches))
    if cuda:
        torch.cuda.synchronize(device)
    dt = time.perf_counter() - t0
    it.close()
    return n / dt


def _dataset(tmp: Path, synthetic: bool, images: int) -> tuple[Path, str]:
    if not synthetic:
        sys.path.insert(0, str(HERE))
        try:
            from _common import coco128_copy

            return coco128_copy(), "coco128"
        except SystemExit:
            pass
    from libreyolo_core.data.sample import generate_sample_dataset

    return generate_sample_dataset(tmp / "ds", n_train=images, n_val=1, imgsz=640, seed=0), "synthetic"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--workers", type=int, default=8, help="CPU loader workers")
    p.add_argument("--gpu-workers", type=int, default=2, help="loader=gpu file-reading workers")
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--batches", type=int, default=10, help="timed batches per loader")
    p.add_argument("--images", type=int, default=128, help="synthetic set size")
    p.add_argument("--synthetic", action="store_true", help="a synthetic set even if coco128 is found")
    p.add_argument("--no-mixup", action="store_true", help="mixup 0 (YOLOv9 recipe)")
    a = p.parse_args(argv)

    sys.path.insert(0, str(HERE.parent))  # this checkout's package, even if another is installed
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    import torch

    from libreyolo_core.config import AugmentConfig
    from libreyolo_core.data import load_data_config, scan_split
    from libreyolo_core.data.dataset import YOLODataset
    from libreyolo_core.data.gpu_loader import build_gpu_dataloader
    from libreyolo_core.data.loader import build_dataloader

    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    aug = AugmentConfig(mixup=0.0) if a.no_mixup else AugmentConfig()
    with tempfile.TemporaryDirectory() as tmp:
        yaml_path, name = _dataset(Path(tmp), a.synthetic, a.images)
        report = scan_split(load_data_config(yaml_path), "train")
        ds = YOLODataset(report, a.imgsz, augment=True, aug=aug, seed=0)
        cpu_loader = build_dataloader(ds, a.batch, a.workers, shuffle=True, seed=0, drop_last=True)
        cpu_rate = measure(cpu_loader, ds, a.batches, device)
        del cpu_loader  # stop its workers before the next measurement
        gpu_loader = build_gpu_dataloader(ds, a.batch, a.gpu_workers, device, seed=0, drop_last=True)
        gpu_rate = measure(gpu_loader, ds, a.batches, device)
        del gpu_loader
    print(f"gpu_loader {name} imgsz={a.imgsz} batch={a.batch} device={device.type}: cpu loader "
          f"(workers={a.workers}) {cpu_rate:.1f} img/s | loader=gpu (workers={a.gpu_workers}) "
          f"{gpu_rate:.1f} img/s (ratio {gpu_rate / cpu_rate:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
