"""How many loader workers the loader-bound profile needs before it stops being loader-bound.

The configuration is the loader-bound one of ``bench/tune_accuracy.py`` (yolo9-t,
``imgsz=64``, ``batch=32``, mosaic and mixup on, CPU: every sample decodes and mixes up to
eight full-size coco128 JPEGs for a 64-pixel image, and the network is tiny). For
``workers`` = 0, 1, ... ``--max-workers`` it runs ``--repeat`` profile trials
(:func:`~libreyolo_core.profiler.trial.run_trial`, a ``--warmup`` + ``--steps`` window,
each trial a fresh process) and takes the verdict most trials gave and the median
data-wait share of the step.

With ``--before DIR`` (a checkout of the code before issue 23's loader work, e.g.
``git worktree add /tmp/before ee523a4^``) the same trials also run on that code, the
two alternated trial by trial, so both sides see the same machine.

Prints ONE line, e.g.::

    loader_workers yolo9-t imgsz=64 batch=32 mosaic+mixup cpu (2 CPUs) repeat=3 load=0.4-2.1:
    now not loader-bound from workers=1 (0: dataloader 71%, 1: compute 9%, 2: compute 4%) |
    before: not loader-bound from workers=2 (0: dataloader 83%, 1: dataloader 41%, ...)

"not loader-bound from workers=N" is the smallest worker count whose verdict is not
``dataloader`` (``none`` when every count tried was loader-bound).

Usage: ``python bench/loader_workers.py [--max-workers 2] [--repeat 3] [--warmup 1]
[--steps 3] [--before DIR]``
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import coco128_copy  # noqa: E402
from tune_accuracy import LOADER  # noqa: E402

CHILD = textwrap.dedent("""
    import io, json, sys
    from libreyolo_core.profiler.trial import run_trial
    a = json.loads(sys.argv[1])
    r = run_trial(a["data"], "yolo9-t", project=a["project"], name="prof", warmup=a["warmup"],
                  steps=a["steps"], stdout=io.StringIO(), **a["keys"])
    print("TRIAL", json.dumps({"verdict": r.verdict, "dataload_frac": r.dataload_frac}))
""")


def trial(src: Path, data: Path, workers: int, warmup: int, steps: int) -> tuple[str, float]:
    """``(verdict, data-wait share)`` of one profile trial run with the code in ``src``."""
    keys = {**LOADER, "workers": workers}
    if "cache_recent_mb" not in (src / "libreyolo_core" / "config.py").read_text():
        keys.pop("cache_recent_mb", None)  # code from before the recently decoded images' cache
    with tempfile.TemporaryDirectory() as project:
        args = {"data": str(data), "project": project, "warmup": warmup, "steps": steps, "keys": keys}
        env = {**os.environ, "PYTHONPATH": str(src)}
        out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True,
                             text=True, check=False, env=env, cwd=project)
    if out.returncode != 0:
        raise SystemExit(f"trial workers={workers} ({src}) failed:\n{out.stderr[-3000:]}")
    res = json.loads(next(ln.split(" ", 1)[1] for ln in out.stdout.splitlines() if ln.startswith("TRIAL")))
    return str(res["verdict"]), float(res["dataload_frac"] or 0.0)


def summary(results: dict[int, list[tuple[str, float]]]) -> str:
    """``not loader-bound from workers=N (0: verdict share%, ...)``."""
    parts, first = [], None
    for w, rs in sorted(results.items()):
        verdict = collections.Counter(v for v, _ in rs).most_common(1)[0][0]
        share = statistics.median(f for _, f in rs)
        parts.append(f"{w}: {verdict} {share:.0%}")
        if verdict != "dataloader" and first is None:
            first = w
    return f"not loader-bound from workers={'none' if first is None else first} ({', '.join(parts)})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--before", type=Path, default=None, help="a checkout of the code before the change")
    a = p.parse_args()
    data = coco128_copy()
    sides = {"now": HERE.parent} | ({"before": a.before.resolve()} if a.before else {})
    results: dict[str, dict[int, list[tuple[str, float]]]] = {s: {} for s in sides}
    load0 = os.getloadavg()[0]
    for _ in range(a.repeat):
        for w in range(a.max_workers + 1):
            for side, src in sides.items():
                r = trial(src, data, w, a.warmup, a.steps)
                results[side].setdefault(w, []).append(r)
                print(f"{side} workers={w}: {r[0]} {r[1]:.0%}", file=sys.stderr, flush=True)
    head = (f"loader_workers yolo9-t imgsz={LOADER['imgsz']} batch={LOADER['batch']} mosaic+mixup cpu "
            f"({len(os.sched_getaffinity(0))} CPUs) repeat={a.repeat} load={load0:.1f}-{os.getloadavg()[0]:.1f}")
    print(f"{head}: " + " | ".join(f"{side} {summary(results[side])}" for side in sides))


if __name__ == "__main__":
    main()
