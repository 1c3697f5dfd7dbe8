"""Predict jobs through the runner with the real engine (slow; CPU): a registered model
(a real yolo9-t state dict, 2 classes) on one "Try it" image and on a generated dataset's
val split; the artifacts (annotated images, ``predictions.json``), ``result.predict``, and
the SDK's typed boxes (sync and async) from the same jobs."""

from __future__ import annotations

import asyncio
import io
import json
import threading

import pytest
from testkit import ServerThread, client, make_user, write_weights

pytestmark = pytest.mark.slow

#: a score threshold a randomly initialised head passes (its scores are ~1.6e-4)
LOW_CONF = 1e-4


@pytest.fixture
def stack(make_settings, sqlite_url, tmp_path):
    """A real API on SQLite with the real engine, a live CPU worker row, a user token and a
    registered 2-class model."""
    from service.app import create_app
    from worker.heartbeat import Heartbeat, queues_for

    settings = make_settings(sqlite_url, engine_command=None, heartbeat_s=2,
                             poll_interval_s=0.2, lease_s=120)
    app = create_app(settings)
    srv = ServerThread(app).start()
    beat = Heartbeat(app.state.sessions, "predict-worker@host", queues_for([]), 0, 10.0)
    beat.beat()
    _, token = make_user(app.state.sessions)
    with client(srv.url, token) as c:
        up = c.post("/v1/models", params={"name": "shapes"}, timeout=180,
                    content=write_weights(tmp_path / "shapes.pt").read_bytes())
        assert up.status_code == 201, up.text
    srv.settings, srv.sessions, srv.token, srv.model = settings, app.state.sessions, token, up.json()
    yield srv
    beat.stop()
    srv.stop()


def _image(path, w=128, h=96):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    Image.fromarray((rng.random((h, w, 3)) * 255).astype("uint8")).save(path)
    return path


def _check_predictions(preds, images, max_det, nc=2):
    """COCO results: per image at most max_det, boxes inside the image, known classes."""
    assert preds, "no detections at conf 1e-4"
    for p in preds:
        x, y, w, h = p["bbox"]
        iw, ih = images[p["file_name"]]
        assert x >= 0 and y >= 0 and x + w <= iw + 0.01 and y + h <= ih + 0.01, p
        assert 0 <= p["category_id"] < nc and p["score"] >= LOW_CONF, p
    per_image: dict[str, int] = {}
    for p in preds:
        per_image[p["file_name"]] = per_image.get(p["file_name"], 0) + 1
    assert max(per_image.values()) <= max_det


def test_try_it_image_runs_on_the_worker(stack, tmp_path):
    from PIL import Image

    from worker.runner import run_job

    img = _image(tmp_path / "street.jpg")
    with client(stack.url, stack.token) as c:
        r = c.post("/v1/predict", params={"model": stack.model["id"], "name": "street.jpg",
                                          "conf": LOW_CONF, "max_det": 5, "imgsz": 64},
                   content=img.read_bytes(), headers={"Content-Type": "image/jpeg"})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        status = run_job(job_id, settings=stack.settings, sessions=stack.sessions)
        job = c.get(f"/v1/jobs/{job_id}").json()
        assert status == "succeeded", (job, c.get(f"/v1/jobs/{job_id}/logs").text[-3000:])
        summary = job["result"]["predict"]
        assert summary["images"] == 1 and summary["files"] == ["predict/street.jpg"]
        assert summary["names"] == {"0": "class0", "1": "class1"}
        assert summary["imgsz"] == 64 and summary["conf"] == LOW_CONF
        arts = {a["path"]: a for a in c.get(f"/v1/jobs/{job_id}/artifacts").json()["data"]}
        assert {"predict/street.jpg", "predictions.json", "predict.json"} <= set(arts)
        preds = c.get(arts["predictions.json"]["url"]).json()
        assert len(preds) == summary["detections"] <= 5
        _check_predictions(preds, {"street.jpg": (128, 96)}, max_det=5)
        drawn = c.get(arts["predict/street.jpg"]["url"])
        assert drawn.headers["content-type"] == "image/jpeg"
        assert Image.open(io.BytesIO(drawn.content)).size == (128, 96)
        # the job's page lists the annotated image among its files
        page = c.get(f"/jobs/{job_id}")
        assert page.status_code == 200 and "predict/street.jpg" in page.text
        # the stored job.json is a predict spec with the registered model's file
        spec = json.loads((stack.settings.artifact_root / job_id / "job.json").read_text())
        assert spec["kind"] == "predict" and spec["model"].endswith(f"{stack.model['id']}.pt")


def test_predict_job_on_a_dataset_split(stack, tmp_path):
    from libreyolo_core.data.sample import generate_sample_dataset
    from worker.runner import run_job

    data = generate_sample_dataset(tmp_path / "sample", n_train=2, n_val=3, imgsz=64)
    with client(stack.url, stack.token) as c:
        r = c.post("/v1/jobs", json={"kind": "predict", "model": stack.model["id"],
                                     "data": str(data), "gpus": 0,
                                     "params": {"split": "val", "conf": LOW_CONF, "max_det": 3,
                                                "imgsz": 64}})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        status = run_job(job_id, settings=stack.settings, sessions=stack.sessions)
        job = c.get(f"/v1/jobs/{job_id}").json()
        assert status == "succeeded", (job, c.get(f"/v1/jobs/{job_id}/logs").text[-3000:])
        summary = job["result"]["predict"]
        assert summary["images"] == 3 and len(summary["files"]) == 3
        arts = {a["path"] for a in c.get(f"/v1/jobs/{job_id}/artifacts").json()["data"]}
        assert set(summary["files"]) <= arts and "predictions.json" in arts
        preds = c.get(f"/v1/jobs/{job_id}/artifacts/predictions.json").json()
        sizes = {f.split("/", 1)[1]: (64, 64) for f in summary["files"]}
        _check_predictions(preds, sizes, max_det=3)
        assert {p["file_name"] for p in preds} <= set(sizes)


def _play_worker(stack, n: int = 1) -> threading.Thread:
    """Run the next ``n`` queued jobs as a worker would (the SDK call blocks meanwhile)."""
    from sqlalchemy import select
    from testkit import wait_for

    from service.db.models import Job
    from worker.runner import run_job

    def loop() -> None:
        for _ in range(n):
            def queued() -> str | None:
                with stack.sessions() as s:
                    return s.scalar(select(Job.id).where(Job.status == "queued",
                                                         Job.kind == "predict").limit(1))
            job_id = wait_for(queued, timeout=60, what="a queued predict job")
            run_job(job_id, settings=stack.settings, sessions=stack.sessions)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


def test_sdk_returns_typed_boxes(stack, tmp_path):
    from libreyolo_client import AsyncClient, Box, Client

    img = _image(tmp_path / "yard.png")
    worker = _play_worker(stack, n=2)
    with Client(stack.url, stack.token) as c:
        model = c.model(stack.model["id"])
        boxes = model.predict(img, conf=LOW_CONF, max_det=4, imgsz=64)
        assert boxes and all(isinstance(b, Box) for b in boxes) and len(boxes) <= 4
        assert [b.conf for b in boxes] == sorted((b.conf for b in boxes), reverse=True)
        for b in boxes:
            x1, y1, x2, y2 = b.xyxy
            assert 0 <= x1 <= x2 <= 128.01 and 0 <= y1 <= y2 <= 96.01
            assert b.name == f"class{b.cls}" and b.conf >= LOW_CONF
        # downloads work as usual: the annotated image of the job
        job = c.jobs(kind="predict")[0]
        got = job.download("predict/yard.png", tmp_path / "out/")
        assert got.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    async def run_async() -> list[Box]:
        async with AsyncClient(stack.url, stack.token) as ac:
            m = await ac.model(stack.model["id"])
            return await m.predict(img, conf=LOW_CONF, max_det=4, imgsz=64)

    again = asyncio.run(run_async())
    worker.join(120)
    # the same model on the same image: the same boxes
    assert [(b.cls, b.xyxy) for b in again] == [(b.cls, b.xyxy) for b in boxes]
