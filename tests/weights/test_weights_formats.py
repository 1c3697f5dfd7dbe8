"""Reading weights files: layouts, detection without metadata, refusals (no reference library
needed; the equivalence with LibreYOLO 1.6.0 is in tests/models/test_weights_equivalence.py)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

from libreyolo_core.engine.checkpoint import CheckpointError, lean_state, save_checkpoint
from libreyolo_core.models import get_family
from libreyolo_core.weights import compact_names, load_weights, transfer_weights
from libreyolo_core.weights.names import to_libreyolo

build_yolo9 = get_family("yolo9").build_model
build_yolox = get_family("yolox").build_model


def _meta(family: str, size: str, nc: int, **extra):
    return {"libreyolo_version": "1.6.0", "model_family": family, "size": size, "task": "detect", "nc": nc,
            "names": {i: f"c{i}" for i in range(nc)}, "imgsz": 320, **extra}


def test_bare_state_dict_is_detected_from_tensors(tmp_path):
    torch.save(build_yolox("n", 3).state_dict(), tmp_path / "bare.pt")
    w = load_weights(tmp_path / "bare.pt")
    assert (w.model_name, w.nc, w.format, w.imgsz) == ("yolox-n", 3, "state-dict", None)
    assert w.names == {0: "0", 1: "1", 2: "2"}


def test_ddp_prefixed_libreyolo_yolo9_names_under_state_dict(tmp_path):
    net = build_yolo9("t", 5)
    state = {f"module.{k}": v for k, v in to_libreyolo("yolo9", net.state_dict()).items()}
    torch.save({"state_dict": state, "epoch": 3}, tmp_path / "ddp.pt")
    w = load_weights(tmp_path / "ddp.pt")
    assert (w.model_name, w.nc) == ("yolo9-t", 5)
    rebuilt = w.build()
    assert all(torch.equal(rebuilt.state_dict()[k], v) for k, v in net.state_dict().items())


def test_other_model_than_asked_is_one_line(tmp_path, caplog):
    save_checkpoint({**_meta("yolox", "t", 2), "model": build_yolox("t", 2).state_dict()}, tmp_path / "x.pt")
    with caplog.at_level(logging.WARNING, logger="libreyolo_core.weights.load"):
        w = load_weights(tmp_path / "x.pt", expect="yolo9-t")
    assert w.model_name == "yolox-t"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "yolox-t" in lines[0] and "yolo9-t" in lines[0]


def test_ultralytics_file_is_refused_without_running_its_code(tmp_path, monkeypatch):
    mod = types.ModuleType("ultralytics.nn.tasks")
    ran = []

    class DetectionModel:
        def __reduce__(self):
            return (_record, ("unpickled",))

    def _record(x):
        ran.append(x)
        return x

    for obj in (DetectionModel, _record):  # pickled by reference as ultralytics.nn.tasks.<name>
        obj.__module__, obj.__qualname__ = mod.__name__, obj.__name__
        setattr(mod, obj.__name__, obj)
    for name in ("ultralytics", "ultralytics.nn", "ultralytics.nn.tasks"):
        monkeypatch.setitem(sys.modules, name, mod if name.endswith("tasks") else types.ModuleType(name))
    torch.save({"model": DetectionModel(), "train_args": {}}, tmp_path / "yolov8n.pt")
    monkeypatch.delitem(sys.modules, "ultralytics.nn.tasks")
    with pytest.raises(CheckpointError, match="Ultralytics checkpoint.*pickled Python object"):
        load_weights(tmp_path / "yolov8n.pt")
    assert ran == []


def test_numpy_scalars_in_metadata_are_accepted(tmp_path):
    state = build_yolox("n", 2).state_dict()
    torch.save({"model": state, **_meta("yolox", "n", 2, imgsz=np.int64(416)), "best_fitness": np.float64(0.25),
                "nc": 2}, tmp_path / "np.pt")
    w = load_weights(tmp_path / "np.pt")
    assert w.imgsz == 416 and isinstance(w.imgsz, int) and w.meta["best_fitness"] == 0.25
    assert type(w.meta["best_fitness"]) is float


def test_family_or_size_we_do_not_have_is_named(tmp_path):
    torch.save({"model": build_yolo9("s", 2).state_dict(), **_meta("yolo9", "m", 2)}, tmp_path / "m.pt")
    with pytest.raises(CheckpointError, match="yolo9-m checkpoint; this engine has yolo9-t, yolo9-s"):
        load_weights(tmp_path / "m.pt")
    torch.save({"conv.weight": torch.zeros(3, 3)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="match none of our models"):
        load_weights(tmp_path / "other.pt")


def test_truncated_file_is_a_checkpoint_error(tmp_path):
    torch.save(build_yolox("n", 1).state_dict(), tmp_path / "full.pt")
    data = (tmp_path / "full.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or damaged"):
        load_weights(tmp_path / "cut.pt")


def test_inspect_cli_reports_format_and_refusals(tmp_path):
    torch.save({"model": build_yolox("s", 4).state_dict(), "start_epoch": 300}, tmp_path / "yolox_s.pth")
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    cmd = [sys.executable, "-m", "libreyolo_core.weights", "inspect"]
    ok = subprocess.run([*cmd, str(tmp_path / "yolox_s.pth")], capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    info = json.loads(ok.stdout)
    assert (info["family"], info["size"], info["format"], info["nc"]) == ("yolox", "s", "yolox-megvii", 4)
    bad = subprocess.run([*cmd, str(tmp_path / "junk.pt")], capture_output=True, text=True, check=False)
    assert bad.returncode == 4 and "junk.pt" in json.loads(bad.stdout)["error"]


def test_yolo9_keeps_its_class_tower_width(tmp_path):
    """A 2-class YOLOv9 fine-tuned from COCO keeps the 80-wide class tower; it still loads."""
    net = build_yolo9("t", 2, cls_width=80)
    save_checkpoint({**_meta("yolo9", "t", 2), "model": net.state_dict()}, tmp_path / "ft.pt")
    w = load_weights(tmp_path / "ft.pt")
    assert w.arch == {"cls_width": 80} and w.build().head.cls[0][0].conv.out_channels == 80


def test_lean_checkpoint_is_float16_and_loads_as_float32(tmp_path):
    net = build_yolo9("t", 3)
    full = {**_meta("yolo9", "t", 3), "model": net.state_dict(), "train_model": net.state_dict(),
            "optimizer": {"state": {}}, "epoch": 4, "config": {"epochs": 5}}
    save_checkpoint(lean_state(full), tmp_path / "best.pt")
    raw = torch.load(tmp_path / "best.pt", weights_only=True)
    assert "optimizer" not in raw and "train_model" not in raw
    assert raw["model"]["backbone.conv0.conv.weight"].dtype == torch.float16  # LibreYOLO's names
    w = load_weights(tmp_path / "best.pt")
    ours = net.state_dict()
    assert all(v.dtype == ours[k].dtype for k, v in w.state.items())
    assert all(torch.equal(v, ours[k].half().to(ours[k].dtype)) for k, v in w.state.items())


def test_transfer_report_lists_reinitialised_head_compactly():
    source = build_yolox("n", 80).state_dict()
    dst = build_yolox("n", 3)
    report = transfer_weights(dst, source)
    assert report.reinitialised == tuple(f"head.cls_preds.{i}.{p}" for i in range(3) for p in ("weight", "bias"))
    assert report.summary() == (f"transferred {report.total - 6} of {report.total} tensors; "
                                "re-initialised: head.cls_preds.{0,1,2}.{bias,weight}")
    assert compact_names(["a.0.w", "a.1.w", "b"]) == ["a.{0,1}.w", "b"]


@pytest.mark.parametrize("make, names", [
    (lambda: {"model": torch.nn.Conv2d(3, 4, 3)}, "torch.nn.modules.conv.Conv2d"),
    (lambda: {"rng": np.random.RandomState(0)}, "numpy.random._pickle.__randomstate_ctor"),
])
def test_a_file_that_needs_code_is_named_whole_and_never_nudges_to_weights_only_false(
        tmp_path, make, names):
    """#28.10: the message was cut mid-sentence from torch's, which suggests
    weights_only=False; it names the globals and the safe way out instead."""
    from libreyolo_core.weights.reader import read_torch_file

    path = tmp_path / "full.pt"
    torch.save(make(), path)
    with pytest.raises(CheckpointError) as info:
        read_torch_file(path)
    msg = str(info.value)
    assert "cannot be loaded safely" in msg and names in msg, msg
    assert "weights_only=False" not in msg and "\x1b" not in msg
    assert msg.endswith("save its weights instead: torch.save(model.state_dict(), path)")


def test_a_file_with_model_and_ema_loads_the_ema_and_says_so(tmp_path, caplog):
    """#28.11 (a public bug report): 'model' held the raw weights and 'ema' the average;
    the raw ones were loaded without a word."""
    raw, avg = build_yolox("n", 2).state_dict(), build_yolox("n", 2).state_dict()
    avg = {k: (v + 1 if v.is_floating_point() else v) for k, v in avg.items()}
    torch.save({"model": raw, "ema": avg}, tmp_path / "both.pth")
    with caplog.at_level(logging.INFO, logger="libreyolo_core"):
        w = load_weights(tmp_path / "both.pth")
    assert "using its 'ema' entry (the averaged weights), not 'model'" in caplog.text

    def total(state):
        return float(sum(v.double().sum() for v in state.values() if v.is_floating_point()))

    assert total(w.state) == pytest.approx(total(avg), rel=1e-6)
    assert total(w.state) != pytest.approx(total(raw), rel=1e-6)
