"""Experiment trackers on real training runs: TensorBoard event files read back with
tensorboard's own reader, a tracker that is down (warned once, training unharmed), and
MLflow against a real ``mlflow server`` (SQLite backend, served artifacts, private port)."""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
from pathlib import Path

import numpy as np
import pytest

from libreyolo_core import LibreYOLO

FAST = dict(imgsz=64, batch=8, workers=0, warmup_epochs=1, no_aug_epochs=1, seed=3, lr0=0.01,
            epochs=2, val=True, save_period=0)


def _write_val_files(trainer) -> None:
    """What the report writes under ``<run_dir>/val/`` (a picture and report.json's
    ``pr_curve``), so the tracker has them to pick up as it would in a full run."""
    from PIL import Image

    val = Path(trainer.run_dir) / "val"
    val.mkdir(exist_ok=True)
    Image.fromarray(np.full((24, 32, 3), 200, np.uint8)).save(val / "confusion_matrix.png")
    names = list(trainer.names.values()) if hasattr(trainer, "names") else ["circle"]
    curve = {"recall": [0.0, 0.5, 1.0], "precision": {str(names[0]): [1.0, 0.8, 0.3]}, "mAP50": 0.61}
    (val / "report.json").write_text(json.dumps({"pr_curve": curve}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tensorboard_event_files_hold_the_run(sample_yaml, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = LibreYOLO("yolox-n").train(data=sample_yaml, project=tmp_path, mlflow="off",
                                        callbacks={"on_epoch_end": [_write_val_files]}, **FAST)
    run = Path(result["save_dir"])
    assert list(run.glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    loss_tags = [t for t in tags["scalars"] if t.startswith("train/") and t.endswith("_loss")]
    assert loss_tags
    steps = [e.step for e in acc.Scalars(loss_tags[0])]
    assert len(steps) == 4 and steps == sorted(steps)  # 16 images / batch 8 = 2 steps x 2 epochs
    assert [e.step for e in acc.Scalars("metrics/mAP50")] == [1, 2]
    assert [e.step for e in acc.Scalars("lr/pg0")] == [1, 2]
    assert any(t.startswith("epoch/") for t in tags["scalars"])
    assert "val/confusion_matrix" in tags["images"]
    image = acc.Images("val/confusion_matrix")[0]
    assert (image.width, image.height) == (32, 24)
    assert any(t.startswith("pr_curve/") for t in tags["tensors"])
    assert acc.Scalars("metrics/pr_curve_mAP50")[0].value == pytest.approx(0.61)


def test_a_tracker_that_is_down_warns_once_and_training_finishes(sample_yaml, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="libreyolo_core.engine.trackers")
    uri = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    result = LibreYOLO("yolox-n").train(data=sample_yaml, project=tmp_path, mlflow=uri,
                                        tensorboard=False, **FAST)
    assert Path(result["best_checkpoint"]).is_file()
    warnings = [r for r in caplog.records if r.name == "libreyolo_core.engine.trackers"]
    assert len(warnings) == 1 and "mlflow" in warnings[0].getMessage()
    assert not list(Path(result["save_dir"]).glob("events.out.tfevents.*"))


@pytest.fixture
def mlflow_server(tmp_path):
    """A real ``mlflow server`` on a private port (tests/service/mlflow_kit.py)."""
    pytest.importorskip("mlflow")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))
    from mlflow_kit import mlflow_server as server

    with server(tmp_path / "mlflow") as uri:
        yield uri


def test_mlflow_run_params_metrics_artifacts_and_tags(sample_yaml, tmp_path, mlflow_server, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("LIBREYOLO_JOB_ID", "j-test-1")
    monkeypatch.setenv("LIBREYOLO_USER", "alice")
    result = LibreYOLO("yolox-n").train(data=sample_yaml, project=tmp_path, mlflow=mlflow_server,
                                        tensorboard=False,
                                        callbacks={"on_epoch_end": [_write_val_files]}, **FAST)
    run_dir = Path(result["save_dir"])
    info = json.loads((run_dir / "mlflow.json").read_text())
    client = MlflowClient(tracking_uri=mlflow_server)
    run = client.get_run(info["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["epochs"] == "2" and run.data.params["imgsz"] == "64"
    assert run.data.tags["libreyolo.job_id"] == "j-test-1" and run.data.tags["libreyolo.user"] == "alice"
    history = client.get_metric_history(run.info.run_id, "metrics/mAP50")
    assert sorted(m.step for m in history) == [1, 2]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "lr/pg0")] == [1, 2]
    top = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"weights", "results.csv", "val"} <= top
    assert "weights/best.pt" in {a.path for a in client.list_artifacts(run.info.run_id, "weights")}
    assert "val/report.json" in {a.path for a in client.list_artifacts(run.info.run_id, "val")}
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # the hook's setting went with it
    # publishing registers a version in MLflow's registry (service/mlflow_registry.py, torch-free)
    from service.mlflow_registry import RegistryError, register_version

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # what register_version sets

    first = register_version(run_dir / "mlflow.json", "shapes", tags={"libreyolo.model_id": "m1"})
    second = register_version(run_dir / "mlflow.json", "shapes", tracking_uri=mlflow_server)
    assert (first["version"], second["version"]) == ("1", "2")
    version = client.get_model_version("shapes", "1")
    assert version.run_id == info["run_id"] and version.tags["libreyolo.model_id"] == "m1"
    assert version.source == f"runs:/{info['run_id']}/weights/best.pt"
    with pytest.raises(RegistryError, match="MLflow registry"):
        register_version(run_dir / "mlflow.json", "shapes", tracking_uri=f"http://127.0.0.1:{_free_port()}")


def test_hook_order_export_before_run_end_trackers_before_callbacks(monkeypatch):
    """export=[onnx] runs after the checkpoint and before the progress hook's run_end; the
    trackers come after the report (they log its files) and after NonFiniteGuard and before the user's callbacks, rank 0 only."""
    import types

    from libreyolo_core.distributed.context import DistContext
    from libreyolo_core.engine.hooks import (
        CallbackHook,
        CheckpointHook,
        NonFiniteGuard,
        ProgressHook,
        ReportHook,
    )
    from libreyolo_core.engine.hooks.policy import default_hooks
    from libreyolo_core.engine.trackers import MlflowHook, TensorBoardHook
    from libreyolo_core.export.hook import ExportHook

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = types.SimpleNamespace(profile=False, export=["onnx"], tensorboard=True, mlflow="http://x")
    kinds = [type(h) for h in default_hooks(types.SimpleNamespace(
        dist=DistContext(rank=0, local_rank=0, world_size=1), cfg=cfg), {})]
    assert kinds[kinds.index(CheckpointHook):] == [CheckpointHook, ExportHook, ReportHook, ProgressHook,
                                                   NonFiniteGuard, TensorBoardHook, MlflowHook, CallbackHook]
    rank1 = [type(h) for h in default_hooks(types.SimpleNamespace(
        dist=DistContext(rank=1, local_rank=1, world_size=2), cfg=cfg), {})]
    assert not {ExportHook, TensorBoardHook, MlflowHook} & set(rank1)
