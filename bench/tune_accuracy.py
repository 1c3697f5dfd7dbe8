"""How often a tune gives the right answer on the CPU, on a copy of coco128.

Two configurations of yolo9-t, each tuned ``--runs`` times (:func:`run_tune`, ``--repeat``
trials per configuration, a ``--warmup`` + ``--steps`` window):

- **loader-bound**: ``workers=0``, ``imgsz=64``, ``batch=32``, mosaic and mixup on (each
  sample decodes and mixes 8 full-size JPEGs for a 64-pixel image, the network is tiny):
  right when the tune recommends more ``workers`` and/or ``cache=ram`` (a recommendation is
  always significant beyond 2 x SE, at least ``min_gain``, every trial faster, and not
  explained by the machine's load);
- **compute-bound**: ``workers=0``, ``imgsz=224``, ``batch=8``, no mosaic or mixup,
  ``cache=ram`` (loading is nearly free): right when the answer is "no significant lever
  on this device" (on a CPU a compute verdict names no lever, so this checks that the
  verdict holds under load and that nothing else gets recommended);
- **A/A** (the noise check): the loader-bound configuration profiled ``--repeat`` times,
  twice, and the second set judged against the first by the tune's rule (:func:`judge`):
  right when it is *not* recommendable (the same configuration cannot be faster).

Prints ONE line, e.g.::

    tune_accuracy cpu (2 cores): loader-bound right 5/5 (workers/cache=ram, gain +160% median) |
    compute-bound right 5/5 (no significant lever) | 9.8 min, load avg 2.1-3.4, other processes
    38% of the CPU during the trials

The machine's load (1-minute load average before and after each tune, other processes'
share of the CPU during the trials) is printed with it: a loaded machine makes the tune
answer "no significant lever" more often, never recommend noise.

Usage: ``python bench/tune_accuracy.py [--runs 5] [--repeat 3] [--warmup 1] [--steps 3]
[--no-aa]``
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import coco128_copy  # noqa: E402

#: cache_recent_mb=0: coco128 at 64 px fits the recently decoded images' default 256 MiB, and
#: with each image decoded once the run is no longer loader-bound
LOADER = {"imgsz": 64, "batch": 32, "workers": 0, "mosaic": 1.0, "mixup": 1.0, "device": "cpu",
          "cache_recent_mb": 0}
COMPUTE = {"imgsz": 224, "batch": 8, "workers": 0, "mosaic": 0.0, "mixup": 0.0, "cache": "ram",
           "device": "cpu"}


def a_a(data: Path, root: Path, opts, others: list[float]) -> bool:
    """Profile the loader-bound configuration ``repeat`` times, twice; True when the tune's
    rule does not recommend the second set over the first."""
    from libreyolo_core.profiler.cli import aggregate
    from libreyolo_core.profiler.trial import run_trial
    from libreyolo_core.profiler.tune import judge

    sides = []
    for side in ("a", "b"):
        results = [run_trial(data, "yolo9-t", project=root, name=f"{side}_{k}", warmup=opts.warmup,
                             steps=opts.steps, stdout=io.StringIO(), profile_trace=False, **LOADER)
                   for k in range(opts.repeat)]
        others += [r.load.other_cpu_frac for r in results if r.load and r.load.other_cpu_frac is not None]
        sides.append(aggregate([r.profile for r in results], [str(r.profile_path) for r in results]))
    _, verdict = judge(sides[0], sides[1], min_gain=opts.min_gain)
    return not verdict["recommendable"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--verbose", action="store_true", help="print each tune's table")
    ap.add_argument("--no-aa", dest="aa", action="store_false", help="skip the A/A noise check")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from libreyolo_core.profiler.tune import NO_LEVER, TuneOptions, format_tune, run_tune

    data = coco128_copy()
    opts = TuneOptions(repeat=args.repeat, warmup=args.warmup, steps=args.steps, budget_s=None)
    root = Path(tempfile.mkdtemp(prefix="bench-tune-"))
    t0 = time.monotonic()
    loads: list[float] = []
    others: list[float] = []
    outcome: dict[str, list[bool]] = {"loader": [], "compute": [], "aa": []}
    gains: list[float] = []
    picks: list[str] = []
    for run in range(args.runs):
        for name, base in (("loader", LOADER), ("compute", COMPUTE)):
            loads.append(os.getloadavg()[0])
            res = run_tune(data, "yolo9-t", run_dir=root / f"{name}_{run}", base=base,
                           options=opts, stdout=io.StringIO())
            loads.append(os.getloadavg()[0])
            for row in [res["baseline"], *res["candidates"]]:
                if row.get("other_cpu_frac") is not None:
                    others.append(row["other_cpu_frac"])
            rec = res["recommended"]
            if name == "loader":
                right = rec is not None and bool({"workers", "cache"} & set(rec["params"]))
                if rec is not None:
                    gains.append(rec["gain"])
                    picks.append(" ".join(f"{k}={v}" for k, v in rec["params"].items()))
            else:
                right = rec is None and res["answer"].startswith(NO_LEVER)
            outcome[name].append(right)
            print(f"[{name} {run + 1}/{args.runs}] {'right' if right else 'WRONG'}: "
                  f"{res['answer']}", file=sys.stderr, flush=True)
            if args.verbose:
                print(format_tune(res), file=sys.stderr, flush=True)
        if args.aa:
            outcome["aa"].append(a_a(data, root / f"aa_{run}", opts, others))
            print(f"[A/A {run + 1}/{args.runs}] {'right' if outcome['aa'][-1] else 'WRONG'}",
                  file=sys.stderr, flush=True)
    minutes = (time.monotonic() - t0) / 60
    lo, co = outcome["loader"], outcome["compute"]
    kinds = sorted(set(picks))
    print(f"tune_accuracy cpu ({os.cpu_count()} cores, repeat {args.repeat}, window "
          f"{args.warmup}+{args.steps}): loader-bound right {sum(lo)}/{len(lo)} "
          f"(recommended {', '.join(kinds) or 'nothing'}; gain "
          f"{100 * statistics.median(gains):+.0f}% median)" if gains else
          f"tune_accuracy cpu ({os.cpu_count()} cores): loader-bound right {sum(lo)}/{len(lo)} "
          "(nothing recommended)", end="")
    print(f" | compute-bound right {sum(co)}/{len(co)} (no significant lever) | {minutes:.1f} min,"
          f" load avg {min(loads):.1f}-{max(loads):.1f}, other processes "
          f"{100 * statistics.fmean(others):.0f}% of the CPU during the trials (max "
          f"{100 * max(others):.0f}%)"
          + (f" | A/A noise check right {sum(outcome['aa'])}/{len(outcome['aa'])} (the same "
             "configuration never recommended over itself)" if outcome["aa"] else ""))


if __name__ == "__main__":
    main()
