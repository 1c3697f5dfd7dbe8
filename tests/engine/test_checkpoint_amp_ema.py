"""Checkpoints (atomic, weights_only), AMP policy, EMA."""

import logging
import pickle

import pytest
import torch
from torch import nn

from libreyolo_core.engine.amp import resolve_amp
from libreyolo_core.engine.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from libreyolo_core.engine.ema import ModelEMA
from libreyolo_core.engine.events import EventLog, read_events
from libreyolo_core.records.events import EpochEndEvent


def _state():
    net = nn.Linear(2, 2)
    return {"model": net.state_dict(), "model_family": "yolo9", "size": "t", "nc": 2,
            "names": {0: "a", 1: "b"}, "config": {"epochs": 3, "scale": [0.5, 1.5]}, "epoch": 1}


def test_checkpoint_roundtrip_with_weights_only(tmp_path):
    path = save_checkpoint(_state(), tmp_path / "w" / "last.pt")
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]  # no temp file left
    ckpt = load_checkpoint(path)
    assert ckpt["names"] == {0: "a", 1: "b"} and ckpt["schema_version"] == "1.0"
    torch.load(path, weights_only=True)  # the contract


def test_bad_checkpoints_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "nope.pt")
    evil = tmp_path / "evil.pt"
    evil.write_bytes(pickle.dumps(print))  # a global reference, refused by weights_only
    with pytest.raises(CheckpointError, match="cannot be loaded safely"):
        load_checkpoint(evil)
    partial = tmp_path / "partial.pt"
    torch.save({"model": {}}, partial)
    with pytest.raises(CheckpointError, match="missing keys"):
        load_checkpoint(partial)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_amp_policy_cpu_and_bf16_fallback(caplog):
    caplog.set_level(logging.INFO)
    cpu = resolve_amp(True, "float16", torch.device("cpu"))
    assert not cpu.enabled and cpu.name == "float32" and not cpu.scaler.is_enabled()
    assert "amp ignored on cpu" in caplog.text
    fb = resolve_amp(True, "bfloat16", torch.device("cuda"), bf16_supported=False)
    assert fb.dtype is torch.float16
    assert "using float16 instead" in caplog.text
    bf = resolve_amp(True, "bfloat16", torch.device("cuda"), bf16_supported=True)
    assert bf.dtype is torch.bfloat16 and not bf.scaler.is_enabled()


def test_ema_tracks_weights_with_ramp():
    net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    ema = ModelEMA(net, decay=0.9, tau=1.0)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    before = ema.module[0].weight.clone()
    ema.update(net)
    d = 0.9 * (1 - torch.exp(torch.tensor(-1.0)))
    expected = d * before + (1 - d) * net[0].weight
    assert torch.allclose(ema.module[0].weight, expected)
    assert not any(p.requires_grad for p in ema.module.parameters())


def test_event_log_lines(tmp_path):
    log = EventLog(tmp_path / "events.jsonl")
    log.write(EpochEndEvent(epoch=1, metrics={"mAP50": float("nan")}, t=torch.tensor(2.0)))
    log.close()
    (ev,) = read_events(tmp_path / "events.jsonl")
    assert isinstance(ev, EpochEndEvent)
    assert ev.event == "epoch_end" and ev.metrics["mAP50"] is None and ev.t == 2.0
