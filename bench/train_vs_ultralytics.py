"""The training step and a whole training run, ours against Ultralytics', in the same run.

Prints ONE result line, e.g.::

    train_vs_ultralytics yolo9-t coco128 imgsz=320 batch=16 epochs=3 workers=0 threads=2
    rounds=3 load=1.1-1.4 ultralytics=8.4.190: step ours 1.55 s, ours-recent0 1.81 s,
    ultralytics 1.67 s -> ours 1.08x [1.02-1.10], ours-recent0 0.92x [...]; end to end ours
    60.3 s, ours-recent0 65.0 s, ultralytics 73.2 s -> ours 1.21x [...], ours-recent0 1.13x [...]

Conditions (issue 23): yolo9-t against Ultralytics' ``yolov9t.yaml`` (2.13 M parameters
each side), both from scratch, coco128, imgsz 320, batch 16, 3 epochs with each tool's
validation after every epoch (and Ultralytics' final validation of ``best.pt``), mosaic on
in every epoch (ours ``no_aug_epochs=0``, theirs ``close_mosaic=0``), mixup off, plots
off, loader workers 0, two torch threads (``OMP_NUM_THREADS=2``; Ultralytics' own choice on
a CPU, ``min(8, cpus - 1)`` threads, is overridden to 2), CPU, AMP off.

- *step*: a training epoch's time (loading, forward, loss, backward, optimizer, EMA; no
  validation) divided by its 8 steps; the mean of epochs 2 and 3 (epoch 1 warms
  allocators up). Ours: ``epoch_time_s`` of ``results.csv``; Ultralytics: its
  ``on_train_epoch_start`` to ``on_train_epoch_end`` callbacks.
- *end to end*: the wall time of the whole training process, from its start (imports
  included) to its exit.

Ours runs twice per round: with its defaults, and with ``cache_recent_mb=0`` (no store of
recently decoded images: every mosaic tile decoded, 3.6 JPEG decodes per sample; the
default keeps 256 MiB per loader process, which holds coco128, so from the first epoch on
each image is decoded once; samples are the same either way, docs/performance.md).

Every measurement is a fresh process; the tools alternate ``--rounds`` times (ours, theirs,
ours, ...). Rates are the medians of the rounds; each ratio (theirs / ours time, so above
1 means we are faster) is the median (and range) of the per-round ratios, so a change of
the machine's load hits both sides alike. The 1-minute load average at the start and the
end is part of the line.

Ultralytics is never installed in the product: give a virtual environment that has
``ultralytics`` (8.4.190 measured) with ``--ultralytics-venv DIR`` or ``$ULTRALYTICS_VENV``;
without one only our figures print.

Usage: ``python bench/train_vs_ultralytics.py [--ultralytics-venv DIR] [--rounds 3]
[--epochs 3] [--imgsz 320] [--batch 16]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import coco128_copy  # noqa: E402

OURS = textwrap.dedent("""
    import csv, json, sys
    from pathlib import Path
    import torch
    torch.set_num_threads(2)
    from libreyolo_core import LibreYOLO
    a = json.loads(sys.argv[1])
    LibreYOLO("yolo9-t").train(data=a["data"], epochs=a["epochs"], imgsz=a["imgsz"], batch=a["batch"],
        workers=0, device="cpu", no_aug_epochs=0, mixup=0.0, plots=False, project=a["project"],
        name="ours", exist_ok=True, **a.get("keys", {}))
    rows = list(csv.DictReader((Path(a["project"]) / "ours" / "results.csv").read_text().splitlines()))
    print("EPOCHS", json.dumps([float(r["epoch_time_s"]) for r in rows]))
""")

ULTRA = textwrap.dedent("""
    import json, sys, time
    import torch
    torch.set_num_threads(2)
    import ultralytics.utils.torch_utils as tu
    tu.NUM_THREADS = 2  # it would set min(8, cpus - 1) torch threads on a CPU: 1 on 2 cores
    from ultralytics import YOLO
    a = json.loads(sys.argv[1])
    marks = {}
    def start(tr): marks[tr.epoch] = [time.perf_counter()]
    def end(tr): marks[tr.epoch].append(time.perf_counter())
    m = YOLO("yolov9t.yaml")
    m.add_callback("on_train_epoch_start", start)
    m.add_callback("on_train_epoch_end", end)
    m.train(data=a["data"], epochs=a["epochs"], imgsz=a["imgsz"], batch=a["batch"], workers=0,
            device="cpu", amp=False, close_mosaic=0, mixup=0.0, plots=False, project=a["project"],
            name="u", exist_ok=True, verbose=False)
    print("EPOCHS", json.dumps([marks[e][1] - marks[e][0] for e in sorted(marks)]))
""")


def run(python: str, code: str, args: dict, env: dict[str, str]) -> tuple[float, float]:
    """``(step seconds, end-to-end seconds)`` of one training process."""
    with tempfile.TemporaryDirectory() as project:
        args = {**args, "project": project}
        t0 = time.perf_counter()
        out = subprocess.run([python, "-c", code, json.dumps(args)], capture_output=True,
                             text=True, check=False, env=env, cwd=project)
        wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{python} failed:\n{out.stderr[-3000:]}")
    epochs = json.loads(next(ln.split(" ", 1)[1] for ln in out.stdout.splitlines()
                             if ln.startswith("EPOCHS")))
    steps = 128 // args["batch"]
    later = epochs[1:] or epochs
    return statistics.mean(later) / steps, wall


def ultra_yaml(ours: Path) -> Path:
    """Ultralytics resolves ``path:`` against its own datasets folder: give it an absolute one."""
    text = ours.read_text()
    out = ours.with_name("ultra.yaml")
    lines = [ln for ln in text.splitlines() if not ln.startswith("path:")]
    out.write_text(f"path: {ours.parent}\n" + "\n".join(lines) + "\n")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ultralytics-venv", default=os.environ.get("ULTRALYTICS_VENV"),
                   help="a venv with ultralytics installed (default $ULTRALYTICS_VENV)")
    p.add_argument("--rounds", type=int, default=3, help="alternated rounds (default 3)")
    p.add_argument("--epochs", type=int, default=3, help="epochs of each run, >= 2 (default 3)")
    p.add_argument("--imgsz", type=int, default=320, help="default 320")
    p.add_argument("--batch", type=int, default=16, help="1-128, default 16 (coco128 has 128 images)")
    a = p.parse_args()
    if a.rounds < 1 or a.epochs < 2 or not 1 <= a.batch <= 128 or a.imgsz < 32 or a.imgsz % 32:
        p.error("needs --rounds >= 1, --epochs >= 2 (the step is timed after the first epoch), "
                "--batch 1-128 and --imgsz a multiple of 32")
    data = coco128_copy()
    env = {**os.environ, "OMP_NUM_THREADS": "2", "YOLO_OFFLINE": "1",
           "PYTHONPATH": str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    ultra_py = str(Path(a.ultralytics_venv) / "bin" / "python") if a.ultralytics_venv else None
    args = {"epochs": a.epochs, "imgsz": a.imgsz, "batch": a.batch}
    load0 = os.getloadavg()[0]
    version = ""
    got: dict[str, list[tuple[float, float]]] = {"ours": [], "ours-recent0": [], "ultralytics": []}
    recent0 = {"cache_recent_mb": 0}
    for r in range(a.rounds):
        sides = [("ours", sys.executable, OURS, {"data": str(data)}),
                 ("ours-recent0", sys.executable, OURS, {"data": str(data), "keys": recent0}),
                 ("ultralytics", ultra_py, ULTRA, {"data": str(ultra_yaml(data))})]
        for side, python, code, extra in sides if r % 2 == 0 else sides[::-1]:
            if python is None:
                continue
            res = run(python, code, {**args, **extra}, env)
            got[side].append(res)
            print(f"round {r + 1} {side}: step {res[0]:.3f} s, end to end {res[1]:.1f} s",
                  file=sys.stderr, flush=True)
    if ultra_py:
        version = subprocess.run([ultra_py, "-c", "import ultralytics; print(ultralytics.__version__)"],
                                 capture_output=True, text=True, check=False, env=env).stdout.strip()
    head = (f"train_vs_ultralytics yolo9-t coco128 imgsz={a.imgsz} batch={a.batch} epochs={a.epochs} "
            f"workers=0 threads=2 rounds={a.rounds} load={load0:.1f}-{os.getloadavg()[0]:.1f}")
    med = {side: [statistics.median(x[k] for x in v) for k in (0, 1)] for side, v in got.items() if v}
    parts = []
    for k, (what, unit) in enumerate((("step", ".2f"), ("end to end", ".1f"))):
        text = f"{what} " + ", ".join(f"{side} {m[k]:{unit}} s" for side, m in med.items())
        if got["ultralytics"]:
            text += " -> " + ", ".join(f"{side} {ratio(got[side], got['ultralytics'], k)}"
                                       for side in ("ours", "ours-recent0"))
        parts.append(text)
    tail = f" ultralytics={version}" if version else " (no Ultralytics venv given: no comparison)"
    print(f"{head}{tail}: " + "; ".join(parts))


def ratio(ours: list[tuple[float, float]], theirs: list[tuple[float, float]], k: int) -> str:
    """Theirs / ours time per round (above 1: we are faster): median [range]."""
    r = [t[k] / o[k] for o, t in zip(ours, theirs, strict=True)]
    return f"{statistics.median(r):.2f}x [{min(r):.2f}-{max(r):.2f}]"


if __name__ == "__main__":
    main()
