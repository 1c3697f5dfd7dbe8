"""GPU training-step time: eager vs ``cuda_graph=True``, plus the profiler verdict of each.

Method (LibreYOLO's published table): AMP on, batch 8, 640 px, ONE real coco128 batch
(augmented like training) replayed every step, so data loading is excluded. A step is
what the trainer does per batch: preprocess, forward (graph replay or eager) and the
eager loss under autocast, scaled backward, unscale + gradient clipping (``clip_max_norm``),
optimizer step, scaler update, EMA update. Each mode uses a fresh model from the same seed,
runs ``--warmup`` steps (the graph is captured on the 3rd), then times ``--steps`` steps,
synchronising the device around each one, and keeps the fastest. The graphed mode must
really replay (the script fails loudly if capture fell back to eager).

Then each mode runs a real profile (``profile=True, profile_then_stop=True``, 4 workers)
on coco128 and reports the verdict. The window stays inside the first epoch (coco128 at
batch 8: 16 steps), so it is 4 warm-up steps (the graph is captured on the 3rd) plus as many
measured steps as the epoch has left, at most 20.

Prints one line, e.g.
``cuda_graph_step yolo9-t b8 640 float16 NVIDIA H200: eager 61.2 ms [host/launch] |
cuda_graph 35.0 ms [compute] | speed-up 1.75x (goal >= 1.5x: met)``
(everything else goes to stderr). A verdict ending in ``?`` was flagged unreliable by the
profiler (noisy steps or a loaded machine: see its ``confidence``).

Reference: LibreYOLO, RTX 5070 Ti, Windows: yolo9-t 93.6 -> 47.0 ms (1.99x), yolox-t
102.2 -> 90.5 ms (1.13x); Linux gains about a third to a half of that.

Usage: python bench/cuda_graph_step.py [--model yolo9-t] [--batch 8] [--imgsz 640]
       [--steps 24] [--warmup 8] [--no-profile] [--data DATA.yaml]
(``--data``: another dataset instead of coco128, e.g. a generated sample set on a machine
without coco128; the line then names it.)
Exit codes: 0 measured; 1 no CUDA device or the graphed mode fell back to eager.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import coco128_copy  # noqa: E402

GOAL = 1.5  # the project's goal for yolo9-t's GPU step


def one_batch(yaml_path: Path, cfg, batch: int):
    """The first training batch of the dataset (mosaic etc. as in training), on the CPU;
    returns ``(batch, class count, training images)``."""
    from libreyolo_core.data.config import load_data_config
    from libreyolo_core.data.dataset import YOLODataset
    from libreyolo_core.data.loader import build_dataloader
    from libreyolo_core.data.scan import scan_split

    data_cfg = load_data_config(yaml_path)
    ds = YOLODataset(scan_split(data_cfg, "train"), cfg.imgsz, augment=True,
                     aug=cfg.augment, seed=cfg.seed)
    loader = build_dataloader(ds, batch, 0, shuffle=True, seed=cfg.seed, drop_last=True)
    return next(iter(loader)), len(data_cfg.names), len(ds)


def measure(cfg, batch, nc: int, mode: str, warmup: int, steps: int,
            compile_mode: str = "default", device: str = "cuda") -> dict:
    """Time ``steps`` training steps after ``warmup`` in ``mode`` (``eager``, ``cuda_graph``
    or ``compile``: the engine's :class:`CudaGraphManager` / :class:`CompiledNetwork`, as the
    trainer runs them), each one synchronised. Returns ``times_ms`` (the timed steps),
    ``first_s`` (wall seconds of the first step: capture or compile included), ``peak_gib``
    and ``note``. ``device="cpu"`` exists for a dry run of the script's plumbing (no AMP).

    Raises:
        SystemExit: the graphed or compiled mode fell back to eager.
    """
    import torch

    from libreyolo_core.engine.amp import resolve_amp
    from libreyolo_core.engine.compiled import CompiledNetwork
    from libreyolo_core.engine.cuda_graph import CudaGraphManager
    from libreyolo_core.engine.ema import ModelEMA
    from libreyolo_core.engine.optim import build_optimizer
    from libreyolo_core.models.registry import parse_model_name

    family, size = parse_model_name(cfg.model)
    dev = torch.device(device)
    cuda = dev.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    torch.manual_seed(cfg.seed)
    model = family.build_model(size, nc).to(dev).train()
    loss_fn = family.build_loss(model, cfg)
    amp = resolve_amp(True, cfg.amp_dtype, dev)
    optimizer = build_optimizer(model, cfg.optimizer, cfg.lr0, cfg.momentum, cfg.weight_decay,
                                cfg.nesterov)
    ema = ModelEMA(model, cfg.ema_decay, cfg.ema_tau)
    graphs = CudaGraphManager(model) if mode == "cuda_graph" else None
    compiled = CompiledNetwork(model, mode=compile_mode) if mode == "compile" else None
    runner = graphs or compiled
    images = batch.images.to(dev)
    targets = batch.targets.to(dev)

    def step() -> None:
        imgs = family.preprocess(images)  # a new float tensor each step
        with amp.autocast(cache_enabled=graphs is None):
            outputs = model(imgs) if runner is None else runner(imgs)
            loss, _ = loss_fn(outputs, targets, imgs.shape[0])
        del outputs
        scaled = amp.scaler.scale(loss * imgs.shape[0])
        if runner is None:
            scaled.backward()
        else:
            runner.backward(scaled)
        if cfg.clip_max_norm:
            amp.scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_max_norm, foreach=True)
        amp.scaler.step(optimizer)
        amp.scaler.update()
        optimizer.zero_grad(set_to_none=True)
        ema.update(model)

    sync()
    t0 = time.perf_counter()
    step()
    sync()
    first_s = time.perf_counter() - t0
    for _ in range(warmup - 1):
        step()
    sync()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    note = ""
    if graphs is not None:
        if graphs.state != "captured" or graphs.replays < steps:
            raise SystemExit(f"cuda_graph_step: the graphed mode did not replay "
                             f"(state={graphs.state}, replays={graphs.replays}): {graphs.reason}")
        note = f"{graphs.replays} replays"
    if compiled is not None:
        if compiled.state != "compiled" or compiled.eager_steps:
            raise SystemExit(f"compile_step: the compiled mode fell back to eager "
                             f"(state={compiled.state}): {compiled.reason}")
        note = f"{compiled.compiled_steps} compiled steps"
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    print(f"{mode}: fastest {min(times):.1f} ms, median {statistics.median(times):.1f} ms, "
          f"first step {first_s:.1f} s, peak {peak:.2f} GiB {note}", file=sys.stderr)
    return {"times_ms": times, "first_s": first_s, "peak_gib": peak, "note": note}


def step_time(cfg, batch, nc: int, graphed: bool, warmup: int, steps: int) -> tuple[float, str]:
    """Fastest step (ms) of ``steps`` after ``warmup``; returns ``(ms, note)``."""
    res = measure(cfg, batch, nc, "cuda_graph" if graphed else "eager", warmup, steps)
    return min(res["times_ms"]), res["note"]


#: Warm-up steps of the profile window: the graph is captured on the 3rd step.
PROFILE_WARMUP = 4


def verdict(yaml_path: Path, args, graphed: bool, project: Path, epoch_steps: int) -> str:
    """The profiler's verdict of a real profile run in this mode (window inside one epoch of
    ``epoch_steps`` steps; ``"-"`` with a note when the epoch is too short)."""
    from libreyolo_core import LibreYOLO

    steps = min(20, epoch_steps - PROFILE_WARMUP)
    if steps < 2:
        print(f"profile skipped: an epoch has {epoch_steps} steps, too few for a window of "
              f"{PROFILE_WARMUP} + 2", file=sys.stderr)
        return "-"
    with contextlib.redirect_stdout(sys.stderr):
        result = LibreYOLO(args.model).train(
            data=str(yaml_path), epochs=3, batch=args.batch, imgsz=args.imgsz, workers=4,
            amp=True, cuda_graph=graphed, profile=True, profile_then_stop=True,
            profile_warmup=PROFILE_WARMUP, profile_steps=steps,
            profile_open=False, no_aug_epochs=0, val=False, device="0", project=str(project),
            name="graph" if graphed else "eager", exist_ok=True,
        )
    prof = result.get("profile") or {}
    reliable = (prof.get("confidence") or {}).get("reliable")
    return str(prof.get("verdict", "no profile")) + ("" if reliable in (True, None) else "?")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="yolo9-t")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--steps", type=int, default=24, help="timed steps (the fastest is kept)")
    ap.add_argument("--warmup", type=int, default=8, help="untimed steps (capture on the 3rd)")
    ap.add_argument("--no-profile", action="store_true", help="skip the two profile runs")
    ap.add_argument("--data", default=None, help="dataset yaml (default: a copy of coco128)")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("cuda_graph_step: no CUDA device here; this benchmark measures GPU step time "
              "and needs a GPU (nothing was measured)", file=sys.stderr)
        return 1
    if args.warmup < 4:
        ap.error("--warmup must be >= 4 (capture happens on the 3rd step)")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    torch.backends.cudnn.benchmark = True

    from libreyolo_core.config import resolve_config

    yaml_path = Path(args.data) if args.data else coco128_copy()
    cfg = resolve_config({"model": args.model, "data": str(yaml_path), "batch": args.batch,
                          "imgsz": args.imgsz, "amp": True})
    batch, nc, images = one_batch(yaml_path, cfg, args.batch)
    eager_ms, _ = step_time(cfg, batch, nc, False, args.warmup, args.steps)
    gc.collect()  # the eager mode's model and optimizer are gone before the graphed one
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    graph_ms, _ = step_time(cfg, batch, nc, True, args.warmup, args.steps)
    verdicts = ("-", "-")
    if not args.no_profile:
        with tempfile.TemporaryDirectory(prefix="bench-cg-") as project:
            epoch_steps = images // args.batch
            verdicts = (verdict(yaml_path, args, False, Path(project), epoch_steps),
                        verdict(yaml_path, args, True, Path(project), epoch_steps))
    speedup = eager_ms / graph_ms
    goal = ""
    if args.model == "yolo9-t":
        goal = f" (goal >= {GOAL}x: {'met' if speedup >= GOAL else 'not met'})"
    data_name = "" if not args.data else f" data={Path(args.data).parent.name}"
    print(f"cuda_graph_step {args.model}{data_name} b{args.batch} {args.imgsz} {cfg.amp_dtype} "
          f"{torch.cuda.get_device_name()}: eager {eager_ms:.1f} ms [{verdicts[0]}] | "
          f"cuda_graph {graph_ms:.1f} ms [{verdicts[1]}] | speed-up {speedup:.2f}x{goal}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
