"""Our training losses against the reference library's, LibreYOLO 1.6.0, on the same numbers.

Both models are built by the reference with random weights, saved in its format and loaded
into ours (the raw training maps are then equal to the bit, checked first), so any
difference in the loss comes from the assignment or the loss terms themselves:

* YOLOv9: TAL assignment + CIoU box, DFL and class BCE (``libreyolo.models.yolo9.loss.
  YOLO9Loss``, targets ``(B, M, 5)`` ``[cls, x1, y1, x2, y2]`` normalised to 0-1);
* YOLOX: SimOTA assignment + IoU, objectness, class BCE and (after the mosaic switch) L1
  (``LibreYOLOXModel.head.get_losses`` through the model's training forward, targets
  ``(B, M, 5)`` ``[cls, cx, cy, w, h]`` in pixels).

Ours take ``targets (N, 6)`` ``[batch_idx, cls, x1, y1, x2, y2]`` in pixels.
"""

from __future__ import annotations

import pytest
import torch

from libreyolo_core.models.registry import get_family
from libreyolo_core.weights import load_weights

libreyolo = pytest.importorskip("libreyolo", reason="test-only reference: `make setup` installs libreyolo==1.6.0")

NC = 3
IMGSZ = 160
#: per image: (cls, x1, y1, x2, y2) in pixels; overlapping boxes, a small one, an empty image
BOXES = [
    [(1, 20, 30, 80, 100), (2, 90, 10, 150, 60), (0, 30, 40, 90, 110), (1, 5, 5, 17, 15)],
    [(0, 40, 40, 120, 140)],
    [],
]


@torch.no_grad()
def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Move every float tensor off its initial value, so scores and boxes look trained-ish."""
    gen = torch.Generator().manual_seed(seed)
    for key, value in model.state_dict().items():
        if value.is_floating_point() and "running" not in key and "dfl" not in key:
            value.add_(torch.randn(value.shape, generator=gen) * 0.02)


def _pair(family: str, tmp_path, seed: int):
    cls = libreyolo.LibreYOLO9 if family == "yolo9" else libreyolo.LibreYOLOX
    torch.manual_seed(seed)  # the reference initialises from the global generator
    ref = cls(model_path=None, size="t", nb_classes=NC, device="cpu")
    _randomise(ref.model, seed)
    ours = load_weights(ref.save(str(tmp_path / f"{family}.pt"))).build()
    return ref.model.train(), ours.train(), get_family(family)


def _our_targets() -> torch.Tensor:
    return torch.tensor([(i, *box) for i, img in enumerate(BOXES) for box in img], dtype=torch.float32)


def _ref_targets(cxcywh: bool) -> torch.Tensor:
    out = torch.zeros(len(BOXES), max(len(b) for b in BOXES), 5)
    for i, img in enumerate(BOXES):
        for j, (c, x1, y1, x2, y2) in enumerate(img):
            if cxcywh:
                out[i, j] = torch.tensor([c, (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1])
            else:
                out[i, j] = torch.tensor([c, x1 / IMGSZ, y1 / IMGSZ, x2 / IMGSZ, y2 / IMGSZ])
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_yolo9_loss_equals_libreyolo(seed, tmp_path):
    from libreyolo.models.yolo9.loss import YOLO9Loss

    ref, ours, family = _pair("yolo9", tmp_path, seed)
    x = torch.rand(len(BOXES), 3, IMGSZ, IMGSZ, generator=torch.Generator().manual_seed(seed))
    ref_maps, our_maps = ref(x), ours(x)
    assert all(torch.equal(a, b) for a, b in zip(ref_maps, our_maps, strict=True))
    ref_loss = YOLO9Loss(num_classes=NC, reg_max=16, strides=[8, 16, 32], image_size=[IMGSZ, IMGSZ],
                         device=torch.device("cpu"), distributed_normalize=False)
    expected = ref_loss(ref_maps, _ref_targets(cxcywh=False))
    loss = family.build_loss(ours)
    loss.assigner.align_eps = 1e-9  # the reference's normalisation (see TaskAlignedAssigner)
    total, items = loss(our_maps, _our_targets(), len(BOXES))
    got = dict(zip(loss.item_names, items.tolist(), strict=True))
    assert got == {k: pytest.approx(float(expected[k]), rel=1e-4) for k in ("box", "dfl", "cls")}
    assert float(total) == pytest.approx(float(expected["total_loss"]), rel=1e-4)
    # our default normalisation differs only where an object's best alignment score is tiny
    default = family.build_loss(ours)(our_maps, _our_targets(), len(BOXES))[0]
    assert float(default) == pytest.approx(float(total), rel=0.05)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("use_l1", [False, True])
def test_yolox_loss_equals_libreyolo(seed, use_l1, tmp_path):
    ref, ours, family = _pair("yolox", tmp_path, seed)
    x = torch.rand(len(BOXES), 3, IMGSZ, IMGSZ, generator=torch.Generator().manual_seed(seed)) * 255
    ref.head.use_l1 = use_l1
    expected = ref(x, _ref_targets(cxcywh=True))
    loss = family.build_loss(ours)
    loss.use_l1 = use_l1
    total, items = loss(ours(x), _our_targets(), len(BOXES))
    got = dict(zip(loss.item_names, items.tolist(), strict=True))
    names = {"iou": "iou_loss", "obj": "obj_loss", "cls": "cls_loss", "l1": "l1_loss"}
    assert got == {k: pytest.approx(float(expected[v]), rel=1e-5, abs=1e-6) for k, v in names.items()}
    assert float(total) == pytest.approx(float(expected["total_loss"]), rel=1e-5)
    # the reference reports positives per GT; ours the count
    assert float(loss.last_num_fg) == pytest.approx(float(expected["num_fg"]) * 5)
