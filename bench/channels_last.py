"""Forward + backward of the training networks in NCHW and in channels-last, in one run.

Each model is built once from seed 0 and copied; one copy is put in channels-last
(``nn.Module.to(memory_format=torch.channels_last)``, what ``channels_last`` does in the
trainer). A fixed random batch runs forward in train mode, then backward of the outputs'
sum; the two layouts alternate step by step (``--warmup`` untimed steps each, then
``--steps`` timed), so a change of the machine's load hits both alike. The median of each
side is kept; the ratio is NCHW / channels-last time (above 1: channels-last is faster).
Loss, optimizer and data loading are left out: they do not depend on the layout.

Prints ONE line, e.g.::

    channels_last cpu threads=2 torch 2.14.1: yolo9-t@320 b16 959 -> 797 ms (1.20x) | ...

On CUDA, ``--amp`` runs the forward under float16 autocast (the training default there);
``make gpu-check`` runs it as its ``channels_last`` check.

Usage: ``python bench/channels_last.py [--models yolo9-t@320,yolox-n@416] [--batch 8]
[--steps 6] [--warmup 2] [--threads 2] [--device cpu] [--amp]``
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time


def _flat(out) -> list:
    import torch

    if torch.is_tensor(out):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flat(o)]
    return []


def measure(name: str, imgsz: int, batch: int, steps: int, warmup: int, device,
            amp: bool = False) -> tuple[float, float]:
    """Median seconds of one forward + backward, ``(NCHW, channels-last)``; ``amp``: the
    forward under float16 autocast (CUDA)."""
    import contextlib

    import torch

    from libreyolo_core.models.registry import parse_model_name

    family, size = parse_model_name(name)
    torch.manual_seed(0)
    nchw = family.build_model(size, 80).to(device).train()
    nhwc = copy.deepcopy(nchw).to(memory_format=torch.channels_last)
    x = torch.rand(batch, 3, imgsz, imgsz, device=device)

    def step(model) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", torch.float16) if amp else contextlib.nullcontext():
            out = model(x)
        sum(o.float().sum() for o in _flat(out)).backward()
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    times: dict[str, list[float]] = {"nchw": [], "nhwc": []}
    for i in range(warmup + steps):
        for key, model in (("nchw", nchw), ("nhwc", nhwc)):
            t = step(model)
            if i >= warmup:
                times[key].append(t)
    return statistics.median(times["nchw"]), statistics.median(times["nhwc"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="yolo9-t@320,yolo9-s@320,yolox-n@416,yolox-s@320",
                   help="comma-separated NAME@IMGSZ (default %(default)s)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=6, help="timed steps per layout (median kept)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per layout")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (CPU)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--amp", action="store_true", help="float16 autocast (CUDA only)")
    a = p.parse_args(argv)
    if a.batch < 1 or a.steps < 1 or a.warmup < 0:
        p.error("needs --batch >= 1, --steps >= 1, --warmup >= 0")
    import torch

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here")
    if a.amp and not a.device.startswith("cuda"):
        p.error("--amp needs --device cuda")

    torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    parts = []
    for spec in a.models.split(","):
        name, _, imgsz = spec.partition("@")
        t_nchw, t_nhwc = measure(name, int(imgsz or 640), a.batch, a.steps, a.warmup, device, a.amp)
        parts.append(f"{name}@{imgsz or 640} b{a.batch} {1e3 * t_nchw:.0f} -> {1e3 * t_nhwc:.0f} ms "
                     f"({t_nchw / t_nhwc:.2f}x)")
    what = f"{device.type}{' amp' if a.amp else ''} threads={a.threads}"
    print(f"channels_last {what} torch {torch.__version__}: "
          + " | ".join(parts), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
