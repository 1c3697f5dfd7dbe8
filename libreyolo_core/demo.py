"""``make demo``: the main job on this machine, end to end.

Today (engine only): generate the synthetic sample dataset, scan it, train yolo9-t for a
few epochs on the CPU (or GPU when present), validate, and predict on a val image.
``--data path/to/data.yaml`` runs the same on any YOLO dataset.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", help="dataset yaml (default: generate the synthetic sample)")
    parser.add_argument("--model", default="yolo9-t")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--imgsz", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--project", default="runs/demo")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    from libreyolo_core import LibreYOLO
    from libreyolo_core.cli import run

    t0 = time.perf_counter()
    data = args.data
    if data is None:
        from libreyolo_core.data.sample import generate_sample_dataset

        out = Path(tempfile.mkdtemp(prefix="libreyolo-sample-"))
        data = str(generate_sample_dataset(out, seed=0))
        print(f"== synthetic sample dataset (shapes on textures): {data}")
    print("== dataset scan")
    if run(["checks", f"data={data}"]) != 0:
        return 1
    print(f"== training {args.model}")
    model = LibreYOLO(args.model)
    result = model.train(data=data, epochs=args.epochs, imgsz=args.imgsz, batch=args.batch,
                         workers=2, project=args.project, name="exp", no_aug_epochs=1,
                         warmup_epochs=1, lr0=0.01)
    print(f"== result: best epoch {result['best_epoch']}, mAP50={result.get('mAP50', 0):.4f}, "
          f"mAP50-95={result.get('mAP50-95', 0):.4f}")
    print(f"   run directory: {result['save_dir']}")
    print(f"   best weights:  {result['best_checkpoint']}")
    print(f"== done in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
