"""ONNX export: every family and size, dynamic axes, the nms layout, metadata, the check
that fails an export, and predict == onnxruntime + our post-processing.

Small inputs (64-128 px) keep each export to a second or two on one core."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from libreyolo_core.export.onnx import ExportCheckError, export_onnx, read_metadata  # noqa: E402
from libreyolo_core.export.runtime import OnnxDetector  # noqa: E402
from libreyolo_core.facade import LibreYOLO  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_models import IMAGES, confident, letterboxed  # noqa: E402

MODELS = ["yolo9-t", "yolo9-s", "yolox-n", "yolox-t", "yolox-s"]


def rel(got: np.ndarray, ref: torch.Tensor) -> float:
    """The export check's figure: max |got - ref| / (1 + |ref|)."""
    r = ref.double().numpy()
    return float((np.abs(got.astype(np.float64) - r) / (1 + np.abs(r))).max())


def _ort(path: Path, images: torch.Tensor) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"images": images.numpy()})


@pytest.mark.parametrize("name", MODELS)
def test_export_every_model_checks_and_describes_itself(name, tmp_path, caplog):
    yolo = confident(name)
    caplog.set_level("INFO", logger="libreyolo_core.export.onnx")
    result = yolo.export(file=tmp_path / f"{name}.onnx", imgsz=64)
    assert Path(result.path).is_file() and result.layout == "raw"
    assert result.max_diff <= 1e-4
    assert f"max diff {result.max_diff:.3g}" in caplog.text  # the figure is in the export log
    meta = read_metadata(result.path)
    assert meta["names"] == {0: "c0", 1: "c1", 2: "c2"} and meta["imgsz"] == 64
    assert meta["libreyolo_model"] == name and meta["layout"] == "raw"
    assert float(meta["check_max_diff"]) == pytest.approx(result.max_diff, rel=1e-5, abs=1e-12)
    x = letterboxed(1, 64)
    decoded, p3, p4, p5 = _ort(Path(result.path), x)
    with torch.no_grad():
        ref, maps = yolo.model(yolo.family.preprocess(x))
    assert decoded.shape == tuple(ref.shape) and p3.shape == tuple(maps[0].shape)
    assert p5.shape[2:] == (2, 2) and rel(decoded, ref) <= 1e-4
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("name", ["yolo9-t", "yolox-n"])
def test_dynamic_batch_and_sizes(name, tmp_path):
    yolo = confident(name)
    result = yolo.export(file=tmp_path / "dyn.onnx", imgsz=64, dynamic=True)
    for batch, (h, w) in [(1, (64, 64)), (4, (96, 128)), (4, (64, 64)), (1, (128, 96))]:
        x = letterboxed(batch, max(h, w))[:, :, :h, :w].contiguous()
        with torch.no_grad():
            ref, maps = yolo.model(yolo.family.preprocess(x))
        got = _ort(Path(result.path), x)
        assert got[0].shape == tuple(ref.shape) and got[0].shape[0] == batch
        assert rel(got[0], ref) <= 1e-4
        for g, m in zip(got[1:], maps, strict=True):
            assert g.shape == tuple(m.shape) and rel(g, m) <= 1e-4


@pytest.mark.parametrize("name", ["yolo9-t", "yolox-n"])
def test_predict_equals_onnxruntime_and_our_postprocess(name, tmp_path):
    yolo = confident(name)
    path = yolo.export(file=tmp_path / "m.onnx", imgsz=128).path
    sources = sorted(IMAGES.glob("*.jpg"))[:4]
    torch_preds = yolo.predict(sources, imgsz=128, device="cpu")
    onnx_preds = OnnxDetector(path).predict(sources)
    assert sum(len(p) for p in torch_preds) > 0  # the comparison has detections to compare
    for a, b in zip(torch_preds, onnx_preds, strict=True):
        assert len(a) == len(b) and a.names == b.names
        np.testing.assert_array_equal(a.classes, b.classes)
        np.testing.assert_allclose(a.boxes, b.boxes, atol=1e-3)
        np.testing.assert_allclose(a.scores, b.scores, atol=1e-5)


@pytest.mark.parametrize("name", ["yolo9-t", "yolox-n"])
def test_nms_layout_gives_final_detections(name, tmp_path):
    yolo = confident(name)
    path = yolo.export(file=tmp_path / "nms.onnx", imgsz=128, nms=True, dynamic=True,
                       max_det=20).path
    assert read_metadata(path)["layout"] == "nms"
    sources = sorted(IMAGES.glob("*.jpg"))[:3]
    torch_preds = yolo.predict(sources, imgsz=128, device="cpu", max_det=20)
    onnx_preds = OnnxDetector(path).predict(sources)
    assert sum(len(p) for p in torch_preds) > 0
    for a, b in zip(torch_preds, onnx_preds, strict=True):
        assert len(a) == len(b) <= 20
        order_a, order_b = np.argsort(-a.scores, kind="stable"), np.argsort(-b.scores, kind="stable")
        np.testing.assert_allclose(a.scores[order_a], b.scores[order_b], atol=1e-5)
        np.testing.assert_allclose(a.boxes[order_a], b.boxes[order_b], atol=1e-3)
    # a batch of 4 images in one run: rows carry their image index
    two = letterboxed(2, 128).numpy()
    rows = OnnxDetector(path).run(np.concatenate([two, two]))[0]
    assert rows.shape[1] == 7 and set(np.unique(rows[:, 0]).astype(int)) <= {0, 1, 2, 3}
    assert (rows[rows[:, 0] == 0][:, 1:] - rows[rows[:, 0] == 2][:, 1:]).max() < 1e-3


def test_a_mismatch_fails_the_export_and_leaves_no_file(tmp_path, monkeypatch):
    """The check compares onnxruntime with the graph PyTorch runs; a graph that changes
    after tracing (here: a weight nudged between the export and the reference) breaks it."""
    import libreyolo_core.export.onnx as onnx_mod

    yolo = confident("yolox-n")
    real_simplify = onnx_mod._simplify

    def nudge_after_trace(path, how):  # the file is written: change the PyTorch side
        for p in yolo_graph_params:
            p.data += 0.01
        return real_simplify(path, how)

    yolo_graph_params: list[torch.nn.Parameter] = []
    real_graph = onnx_mod.ExportGraph

    def graph(model, *a, **k):
        g = real_graph(model, *a, **k)
        yolo_graph_params.extend(list(model.parameters())[:4])
        return g

    monkeypatch.setattr(onnx_mod, "ExportGraph", graph)
    monkeypatch.setattr(onnx_mod, "_simplify", nudge_after_trace)
    target = tmp_path / "bad.onnx"
    with pytest.raises(ExportCheckError, match="no file written") as err:
        export_onnx(yolo.model, yolo.family, target, names=yolo.names, model_name=yolo.name, imgsz=64)
    assert err.value.max_diff > 1e-4
    assert list(tmp_path.iterdir()) == []


def test_cli_export_and_missing_onnx_message(tmp_path):
    out = subprocess.run([sys.executable, "-m", "libreyolo_core.cli", "export", "model=yolox-n",
                          "imgsz=64", f"file={tmp_path / 'cli.onnx'}", "json=true"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["max_diff"] <= 1e-4 and Path(result["path"]).is_file()
    assert "onnxruntime check" in out.stderr
    # without onnx: one line that says what to install, exit 2 (a usage error)
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "onnx.py").write_text("raise ImportError('blocked for the test')\n")
    env = {**__import__("os").environ, "PYTHONPATH": f"{blocker}:{Path.cwd()}"}
    out = subprocess.run([sys.executable, "-m", "libreyolo_core.cli", "export", "model=yolox-n",
                          "imgsz=64", f"file={tmp_path / 'no.onnx'}"], capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        "error: ONNX export needs onnx and onnxruntime: pip install 'libreyolo-service[onnx]'")
    assert not (tmp_path / "no.onnx").exists()


def test_training_with_export_onnx_leaves_a_checked_best_onnx(sample_yaml, tmp_path):
    from libreyolo_core.engine.events import read_events

    result = LibreYOLO("yolox-n").train(data=sample_yaml, project=tmp_path, epochs=1, imgsz=64,
                                        batch=8, workers=0, export="[onnx]", tensorboard=False,
                                        mlflow="off", save_period=0)
    weights = Path(result["save_dir"]) / "weights"
    record = json.loads((weights / "best.onnx.json").read_text())
    assert record["path"] == "weights/best.onnx" and record["max_diff"] <= 1e-4
    assert read_metadata(weights / "best.onnx")["imgsz"] == 64
    events = [e for e in read_events(Path(result["save_dir"]) / "events.jsonl")
              if getattr(e, "kind", None) == "export"]
    assert {e.path for e in events} == {"weights/best.onnx", "weights/best.onnx.json"}


def test_half_export_is_checked_against_float16_pytorch(tmp_path):
    from libreyolo_core.export.onnx import FP16_TOLERANCE, ExportError

    result = confident("yolox-n").export(file=tmp_path / "h.onnx", imgsz=64, half=True)
    assert result.half and result.tolerance == FP16_TOLERANCE and result.max_diff <= FP16_TOLERANCE
    decoded = _ort(Path(result.path), letterboxed(1, 64))[0]
    assert decoded.dtype == np.float32  # outputs stay float32, the input uint8
    with pytest.raises(ExportError, match="not supported for YOLOv9"):
        confident("yolo9-t").export(file=tmp_path / "h9.onnx", imgsz=64, half=True)
    assert not (tmp_path / "h9.onnx").exists()
