"""The model-family contract: every registered family fills it, the registry refuses a
second family of a name, and the registry (with the config) imports without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from libreyolo_core.config import TrainConfig
from libreyolo_core.models import Family, families, get_family, list_models
from libreyolo_core.models.registry import _FAMILIES, register_family

FAMILIES = sorted(families())


def test_registry_refuses_a_duplicate_name():
    before = dict(_FAMILIES)

    class Again(Family):
        name = "yolo9"
        title = "again"
        sizes = {"t": 640}

    with pytest.raises(ValueError, match="'yolo9' is already registered"):
        register_family(Again)
    assert dict(_FAMILIES) == before and type(get_family("yolo9")).__name__ == "Yolo9"


def test_registry_and_config_import_without_torch():
    code = ("import sys; import libreyolo_core.models.registry, libreyolo_core.config; "
            "from libreyolo_core.models import list_models; list_models(); "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr or "torch was imported"


@pytest.mark.parametrize("name", FAMILIES)
def test_family_declares_the_contract(name):
    family = get_family(name)
    assert isinstance(family, Family) and family.name == name and family.title
    assert family.sizes and all(s.isalpha() for s in family.sizes)
    assert all(v % family.stride == 0 for v in family.sizes.values())
    assert set(family.overrides) <= set(TrainConfig.model_fields)
    with pytest.raises(TypeError):
        family.sizes["zz"] = 32  # read-only
    for size in family.sizes:
        cfg = TrainConfig(model=f"{name}-{size}", **family.defaults(size))
        assert cfg.imgsz == family.sizes[size]
    # the builders and the one hook every family must implement are its own
    for method in ("build_model", "build_loss", "preprocess", "postprocess", "class_tensors"):
        assert getattr(type(family), method) is not getattr(Family, method), method


@pytest.mark.parametrize("name", FAMILIES)
def test_family_builds_and_runs_every_size(name):
    family = get_family(name)
    for size in family.sizes:
        with torch.device("meta"):
            net = family.build_model(size, 3)
        assert family.class_tensors(list(net.state_dict()))
        assert family.arch_from_state(net.state_dict()) is not None
    with pytest.raises(ValueError, match="unknown .* size 'zz'"):
        family.build_model("zz", 3)
    model = family.build_model(next(iter(family.sizes)), 3)
    loss = family.build_loss(model)
    x = family.preprocess(torch.zeros(1, 3, 64, 64, dtype=torch.uint8))
    assert x.dtype == torch.float32 and x.shape == (1, 3, 64, 64)
    (dets,) = family.postprocess(model.eval()(x), conf=0.5)
    assert dets.ndim == 2 and dets.shape[1] == 6
    assert isinstance(family.on_mosaic_disable(model, loss), bool)


def test_hooks_default_to_no_ops():
    class Bare(Family):
        name, title, sizes = "bare", "Bare", {"a": 32}

    bare = Bare()
    assert bare.arch_from_state({}) == {} and bare.on_mosaic_disable(None, None) is False
    with pytest.raises(NotImplementedError):
        bare.build_model("a", 1)


def test_model_names_come_from_the_sizes():
    assert list_models() == [f"{n}-{s}" for n, f in families().items() for s in f.sizes]
