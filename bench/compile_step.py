"""GPU training-step time: eager vs ``compile=True`` vs ``cuda_graph=True``, in one run.

Method: as ``bench/cuda_graph_step.py`` (AMP on, batch 8, 640 px, ONE real training batch
replayed every step, data loading excluded; a step is preprocess, forward, the eager loss
under autocast, scaled backward, clipping, optimizer step, scaler update, EMA update, each
step synchronised). The three modes run one after the other in this process, each on a
fresh model from the same seed, through the engine's own runners
(:class:`~libreyolo_core.engine.compiled.CompiledNetwork`,
:class:`~libreyolo_core.engine.cuda_graph.CudaGraphManager`). Each runs ``--warmup`` untimed
steps (the compile happens in the first, the capture in the 3rd), then ``--steps`` timed
steps; the **median** is reported (and the fastest on stderr). The compile time is the first
compiled step's wall time less a median step. The script fails loudly (exit 1) when the
compiled or the graphed mode fell back to eager.

Prints one line, e.g.
``compile_step yolo9-t b8 640 float16 NVIDIA H200 torch 2.11: eager 61.2 ms | compile 40.3 ms
(1.52x, compiled in 74 s, mode default) | cuda_graph 35.0 ms (1.75x) | median of 30 steps``
(everything else goes to stderr).

Measured on a CPU (yolo9-t, 320 px, batch 8, forward + backward): 336 ms eager, 327 ms
compiled, after 188 s of compiling: compiling pays on a GPU only, hence this bench.

Usage: python bench/compile_step.py [--model yolo9-t] [--batch 8] [--imgsz 640]
       [--steps 30] [--warmup 8] [--mode default] [--no-graph] [--data DATA.yaml]
Exit codes: 0 measured; 1 no CUDA device, or the compiled / graphed mode fell back to eager.
"""

from __future__ import annotations

import argparse
import gc
import logging
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import coco128_copy  # noqa: E402
from cuda_graph_step import measure, one_batch  # noqa: E402

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="yolo9-t")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--steps", type=int, default=30, help="timed steps (the median is kept)")
    ap.add_argument("--warmup", type=int, default=8, help="untimed steps (compile in the 1st)")
    ap.add_argument("--mode", default="default", choices=MODES, help="torch.compile mode")
    ap.add_argument("--no-graph", action="store_true", help="skip the cuda_graph mode")
    ap.add_argument("--data", default=None, help="dataset yaml (default: a copy of coco128)")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("compile_step: no CUDA device here; this benchmark measures GPU step time and "
              "needs a GPU (nothing was measured)", file=sys.stderr)
        return 1
    if args.warmup < 4:
        ap.error("--warmup must be >= 4 (the graph is captured on the 3rd step)")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    torch.backends.cudnn.benchmark = True

    from libreyolo_core.config import resolve_config

    yaml_path = Path(args.data) if args.data else coco128_copy()
    cfg = resolve_config({"model": args.model, "data": str(yaml_path), "batch": args.batch,
                          "imgsz": args.imgsz, "amp": True})
    batch, nc, _ = one_batch(yaml_path, cfg, args.batch)

    def run(mode: str) -> dict:
        gc.collect()  # the previous mode's model and optimizer are gone first
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return measure(cfg, batch, nc, mode, args.warmup, args.steps, compile_mode=args.mode)

    eager = run("eager")
    graph = None if args.no_graph else run("cuda_graph")
    compiled = run("compile")  # last: its compile is the longest part of the run
    eager_ms = statistics.median(eager["times_ms"])
    compile_ms = statistics.median(compiled["times_ms"])
    compile_s = max(compiled["first_s"] - compile_ms / 1e3, 0.0)
    parts = [f"eager {eager_ms:.1f} ms",
             f"compile {compile_ms:.1f} ms ({eager_ms / compile_ms:.2f}x, compiled in "
             f"{compile_s:.0f} s, mode {args.mode})"]
    if graph is not None:
        graph_ms = statistics.median(graph["times_ms"])
        parts.append(f"cuda_graph {graph_ms:.1f} ms ({eager_ms / graph_ms:.2f}x)")
    data_name = "" if not args.data else f" data={Path(args.data).parent.name}"
    print(f"compile_step {args.model}{data_name} b{args.batch} {args.imgsz} {cfg.amp_dtype} "
          f"{torch.cuda.get_device_name()} torch {torch.__version__.split('+')[0]}: "
          + " | ".join(parts) + f" | median of {args.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
