"""mAP of yolo9-t trained from scratch on coco128 after a fixed schedule.

Trains on a copy of coco128 (train = val, as coco128.yaml says) for ``--epochs`` epochs at
``--imgsz`` with batch 16 and the family's recipe, then prints one line with the final
validation mAP50-95 / mAP50 and the wall time. From scratch on 128 images this measures
how fast the recipe learns, not COCO accuracy.

Usage: python bench/coco128_map.py [--model yolo9-t] [--epochs 30] [--imgsz 320]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import coco128_copy  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="yolo9-t")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    from libreyolo_core import LibreYOLO

    data = coco128_copy()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as project:
        m = LibreYOLO(args.model).train(
            data=data, epochs=args.epochs, imgsz=args.imgsz, batch=args.batch, workers=args.workers,
            project=project, eval_interval=max(args.epochs // 3, 1), save_period=0,
            no_aug_epochs=max(args.epochs // 5, 1), warmup_epochs=min(3, args.epochs // 5),
        )
    print(f"coco128_map {args.model} epochs={args.epochs} imgsz={args.imgsz} batch={args.batch}: "
          f"mAP50-95={m.get('mAP50-95', 0):.4f} mAP50={m.get('mAP50', 0):.4f} "
          f"best_epoch={m['best_epoch']} time={time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
