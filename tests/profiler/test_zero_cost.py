"""profile=False: the training step path makes no profiler call and builds no profiler object."""

from __future__ import annotations

import pytest
import torch

from libreyolo_core import LibreYOLO
from libreyolo_core.profiler import window


def _boom(*args, **kwargs):
    raise AssertionError("profiler touched while profile=False")


@pytest.fixture
def tiny_yaml(tmp_path):
    from libreyolo_core.data.sample import generate_sample_dataset

    return generate_sample_dataset(tmp_path / "ds", n_train=4, n_val=2, imgsz=64, seed=1)


def test_no_profiler_calls_when_off(tiny_yaml, tmp_path, monkeypatch):
    for name in ("__init__", "wrap_loader", "phase", "step_end", "finish", "_timed"):
        monkeypatch.setattr(window.TrainingProfiler, name, _boom)
    monkeypatch.setattr(torch.profiler, "profile", _boom)
    monkeypatch.setattr(torch.profiler, "record_function", _boom)
    result = LibreYOLO("yolo9-t").train(
        data=tiny_yaml,
        epochs=1,
        imgsz=64,
        batch=4,
        workers=0,
        val=False,
        device="cpu",
        project=str(tmp_path),
        name="off",
    )
    assert result["epochs_completed"] == 1 and "profile" not in result
    assert not (tmp_path / "off" / "profile.json").exists()
