"""How close a preflight's epoch time is to the epochs the run then measures (CPU, coco128).

Trains yolo9-t on a copy of coco128 (128 images; validation on the same 128) at imgsz 320,
batch 16 on the CPU with ``preflight=True``: ``--epochs`` epochs, the last
``--no-aug-epochs`` without mosaic, so both preflight phases are estimated. Compares:

- the estimated training time of an epoch of each phase with the mean measured
  ``epoch_time_s`` of that phase's epochs (``results.csv``), and of all epochs;
- the estimated validation pass with the measured ``val_time_s``;
- the estimated total (the ETA at the start) with the engine's measured wall time minus
  what the preflight itself took.

Prints ONE line, e.g.::

    preflight_accuracy yolo9-t coco128 imgsz=320 batch=16 cpu: epoch est 21.4 s vs 22.9 s
    measured (-6.6%; mosaic -4%, no mosaic -9%) | val est 9.1 s vs 7.7 s (+18%) | total est
    127 s vs 133 s (-4.5%) | load avg 2.1-2.6

Run it with ``OMP_NUM_THREADS`` unset (the defaults a user gets); note the machine's load.

Usage: ``python bench/preflight_accuracy.py [--epochs 4] [--no-aug-epochs 2] [--workers N]``
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import coco128_copy  # noqa: E402


def _pct(est: float, real: float) -> str:
    return f"{100 * (est - real) / real:+.1f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--no-aug-epochs", type=int, default=2)
    ap.add_argument("--imgsz", type=int, default=320)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=None, help="default: the training default")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from libreyolo_core.facade import LibreYOLO

    data = coco128_copy()
    project = Path(tempfile.mkdtemp(prefix="bench-preflight-"))
    loads: list[float] = []
    done = threading.Event()

    def sample_load() -> None:
        while not done.wait(5.0):
            loads.append(os.getloadavg()[0])

    sampler = threading.Thread(target=sample_load, daemon=True)
    sampler.start()
    keys = {"workers": args.workers} if args.workers is not None else {}
    t0 = time.perf_counter()
    res = LibreYOLO("yolo9-t").train(data=str(data), epochs=args.epochs, imgsz=args.imgsz,
                                     batch=args.batch, device="cpu", preflight=True,
                                     no_aug_epochs=args.no_aug_epochs, project=str(project),
                                     name="run", save_period=0, **keys)
    wall = time.perf_counter() - t0
    done.set()
    pf = res["preflight"]
    rows = list(csv.DictReader((project / "run" / "results.csv").read_text(encoding="utf-8").splitlines()))
    train = [float(r["epoch_time_s"]) for r in rows]
    val = [float(r["val_time_s"]) for r in rows if r["validated"] == "1"]
    aug = max(args.epochs - args.no_aug_epochs, 0)
    est_by = {p["name"]: p["epoch_s"] for p in pf["phases"]}
    est_mean = sum(p["epoch_s"] * p["epochs"] for p in pf["phases"]) / args.epochs
    phase_txt = []
    for name, part in (("mosaic", train[:aug]), ("no mosaic", train[aug:])):
        if part and name in est_by:
            phase_txt.append(f"{name} {est_by[name]:.1f} s vs {statistics.fmean(part):.1f} s "
                             f"({_pct(est_by[name], statistics.fmean(part))})")
    run_s = wall - pf["measured_s"]  # the run after the preflight, set-up included
    print(json.dumps({"estimate": pf, "epoch_time_s": train, "val_time_s": val, "wall_s": wall,
                      "loadavg": loads}), file=sys.stderr)
    print(f"preflight_accuracy yolo9-t coco128 imgsz={args.imgsz} batch={args.batch} cpu "
          f"(workers {args.workers if args.workers is not None else 'default'}): "
          f"epoch est {est_mean:.1f} s vs {statistics.fmean(train):.1f} s measured "
          f"({_pct(est_mean, statistics.fmean(train))}; {'; '.join(phase_txt)}; first epoch "
          f"{train[0]:.1f} s) | val est {pf['val_s']:.1f} s vs {statistics.fmean(val):.1f} s "
          f"({_pct(pf['val_s'], statistics.fmean(val))}) | total est {pf['total_s']:.0f} s vs "
          f"{run_s:.0f} s ({_pct(pf['total_s'], run_s)}) | preflight took {pf['measured_s']:.0f} s"
          f" | load avg {min(loads or [0]):.1f}-{max(loads or [0]):.1f}, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}")


if __name__ == "__main__":
    main()
