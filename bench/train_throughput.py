"""Training throughput: images/s of full training steps and peak memory.

Full steps = data loading + augmentation, forward, loss, backward, optimizer, EMA. Each
configuration trains 2 epochs of coco128 without validation in its own process; the
second epoch is timed (the first warms up allocators and caches). Peak memory is the
process's max RSS on CPU, ``torch.cuda.max_memory_allocated`` on CUDA.

Prints one line, e.g.
``train_throughput coco128 batch=16 cpu: yolo9-t@320 9.1 img/s 1.9 GB | ...``

With ``--ultralytics PATH`` (a folder where ``pip install --target PATH ultralytics ...``
put the Ultralytics trainer, or ``auto`` when it is importable) the same configurations
also run through Ultralytics' trainer on its ``yolov9t/s.yaml`` (2.13 M / 7.3 M params,
the closest architecture), timed the same way (its second epoch's training part), and the
line gives our images/s as a ratio of theirs.

Models: yolo9-t/s, yolox-n/t/s (no Ultralytics comparison for YOLOX).

Usage: python bench/train_throughput.py [--models yolo9-t,yolo9-s] [--imgsz 320,640]
       [--ultralytics /tmp/ul]
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import coco128_copy  # noqa: E402

CHILD = r"""
import json, resource, sys, torch
from libreyolo_core import LibreYOLO
args = json.loads(sys.argv[1])
m = LibreYOLO(args["model"])
m.train(data=args["data"], epochs=2, imgsz=args["imgsz"], batch=args["batch"], workers=args["workers"],
        val=False, project=args["project"], name="bench", exist_ok=True, save_period=0)
peak = (torch.cuda.max_memory_allocated() if torch.cuda.is_available()
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
print("PEAK", peak)
"""


ULTRA_CHILD = r"""
import json, sys, time
args = json.loads(sys.argv[1])
from ultralytics import YOLO
marks = {}
def start(tr): marks[tr.epoch] = [time.perf_counter()]
def end(tr): marks[tr.epoch].append(time.perf_counter())
m = YOLO(args["arch"])
m.add_callback("on_train_epoch_start", start)
m.add_callback("on_train_epoch_end", end)
m.train(data=args["data"], epochs=2, imgsz=args["imgsz"], batch=args["batch"], workers=args["workers"],
        device="cpu", amp=False, val=False, plots=False, project=args["project"], name="u",
        exist_ok=True, verbose=False, close_mosaic=0)
t0, t1 = marks[1]
print("EPOCH", t1 - t0)
"""


def run_ultralytics(
    data: Path, model: str, imgsz: int, batch: int, workers: int, path: str
) -> float:
    """Images/s of Ultralytics' trainer (second epoch, training part only)."""
    import os

    import yaml

    # Ultralytics has no YOLOX: None = no comparison for that model
    arch = {"yolo9-t": "yolov9t.yaml", "yolo9-s": "yolov9s.yaml", "yolox-n": None,
            "yolox-t": None, "yolox-s": None}[model]
    if arch is None:
        return float("nan")
    with tempfile.TemporaryDirectory() as project:
        cfg = yaml.safe_load(Path(data).read_text())
        cfg["path"] = str(Path(data).parent.resolve())
        abs_yaml = Path(project) / "data.yaml"
        abs_yaml.write_text(yaml.safe_dump(cfg))
        env = {**os.environ, "YOLO_OFFLINE": "1"}
        if path != "auto":
            env["PYTHONPATH"] = path + os.pathsep + env.get("PYTHONPATH", "")
        args = {
            "arch": arch,
            "data": str(abs_yaml),
            "imgsz": imgsz,
            "batch": batch,
            "workers": workers,
            "project": project,
        }
        out = subprocess.run(
            [sys.executable, "-c", ULTRA_CHILD, json.dumps(args)],
            capture_output=True,
            text=True,
            check=False,
            env=env,
            cwd=project,
        )
        if out.returncode != 0:
            raise SystemExit(f"ultralytics {arch}@{imgsz} failed:\n{out.stderr[-3000:]}")
        seconds = float(
            next(ln.split()[1] for ln in out.stdout.splitlines() if ln.startswith("EPOCH"))
        )
        return (128 // batch * batch) / seconds


def run_one(data: Path, model: str, imgsz: int, batch: int, workers: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as project:
        args = {"model": model, "data": str(data), "imgsz": imgsz, "batch": batch,
                "workers": workers, "project": project}
        out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True,
                             text=True, check=False)
        if out.returncode != 0:
            raise SystemExit(f"{model}@{imgsz} failed:\n{out.stderr[-3000:]}")
        rows = list(csv.DictReader((Path(project) / "bench" / "results.csv").read_text().splitlines()))
        epoch_time = float(rows[-1]["epoch_time_s"])
        n_images = 128 // batch * batch  # drop_last
        peak = float(next(ln.split()[1] for ln in out.stdout.splitlines() if ln.startswith("PEAK")))
        return n_images / epoch_time, peak / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="yolo9-t,yolo9-s")
    parser.add_argument("--imgsz", default="320,640")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--ultralytics", default=None, help="path of an Ultralytics install, or auto"
    )
    args = parser.parse_args()
    import torch

    data = coco128_copy()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    parts = []
    for model in args.models.split(","):
        for imgsz in (int(s) for s in args.imgsz.split(",")):
            ips, peak = run_one(data, model, imgsz, args.batch, args.workers)
            part = f"{model}@{imgsz} {ips:.2f} img/s {peak:.2f} GB"
            if args.ultralytics and not model.startswith("yolox"):
                theirs = run_ultralytics(
                    data, model, imgsz, args.batch, args.workers, args.ultralytics
                )
                part += f" (ultralytics {theirs:.2f} img/s, ratio {ips / theirs:.2f}x)"
            parts.append(part)
    print(f"train_throughput coco128 batch={args.batch} workers={args.workers} {device}: " + " | ".join(parts))


if __name__ == "__main__":
    main()
