"""Share of a training step spent in the loss and in its label assigner (SimOTA / TAL).

Real coco128 batches (mosaic on, so the target counts are a training run's) are loaded
once; then each model runs ``--steps`` full steps without data loading (forward, loss,
backward x batch, SGD step) after two warm-up steps. The loss is timed around its call;
YOLOX's SimOTA assignment is timed inside the loss (``YOLOXLoss.time_assign``, which
synchronises CUDA around it). YOLOv9's TAL assignment is part of its loss time.

Prints one line, e.g.
``loss_share coco128 batch=16 cpu: yolox-t@416 step 1500 ms, loss 4.1 %, SimOTA 1.8 % | ...``

Usage: python bench/loss_share.py [--models yolo9-t,yolox-n,yolox-t,yolox-s] [--steps 6]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import coco128_copy  # noqa: E402


def measure(data: Path, model_name: str, imgsz: int, batch: int, steps: int, device) -> dict[str, float]:
    import torch

    from libreyolo_core.config import resolve_config
    from libreyolo_core.data.config import load_data_config
    from libreyolo_core.data.dataset import YOLODataset
    from libreyolo_core.data.loader import build_dataloader
    from libreyolo_core.data.scan import scan_split
    from libreyolo_core.models.registry import parse_model_name

    cfg = resolve_config({"model": model_name, "data": str(data), "imgsz": imgsz})
    family, size = parse_model_name(model_name)
    report = scan_split(load_data_config(data), "train")
    dataset = YOLODataset(report, imgsz, augment=True, aug=cfg.augment, seed=0)
    loader = build_dataloader(dataset, batch, 0, shuffle=True, seed=0, drop_last=True)
    loader.sampler.set_epoch(0)
    batches = [b for _, b in zip(range(steps + 2), loader, strict=False)]

    torch.manual_seed(0)
    model = family.build_model(size, len(report.names)).to(device).train()
    loss_fn = family.build_loss(model, cfg)
    timed_assign = hasattr(loss_fn, "time_assign")
    if timed_assign:
        loss_fn.time_assign = True
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    step_s, loss_s, assign_s = [], [], []
    for i, b in enumerate(batches):
        imgs = family.preprocess(b.images.to(device))
        targets = b.targets.to(device)
        sync()
        t0 = time.perf_counter()
        out = model(imgs)
        sync()
        t1 = time.perf_counter()
        loss, _ = loss_fn(out, targets, imgs.shape[0])
        sync()
        t2 = time.perf_counter()
        (loss * imgs.shape[0]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        t3 = time.perf_counter()
        if i >= 2:
            step_s.append(t3 - t0)
            loss_s.append(t2 - t1)
            assign_s.append(loss_fn.last_assign_s if timed_assign else float("nan"))
    step = statistics.median(step_s)
    return {"step_ms": step * 1e3, "loss_pct": 100 * statistics.median(loss_s) / step,
            "assign_pct": 100 * statistics.median(assign_s) / step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="yolo9-t,yolox-n,yolox-t,yolox-s")
    parser.add_argument("--imgsz", type=int, default=0, help="0 = each family's default size")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    import torch

    from libreyolo_core.models.registry import parse_model_name

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = coco128_copy()
    parts = []
    for name in args.models.split(","):
        family, size = parse_model_name(name)
        imgsz = args.imgsz or min(family.sizes[size], 416)
        r = measure(data, name, imgsz, args.batch, args.steps, device)
        assign = "TAL inside the loss" if r["assign_pct"] != r["assign_pct"] else f"SimOTA {r['assign_pct']:.1f} %"
        parts.append(f"{name}@{imgsz} step {r['step_ms']:.0f} ms, loss {r['loss_pct']:.1f} %, {assign}")
    print(f"loss_share coco128 batch={args.batch} {device.type}: " + " | ".join(parts))


if __name__ == "__main__":
    main()
