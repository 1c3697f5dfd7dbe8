"""``channels_last``: when the trainer puts the network in NHWC, that a run in it trains like
NCHW's (float rounding apart), and that its checkpoints are NCHW."""

from __future__ import annotations

import csv
import logging

import pytest
import torch

from libreyolo_core import LibreYOLO
from libreyolo_core.config import TrainConfig
from libreyolo_core.engine.memory_format import apply_memory_format, channels_last_wanted
from libreyolo_core.models import get_family


def test_channels_last_decision(monkeypatch):
    cpu, cuda, mps = torch.device("cpu"), torch.device("cuda"), torch.device("mps")
    assert channels_last_wanted(None, cuda)[0] is True
    assert channels_last_wanted(False, cuda) == (False, "channels_last=False (set)")
    assert channels_last_wanted(True, cpu) == (True, "channels_last=True (set)")
    on, why = channels_last_wanted(True, mps)
    assert not on and "ignored on mps" in why
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    assert channels_last_wanted(None, cpu)[0] is torch.backends.mkldnn.is_available()
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    assert channels_last_wanted(None, cpu) == (False, "channels_last: off (auto: a aarch64 CPU is not measured)")
    assert TrainConfig().channels_last is None and TrainConfig(channels_last="false").channels_last is False
    with pytest.raises(ValueError, match="channels_last"):
        TrainConfig(channels_last="sometimes")


def test_apply_memory_format_changes_the_layout_not_the_outputs(caplog):
    torch.manual_seed(0)
    net = get_family("yolo9").build_model("t", 4).eval()
    x = torch.rand(2, 3, 96, 96)
    with torch.no_grad():
        before = net(x)[0]
    with caplog.at_level(logging.INFO, logger="libreyolo_core.engine.memory_format"):
        assert apply_memory_format(net, True, torch.device("cpu"))
    assert "channels_last=True (set)" in caplog.text
    conv = net.backbone.stem[0].conv.weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    with torch.no_grad():
        after = net(x)[0]
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-3)  # another summation order
    assert not apply_memory_format(net, False, torch.device("cpu"))  # and back
    assert net.backbone.stem[0].conv.weight.is_contiguous()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="libreyolo_core.engine.memory_format"):
        assert not apply_memory_format(net, True, torch.device("mps"))  # refused, with a warning
    assert [r.levelname for r in caplog.records] == ["WARNING"] and "ignored on mps" in caplog.text


def test_a_channels_last_run_trains_like_nchw_and_saves_nchw(sample_yaml, tmp_path):
    # lr0 1e-6: the weights barely move, so the epoch's mean losses measure the forward
    # passes (a normal lr turns the layouts' rounding into 3 % after 4 steps: chaos, not a bug)
    tiny = dict(data=sample_yaml, epochs=1, imgsz=64, batch=4, workers=0, device="cpu", seed=0,
                warmup_epochs=0, lr0=1e-6, warmup_lr_start=0.0, val=False, plots=False, project=tmp_path, save_period=0)
    losses = {}
    for layout in (False, True):
        LibreYOLO("yolo9-t").train(name=f"cl{layout}", channels_last=layout, **tiny)
        row = next(csv.DictReader((tmp_path / f"cl{layout}" / "results.csv").read_text().splitlines()))
        losses[layout] = [float(row[k]) for k in ("train/box_loss", "train/dfl_loss", "train/cls_loss")]
        ckpt = torch.load(tmp_path / f"cl{layout}" / "weights" / "last.pt", weights_only=True)
        assert all(t.is_contiguous() for key in ("model", "train_model") for t in ckpt[key].values())
        assert ckpt["config"]["channels_last"] is layout
    # the same batches and weights, in another layout: an epoch's mean losses agree to rounding
    torch.testing.assert_close(torch.tensor(losses[True]), torch.tensor(losses[False]), rtol=2e-3, atol=0)
