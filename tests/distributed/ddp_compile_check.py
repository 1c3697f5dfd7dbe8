"""Run under torchrun (2 ranks, CPU/Gloo): ``compile=True`` trains under DDP.

Each rank trains yolo9-t one epoch with ``compile=True`` through the real trainer, with
Dynamo's ``eager`` backend (tracing, DDP's bucket splitting, no Inductor code generation:
that takes minutes on a CPU). Each rank writes what its ``torch.compile`` runner did to
``OUT_DIR/rank<r>.json``: ``state``, ``compiled_steps``, ``eager_steps``, whether it
compiled the DDP wrapper, and (rank 0) the keys of the saved checkpoint.

With ``fail`` as a 4th argument the backend raises instead (compiling fails on every
rank): each rank says so in one line and trains eager.

Usage: torchrun --nproc_per_node=2 ddp_compile_check.py DATA.yaml PROJECT OUT_DIR [fail]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from torch.nn.parallel import DistributedDataParallel

from libreyolo_core import LibreYOLO
from libreyolo_core.engine import build as build_mod
from libreyolo_core.engine import compiled as compiled_mod
from libreyolo_core.engine.checkpoint import load_checkpoint


def _raising_backend(gm, example_inputs):
    raise RuntimeError("forced compile failure")


def main(data: str, project: str, out_dir: str, fail: bool = False) -> None:
    runners: list[compiled_mod.CompiledNetwork] = []
    build = compiled_mod.build_compiled_network

    def recording_build(*args, **kwargs):
        runner = build(*args, **kwargs)
        if runner is not None:
            runners.append(runner)
        return runner

    compiled_mod.BACKEND = _raising_backend if fail else "eager"
    build_mod.build_compiled_network = recording_build
    result = LibreYOLO("yolo9-t").train(data=data, project=project, name="ddp", exist_ok=True,
                                        imgsz=64, batch=8, epochs=1, workers=0, val=False,
                                        device="cpu", compile=True, mosaic=0.0, seed=0)
    rank = int(os.environ.get("RANK", "0"))
    (runner,) = runners
    report = {"rank": rank, "state": runner.state, "reason": runner.reason,
              "compiled_steps": runner.compiled_steps, "eager_steps": runner.eager_steps,
              "wraps_ddp": isinstance(runner.module, DistributedDataParallel)}
    if rank == 0:
        ckpt = load_checkpoint(result["last_checkpoint"])
        report["keys"] = list(ckpt["train_model"])
        report["epochs_completed"] = result["epochs_completed"]
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report), encoding="utf-8")


if __name__ == "__main__":
    main(*sys.argv[1:4], fail=sys.argv[4:5] == ["fail"])
