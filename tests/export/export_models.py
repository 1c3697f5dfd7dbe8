"""Test models for the export tests and bench/onnx_export.py: freshly built networks made
to behave like trained ones (no weights can be downloaded here)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from libreyolo_core.facade import LibreYOLO

IMAGES = Path(__file__).resolve().parent.parent / "assets" / "coco8" / "images"


def letterboxed(n: int, size: int) -> torch.Tensor:
    from libreyolo_core.data.augment import letterbox
    from libreyolo_core.data.image import load_image

    files = sorted(IMAGES.glob("*.jpg"))[:n]
    return torch.from_numpy(np.stack([letterbox(load_image(f), size)[0].transpose(2, 0, 1)
                                      for f in files]))


def confident(name: str, nc: int = 3, size: int = 128) -> LibreYOLO:
    """A freshly built model with BatchNorm statistics of the coco8 images and its last
    class (and objectness) convs (drawn and) rescaled so that,
    on the coco8 images, their logits have a spread of 1.5 around -1.5 (objectness: 1 around
    +1): a random network's near-constant scores (ties everywhere) become distinct scores,
    a few per cent of them above conf=0.25, so NMS and the max_det cap have real work.
    ``size``: the input size the statistics are taken at (use the size the model runs at:
    statistics of another size leave a badly conditioned network)."""
    torch.manual_seed(0)
    yolo = LibreYOLO(name, nc=nc, names={i: f"c{i}" for i in range(nc)})
    head = yolo.model.head
    if yolo.family.name == "yolox":
        convs = [(c, 1.5, -1.5) for c in head.cls_preds] + [(c, 1.0, 1.0) for c in head.obj_preds]
    else:
        convs = [(tower[-1], 1.5, -1.5) for tower in head.cls]
    images = yolo.family.preprocess(letterboxed(8, size))
    with torch.no_grad():
        for conv, _, _ in convs:  # YOLOv9 starts its class convs at zero weights
            if not conv.weight.any():
                conv.weight.normal_(0.0, 0.01)
        # BatchNorm statistics of these images (fresh ones make deep features vanish)
        for m in yolo.model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.reset_running_stats()
                m.momentum = None  # a cumulative average: one batch sets them
        yolo.model.train()(images)
        yolo.model.eval()
        for m in yolo.model.modules():  # a variance floor keeps the network well conditioned
            if isinstance(m, torch.nn.BatchNorm2d):  # (fp32 within 1e-4 px of fp64)
                m.running_var.clamp_(min=0.1)
    logits: dict[int, torch.Tensor] = {}
    handles = [c.register_forward_hook(lambda m, i, o: logits.__setitem__(id(m), o.detach()))
               for c, _, _ in convs]
    with torch.no_grad():
        yolo.model(images)
        for h in handles:
            h.remove()
        for conv, spread, centre in convs:
            out = logits[id(conv)]
            a = spread / float(out.std().clamp_min(1e-6))
            conv.weight.mul_(a)
            conv.bias.copy_((conv.bias - out.mean()) * a + centre)
    return yolo
