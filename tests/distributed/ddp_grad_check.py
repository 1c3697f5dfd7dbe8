"""Run under torchrun (2 ranks, CPU/Gloo): the DDP gradient equals one process's gradient.

Each rank takes every other image of one fixed 8-image batch, computes the family's loss
with the normalisers all-reduced (``mean_normalizer``) and back-propagates it through
DistributedDataParallel with the trainer's factor (the GLOBAL batch for families that
scale the loss by batch, else 1). Rank 0 also computes the single-process gradient of the
whole batch (times 8, or 1) and writes the largest
relative difference to the JSON file named on the command line. BatchNorm layers are put
in eval mode so batch statistics (per-rank on CPU, where SyncBatchNorm cannot run) do not
enter the comparison: what is checked is the loss scaling and normalisation.

Usage: torchrun --nproc_per_node=2 ddp_grad_check.py MODEL OUT.json
"""

from __future__ import annotations

import copy
import json
import sys

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from libreyolo_core.distributed.context import (
    destroy_distributed,
    init_distributed,
    mean_normalizer,
)
from libreyolo_core.models.registry import parse_model_name


def batch(n: int = 8, imgsz: int = 128, nc: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` random uint8 images and 1-3 boxes each: ``(N, 6) [batch_idx, cls, x1, y1, x2, y2]``."""
    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (n, 3, imgsz, imgsz), generator=g, dtype=torch.uint8)
    rows = []
    for i in range(n):
        for _ in range(int(torch.randint(1, 4, (1,), generator=g))):
            xy = torch.rand(2, generator=g) * imgsz * 0.6
            wh = 12 + torch.rand(2, generator=g) * imgsz * 0.35
            cls = float(torch.randint(0, nc, (1,), generator=g))
            rows.append([float(i), cls, *xy.tolist(), *(xy + wh).clamp(max=imgsz - 1).tolist()])
    return images, torch.tensor(rows)


def gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}


def bn_eval(model: nn.Module) -> nn.Module:
    model.train()
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.eval()
    return model


def main(name: str, out: str) -> None:
    ctx, device = init_distributed("cpu")
    family, size = parse_model_name(name)
    torch.manual_seed(0)
    model = bn_eval(family.build_model(size, 4))
    images, targets = batch()
    reference = copy.deepcopy(model) if ctx.is_main else None

    # this rank's share: images rank, rank + world_size, ... (DistributedSampler's split)
    mine = torch.arange(ctx.rank, images.shape[0], ctx.world_size)
    keep = torch.isin(targets[:, 0].long(), mine)
    shard_targets = targets[keep].clone()
    shard_targets[:, 0] = torch.searchsorted(mine, shard_targets[:, 0].long()).float()
    loss_fn = family.build_loss(model)
    loss_fn.normalizer_reduce = mean_normalizer(ctx)
    ddp = DistributedDataParallel(model)
    loss, _ = loss_fn(ddp(family.preprocess(images[mine])), shard_targets, len(mine))
    # the trainer's rule: times the global micro-batch for families that scale by batch, else 1
    by_batch = family.scale_loss_by_batch
    (loss * (len(mine) * ctx.world_size if by_batch else 1)).backward()
    got = gradients(model)

    if ctx.is_main:
        ref_loss_fn = family.build_loss(reference)
        ref_loss, _ = ref_loss_fn(reference(family.preprocess(images)), targets, images.shape[0])
        (ref_loss * (images.shape[0] if by_batch else 1)).backward()
        want = gradients(reference)
        scale = max(float(g.abs().max()) for g in want.values())
        worst = max(float((got[k] - want[k]).abs().max()) for k in want) / scale
        with open(out, "w") as fh:
            json.dump({"max_rel_diff": worst, "tensors": len(want), "grad_scale": scale,
                       "loss": float(ref_loss.detach())}, fh)
    destroy_distributed()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
