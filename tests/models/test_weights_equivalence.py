"""Our YOLOv9-t/s and YOLOX-n/t/s against the reference library, LibreYOLO 1.6.0.

LibreYOLO is a test-only dependency (``make setup`` installs it with ``--no-deps`` plus the
few packages it imports; see ``requirements-ref.txt``). Its models are built with random
weights (BatchNorm statistics too), saved in its own format, loaded into ours, and the
eval-mode outputs compared; then the other way round.

Output transform (eval mode, same input):

* YOLOv9: LibreYOLO returns ``{"predictions": (B, 4 + nc, A), "raw_outputs": [3 maps]}``;
  ours ``(decoded (B, 4 + nc, A), [3 maps])``: compared as they are (xyxy pixels, sigmoid
  class scores; raw maps ``(B, 4 * 16 + nc, H / s, W / s)``).
* YOLOX: LibreYOLO returns the 3 maps ``(B, 5 + nc, H / s, W / s)`` with the sigmoid
  applied to objectness and classes; ours returns the raw maps: we apply
  ``cat(reg, sigmoid(obj, cls))`` to ours before comparing.
"""

from __future__ import annotations

import logging

import pytest
import torch

from libreyolo_core.engine.checkpoint import save_checkpoint
from libreyolo_core.models.registry import get_family
from libreyolo_core.weights import inspect_weights, load_weights
from libreyolo_core.weights.names import to_libreyolo

libreyolo = pytest.importorskip("libreyolo", reason="test-only reference: `make setup` installs libreyolo==1.6.0")

MODELS = ["yolo9-t", "yolo9-s", "yolox-n", "yolox-t", "yolox-s"]
TOL = 1e-5


def _reference(name: str, nc: int = 80):
    family, size = name.split("-")
    cls = libreyolo.LibreYOLO9 if family == "yolo9" else libreyolo.LibreYOLOX
    return cls(model_path=None, size=size, nb_classes=nc, device="cpu")


@torch.no_grad()
def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Every float tensor moved off its initial value, BN statistics included."""
    gen = torch.Generator().manual_seed(seed)
    for key, value in model.state_dict().items():
        if not value.is_floating_point():
            continue
        noise = torch.randn(value.shape, generator=gen)
        if key.endswith("running_var"):
            value.copy_(noise.abs() + 0.5)
        elif key.endswith("head.dfl.conv.weight"):
            continue  # LibreYOLO's fixed DFL projection (ours is a constant buffer)
        else:
            value.add_(noise * 0.05)


def _ours_out(family: str, out) -> list[torch.Tensor]:
    decoded, maps = out
    if family == "yolo9":
        return [decoded, *maps]
    return [torch.cat([m[:, :4], m[:, 4:].sigmoid()], 1) for m in maps]


def _ref_out(family: str, out) -> list[torch.Tensor]:
    if family == "yolo9":
        return [out["predictions"], *out["raw_outputs"]]
    return list(out)


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert len(a) == len(b) and all(x.shape == y.shape for x, y in zip(a, b, strict=True))
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def _input(imgsz: int, family: str) -> torch.Tensor:
    x = torch.rand(1, 3, imgsz, imgsz, generator=torch.Generator().manual_seed(imgsz))
    return x * 255 if family == "yolox" else x  # each family's own input convention


@pytest.mark.parametrize("size", ["t", "s"])
def test_yolo9_name_map_pairs_libreyolo_module_order(size):
    """The name table equals LibreYOLO's tensor names position by position, shapes equal."""
    ours = get_family("yolo9").build_model(size, 80).state_dict()
    theirs = _reference(f"yolo9-{size}").model.state_dict()
    renamed = to_libreyolo("yolo9", ours)
    assert list(renamed) == list(theirs)
    assert all(renamed[k].shape == theirs[k].shape for k in theirs)
    assert size != "t" or len(theirs) == 1338


@pytest.mark.parametrize("name", MODELS)
def test_libreyolo_checkpoint_into_ours(name, tmp_path):
    family = name.split("-")[0]
    ref = _reference(name)
    _randomise(ref.model, seed=1)
    ref.model.eval()
    path = ref.save(str(tmp_path / f"{name}.pt"))
    weights = load_weights(path)
    assert (weights.model_name, weights.nc, weights.format) == (name, 80, "libreyolo")
    ours = weights.build().eval()
    for imgsz in (320, 640):
        x = _input(imgsz, family)
        with torch.no_grad():
            diff = _max_diff(_ours_out(family, ours(x)), _ref_out(family, ref.model(x)))
        assert diff <= TOL, f"{name} at {imgsz}: max abs difference {diff}"


@pytest.mark.parametrize("name", MODELS)
def test_our_checkpoint_into_libreyolo(name, tmp_path):
    family, size = name.split("-")
    ours = get_family(family).build_model(size, 3)
    _randomise(ours, seed=2)
    ours.eval()
    path = save_checkpoint({"libreyolo_version": "0.1", "model_family": family, "size": size, "task": "detect",
                            "nc": 3, "names": {0: "a", 1: "b", 2: "c"}, "imgsz": 320,
                            "model": ours.state_dict()}, tmp_path / "ours.pt")
    ref = libreyolo.LibreYOLO(str(path), device="cpu")
    assert ref.names == {0: "a", 1: "b", 2: "c"} and ref.nb_classes == 3
    ref.model.eval()
    x = _input(320, family)
    with torch.no_grad():
        diff = _max_diff(_ours_out(family, ours(x)), _ref_out(family, ref.model(x)))
    assert diff <= TOL, f"{name}: max abs difference {diff}"


def _to_upstream(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """LibreYOLO's YOLOv9 names -> the upstream release's numbered layout (test fixture)."""
    layers = {"backbone.conv0": 0, "backbone.conv1": 1, "backbone.elan1": 2, "backbone.down2": 3,
              "backbone.elan2": 4, "backbone.down3": 5, "backbone.elan3": 6, "backbone.down4": 7,
              "backbone.elan4": 8, "backbone.spp": 9, "neck.elan_up1": 12, "neck.elan_up2": 15,
              "neck.down1": 16, "neck.elan_down1": 18, "neck.down2": 19, "neck.elan_down2": 21, "head": 22}
    out = {}
    for key, value in state.items():
        if key == "head.dfl.conv.weight":
            continue
        parts = key.split(".")
        prefix = ".".join(parts[:2]) if ".".join(parts[:2]) in layers else parts[0]
        rest = parts[len(prefix.split(".")):]
        layer = layers[prefix]
        if layer == 22:
            rest = ["heads", rest[1], "anchor_conv" if rest[0] == "cv2" else "class_conv", *rest[2:]]
        elif rest[0] == "cv" and layer in (3, 5, 7, 16, 19):
            rest = ["conv", *rest[1:]]
        else:
            new = []
            for p in rest:
                if p == "m":
                    new.append("bottleneck")
                elif p.startswith("cv") and p[2:].isdigit():
                    new.append("conv" + p[2:])
                else:
                    new.append(p)
            rest = new
        out[".".join([str(layer), *rest])] = value
    for level in range(3):  # the fixed DFL projection upstream keeps per level
        out[f"22.heads.{level}.anc2vec.anc2vec.weight"] = torch.arange(16.0).view(1, 16, 1, 1, 1)
    out["23.conv1.conv.weight"] = torch.zeros(4, 4, 1, 1)  # a PGI auxiliary-branch tensor
    return out


@pytest.mark.parametrize("size", ["t", "s"])
def test_upstream_yolo9_layout_loads(size, tmp_path, caplog):
    from libreyolo.models.yolo9.convert import convert_state_dict

    ref = _reference(f"yolo9-{size}")
    _randomise(ref.model, seed=3)
    ref.model.eval()
    theirs = ref.model.state_dict()
    upstream = _to_upstream(theirs)
    # the fixture's layout is the one LibreYOLO's own reader accepts
    back, _ = convert_state_dict(upstream, size)
    assert {k for k in back if not k.startswith("aux")} == set(theirs) - {"head.dfl.conv.weight"}
    path = tmp_path / f"v9-{size}.pt"
    torch.save(upstream, path)
    with caplog.at_level(logging.INFO, logger="libreyolo_core.weights.load"):
        weights = load_weights(path)
    assert (weights.model_name, weights.format, weights.nc) == (f"yolo9-{size}", "yolov9-upstream", 80)
    assert sum("PGI auxiliary branch" in r.getMessage() for r in caplog.records) == 1
    ours = weights.build().eval()
    x = _input(320, "yolo9")
    with torch.no_grad():
        assert _max_diff(_ours_out("yolo9", ours(x)), _ref_out("yolo9", ref.model(x))) <= TOL


@pytest.mark.parametrize("size", ["n", "s"])
def test_megvii_yolox_layout_loads(size, tmp_path):
    ref = _reference(f"yolox-{size}")
    _randomise(ref.model, seed=4)
    ref.model.eval()
    path = tmp_path / f"yolox_{size}.pth"
    torch.save({"model": ref.model.state_dict(), "start_epoch": 300, "amp": None}, path)
    info = inspect_weights(path)
    assert (info.family, info.size, info.format, info.nc) == ("yolox", size, "yolox-megvii", 80)
    ours = load_weights(path).build().eval()
    x = _input(320, "yolox")
    with torch.no_grad():
        assert _max_diff(_ours_out("yolox", ours(x)), _ref_out("yolox", ref.model(x))) <= TOL
