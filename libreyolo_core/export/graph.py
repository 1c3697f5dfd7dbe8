"""The network as the exported ONNX graph sees it: uint8 images in, one output layout out.

:class:`ExportGraph` wraps a family's model with its own pre-processing (so the file takes
the loader's ``uint8 (B, 3, H, W)`` RGB and needs no per-family knowledge outside) and one
of the output layouts (:data:`LAYOUTS`, documented in docs/export.md):

* ``raw`` (``nms=false``, the default): ``decoded (B, C, A)`` — the eval-mode decoded boxes
  and scores (YOLOv9 ``C = 4 + nc``: ``x1, y1, x2, y2`` input pixels, sigmoid class scores;
  YOLOX ``C = 5 + nc``: ``xyxy``, objectness, class probabilities) — then the raw head maps
  ``p3 (B, no, H/8, W/8)``, ``p4 (B, no, H/16, W/16)``, ``p5 (B, no, H/32, W/32)``.
* ``nms`` (``nms=true``): ``detections (N, 7)`` float32 ``[image, x1, y1, x2, y2, score,
  cls]`` over the whole batch (rows of one image sorted by descending score, at most
  ``max_det`` per image), after the family's score selection and class-wise NMS with the
  thresholds fixed at export.

The ``nms`` layout computes in one batched pass what
:func:`~libreyolo_core.models.postprocess.select_detections` does image by image: the NMS
groups are ``image * nc + class``, so no box suppresses one of another image or class.
It does not apply the 30000-candidate cap (a cap that matters only for near-empty score
thresholds).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torchvision.ops import batched_nms

__all__ = ["ExportGraph", "LAYOUTS", "output_names"]

#: the output layouts an export can have
LAYOUTS = ("raw", "nms")


def output_names(layout: str) -> list[str]:
    """The ONNX output names of ``layout`` (see the module docstring)."""
    return ["detections"] if layout == "nms" else ["decoded", "p3", "p4", "p5"]


class ExportGraph(nn.Module):
    """``uint8 (B, 3, H, W)`` RGB -> the outputs of ``layout`` (module docstring).

    Args:
        model: the family's network, in eval mode.
        family: its :class:`~libreyolo_core.models.family.Family` (``preprocess``, ``name``).
        layout: ``raw`` or ``nms``.
        half: run the network in float16 (inputs cast after pre-processing; outputs float32).
        conf, iou, max_det: the ``nms`` layout's score threshold, NMS IoU and per-image cap.
    """

    def __init__(self, model: nn.Module, family: Any, layout: str = "raw", half: bool = False,
                 conf: float = 0.25, iou: float = 0.45, max_det: int = 300):
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        self.model, self.family, self.layout, self.fp16 = model, family, layout, half
        self.conf, self.iou, self.max_det = float(conf), float(iou), int(max_det)

    def forward(self, images: Tensor) -> Tensor | tuple[Tensor, ...]:
        x = self.family.preprocess(images)
        if self.fp16:
            x = x.half()
        decoded, maps = self.model(x)
        decoded = decoded.float()
        if self.layout == "nms":
            return self._detections(decoded)
        return (decoded, *(m.float() for m in maps))

    def _detections(self, decoded: Tensor) -> Tensor:
        """``(B, C, A)`` decoded -> ``(N, 7)`` ``[image, x1, y1, x2, y2, score, cls]``."""
        boxes = decoded[:, :4].transpose(1, 2)  # (B, A, 4)
        if self.family.name == "yolox":  # obj x class prob of each anchor's best class only
            probs = decoded[:, 4:5] * decoded[:, 5:]
            best = probs.amax(1, keepdim=True)
            scores = torch.where(probs == best, probs, torch.zeros_like(probs))
        else:  # every (anchor, class) pair (multi-label)
            scores = decoded[:, 4:]
        scores = scores.transpose(1, 2)  # (B, A, nc)
        nc = scores.shape[2]
        image, anchor, cls = (scores > self.conf).nonzero(as_tuple=True)
        score = scores[image, anchor, cls]
        box = boxes[image, anchor]
        finite = torch.isfinite(box).all(1) & torch.isfinite(score)
        image, cls, score, box = image[finite], cls[finite], score[finite], box[finite]
        # non-negative coordinates for batched_nms' offset trick (the 0 makes an empty min safe)
        shifted = box - torch.cat((box.flatten(), box.new_zeros(1))).min()
        keep = batched_nms(shifted, score, image * nc + cls, self.iou)  # by descending score
        image, cls, score, box = image[keep], cls[keep], score[keep], box[keep]
        # by image, then by descending score (scores are in [0, 1]); keep max_det per image
        order = torch.argsort(image.float() * 2.0 - score)
        image, cls, score, box = image[order], cls[order], score[order], box[order]
        batch = torch.arange(decoded.shape[0], device=decoded.device)
        member = (image[:, None] == batch[None]).to(torch.int64)  # (N, B) one-hot of the image
        rank = (member.cumsum(0) * member).sum(1)  # 1-based rank inside its image
        cap = rank <= self.max_det
        return torch.cat((image[cap, None].float(), box[cap], score[cap, None], cls[cap, None].float()), 1)
