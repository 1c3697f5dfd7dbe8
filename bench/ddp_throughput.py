"""DDP throughput: the same training as one process and as ``--nproc`` torchrun ranks.

coco128, no validation, 2 epochs each; the second epoch's time (``results.csv``) is
compared, so start-up, the process group and warm-up are left out. ``batch`` is the global
batch in both runs, so both see the same images per step. On CUDA each rank takes one GPU;
without CUDA the ranks share the CPU over Gloo (each rank gets ``cores / nproc`` threads,
the single process all of them), which measures the cost of DDP's communication rather
than a speed-up.

Prints one line, e.g.
``ddp_throughput coco128 yolo9-t@320 batch=16 cpu: 1 process 12.1 img/s, 2 ranks 10.9 img/s (0.90x)``

Usage: python bench/ddp_throughput.py [--model yolo9-t] [--imgsz 320] [--batch 16] [--nproc 2]
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import coco128_copy  # noqa: E402


def epoch2_images_per_s(nproc: int, data: Path, args: argparse.Namespace, device: str) -> float:
    with tempfile.TemporaryDirectory() as project:
        keys = [f"model={args.model}", f"data={data}", f"imgsz={args.imgsz}", f"batch={args.batch}",
                "epochs=2", "val=false", f"workers={args.workers}", f"project={project}", "name=bench",
                f"device={device}"]
        cli = ["-m", "libreyolo_core.cli", "train", *keys]
        cmd = [sys.executable, *cli] if nproc == 1 else [
            sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *cli]
        env = dict(os.environ)
        if device == "cpu":
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if out.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
        rows = list(csv.DictReader((Path(project) / "bench" / "results.csv").read_text().splitlines()))
        images = 128 // args.batch * args.batch  # drop_last
        return images / float(rows[-1]["epoch_time_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="yolo9-t")
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    import torch

    device = "auto" if torch.cuda.device_count() >= args.nproc else "cpu"
    data = coco128_copy()
    single = epoch2_images_per_s(1, data, args, device)
    ranks = epoch2_images_per_s(args.nproc, data, args, device)
    kind = "cuda" if device == "auto" else "cpu"
    print(f"ddp_throughput coco128 {args.model}@{args.imgsz} batch={args.batch} {kind}: 1 process "
          f"{single:.2f} img/s, {args.nproc} ranks {ranks:.2f} img/s ({ranks / single:.2f}x)")


if __name__ == "__main__":
    main()
