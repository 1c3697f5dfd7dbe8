"""1-GPU DDP smoke run over NCCL: one rank, a real YOLOv9-t training step through DDP.

Run it under torchrun (``make gpu-check`` does)::

    python -m libreyolo_core.distributed.torchrun --standalone --nproc_per_node=1 \
        bench/ddp_smoke.py

The engine's trainer only joins a process group for ``WORLD_SIZE > 1``, so this script joins
one itself: NCCL on ``cuda:LOCAL_RANK`` (as ``init_distributed`` does for several ranks),
the model converted to SyncBatchNorm and wrapped in DistributedDataParallel as the trainer
does, one forward + loss + backward on a synthetic batch, a loss all-reduce. With one rank
DDP's gradient average is the gradient itself, so the step's gradients must equal those of
the same model without DDP (same seed, same batch, TF32 off; largest difference at most 1e-3
of the largest gradient). Also a broadcast of a Python object.

Prints one JSON line: ``{"ok", "backend", "nccl_version", "device", "loss", "max_grad_diff",
"seconds"}``. Exit codes: 0 ok; 1 a difference or an error (the line says which); 2 no CUDA.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time


def main() -> int:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    if not torch.cuda.is_available():
        print(json.dumps({"ok": False, "error": "no CUDA device"}))
        return 2
    t0 = time.perf_counter()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    # True fp32 for the comparison: with TF32 convolutions (cuDNN's default) the same step's
    # gradients differed by 1.7e-3 of the largest between the DDP and the plain model on an
    # H200 (2026-12-04), 0.0 without; TF32's rounding, not DDP, made the difference.
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    dist.init_process_group("nccl", device_id=device)
    out: dict = {"backend": dist.get_backend(), "world_size": dist.get_world_size(),
                 "device": torch.cuda.get_device_name(device),
                 "nccl_version": ".".join(map(str, torch.cuda.nccl.version()))}
    try:
        from libreyolo_core.models import get_family

        family = get_family("yolo9")
        torch.manual_seed(0)
        plain = family.build_model("t", 4).to(device).train()
        model = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(plain))
        ddp = DistributedDataParallel(model, device_ids=[device.index], output_device=device.index)
        loss_fn = family.build_loss(plain)
        images = torch.randint(0, 255, (4, 3, 128, 128), dtype=torch.uint8, device=device)
        targets = torch.tensor([[0, 1, 20, 30, 60, 70], [1, 2, 40, 50, 100, 110],
                                [2, 0, 10, 10, 50, 40], [3, 3, 64, 64, 120, 120]],
                               dtype=torch.float32, device=device)
        x = family.preprocess(images)
        loss, _ = loss_fn(ddp(x), targets, 4)
        (loss * 4).backward()
        ref, _ = loss_fn(plain(x), targets, 4)
        (ref * 4).backward()
        pairs = [(p.grad, q.grad) for p, q in zip(ddp.module.parameters(), plain.parameters(),
                                                  strict=True) if q.grad is not None]
        scale = max(q.abs().max().item() for _, q in pairs) or 1.0
        diff = max((p - q).abs().max().item() for p, q in pairs) / scale  # relative
        total = loss.detach().clone()
        dist.all_reduce(total)
        box = [{"rank": dist.get_rank()} if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
        torch.cuda.synchronize(device)
        ok = (diff <= 1e-3 and torch.isfinite(total).item() and box[0] == {"rank": 0}
              and abs(total.item() - ref.item()) <= 1e-3 * max(1.0, abs(ref.item())))
        out.update(ok=bool(ok), loss=round(total.item(), 5), ref_loss=round(ref.item(), 5),
                   max_grad_diff=diff)
    except Exception as exc:  # noqa: BLE001 - the one line says what failed
        out.update(ok=False, error=f"{type(exc).__name__}: {exc}")
    finally:
        dist.destroy_process_group()
    out["seconds"] = round(time.perf_counter() - t0, 2)
    print(json.dumps(out), flush=True)
    return 0 if out.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
