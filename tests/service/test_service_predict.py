"""Predict jobs at the API: ``kind: predict`` in ``POST /v1/jobs`` and ``POST /v1/predict``
("Try it"): what is refused (4xx with the field and a clear detail), what is stored, and
the 409 when no live worker serves a queue. No engine runs here (the worker tests run one:
tests/worker/test_worker_predict.py)."""

from __future__ import annotations

import io

import pytest
from testkit import client, make_user


def _jpeg(w: int = 64, h: int = 48) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (w, h), (200, 30, 30)).save(buf, "JPEG")
    return buf.getvalue()


def _png(w: int, h: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("1", (w, h)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture
def cpu_worker(server):
    """A live CPU worker's row, written by the worker's real heartbeat (no thread)."""
    from worker.heartbeat import Heartbeat, queues_for

    beat = Heartbeat(server.app.state.sessions, "predict-cpu-worker@host", queues_for([]), 0, 10.0)
    beat.beat()
    yield beat
    beat.stop()


def _post(c, body: bytes, kind: str = "image/jpeg", **params):
    return c.post("/v1/predict", params={"model": "yolo9-t", "name": "cat.jpg", **params},
                  content=body, headers={"Content-Type": kind})


def test_predict_job_params_are_checked(server, sessions, data_yaml):
    _, token = make_user(sessions)
    with client(server.url, token) as c:
        base = {"kind": "predict", "model": "yolo9-t", "data": data_yaml, "gpus": 0}
        ok = c.post("/v1/jobs", json=base | {"params": {"conf": 0.1, "split": "val"}})
        assert ok.status_code == 201, ok.text
        job = ok.json()
        assert job["kind"] == "predict" and job["params"] == {"conf": 0.1, "split": "val"}
        listed = c.get("/v1/jobs", params={"kind": "predict"}).json()["data"]
        assert [j["id"] for j in listed] == [job["id"]]

        bad = c.post("/v1/jobs", json=base | {"params": {"epochs": 3}})
        assert bad.status_code == 422 and bad.json()["field"] == "params.epochs", bad.text
        assert "not a predict key" in bad.json()["detail"]
        bad = c.post("/v1/jobs", json=base | {"params": {"conf": 1.5}})
        assert bad.status_code == 422 and bad.json()["field"] == "params.conf", bad.text
        bad = c.post("/v1/jobs", json=base | {"params": {"split": "holdout"}})
        assert bad.status_code == 422 and bad.json()["field"] == "params.split", bad.text
        bad = c.post("/v1/jobs", json=base | {"procs": 2})
        assert bad.status_code == 422 and bad.json()["field"] == "procs", bad.text
        assert "one device" in bad.json()["detail"]
        bad = c.post("/v1/jobs", json=base | {"data": "/etc/passwd"})
        assert bad.status_code == 422 and bad.json()["field"] == "data", bad.text
        # an unknown model is a 422 naming it, as for a train job (it was a 500)
        bad = c.post("/v1/jobs", json=base | {"model": "mnope"})
        assert bad.status_code == 422 and bad.json()["field"] == "model", bad.text
        assert "unknown model 'mnope'" in bad.json()["detail"] and "job:" in bad.json()["detail"]


def test_try_it_without_a_live_worker_is_refused_at_once(server, sessions):
    _, token = make_user(sessions)
    with client(server.url, token) as c:
        r = _post(c, _jpeg())
        assert r.status_code == 409, r.text
        assert r.json()["detail"].startswith("no live worker serves the cpu or gpu-1 queue")
        assert "libreyolo-service worker --cpu" in r.json()["detail"]
        assert "nothing was queued" in r.json()["detail"]
        assert c.get("/v1/jobs", params={"kind": "predict"}).json()["data"] == []


def test_try_it_refuses_what_is_no_small_image(server, sessions, cpu_worker, api_settings):
    _, token = make_user(sessions)
    with client(server.url, token) as c:
        r = _post(c, b"%PDF-1.4 not an image", kind="application/pdf")
        assert r.status_code == 415 and r.json()["field"] == "body", r.text
        assert "image/jpeg" in r.json()["detail"]
        r = _post(c, b"GIF89a...", kind="image/jpeg")  # bytes that are no JPEG
        assert r.status_code == 422 and r.json()["field"] == "body", r.text
        assert "not the image/jpeg the Content-Type says" in r.json()["detail"]
        r = _post(c, b"", kind="image/png")
        assert r.status_code == 422 and "empty" in r.json()["detail"], r.text
        too_big = b"\xff\xd8\xff" + bytes(api_settings.max_predict_bytes)
        r = _post(c, too_big)
        assert r.status_code == 413 and "max_predict_bytes" in r.json()["detail"], r.text
        # a few KB that decode to 9000x9000 pixels: refused from the header
        r = _post(c, _png(9000, 9000), kind="image/png")
        assert r.status_code == 422 and "9000x9000 pixels" in r.json()["detail"], r.text
        assert "max_predict_pixels" in r.json()["detail"]
        r = _post(c, b"\xff\xd8\xff\xe0 a JPEG header, then nothing")
        assert r.status_code == 422 and "not a readable image" in r.json()["detail"], r.text
        r = _post(c, _jpeg(), conf=2)
        assert r.status_code == 422 and "conf" in r.text, r.text
        r = c.post("/v1/predict", params={"model": "m0123456789abcdef01234567"},
                   content=_jpeg(), headers={"Content-Type": "image/jpeg"})
        assert r.status_code == 422 and r.json()["field"] == "model", r.text
        r = c.post("/v1/predict", params={"model": "yolo99-z"}, content=_jpeg(),
                   headers={"Content-Type": "image/jpeg"})
        assert r.status_code == 422 and r.json()["field"] == "model", r.text
        # nothing of the refused requests was queued or left in the artifact store
        assert c.get("/v1/jobs", params={"kind": "predict"}).json()["data"] == []
        root = api_settings.artifact_root
        assert not root.exists() or not any(p.is_file() for p in root.rglob("input/*"))


def test_try_it_stores_the_image_in_the_job_folder(server, sessions, cpu_worker, api_settings):
    from service.storage import ArtifactStore

    _, token = make_user(sessions)
    blob = _jpeg()
    with client(server.url, token) as c:
        r = _post(c, blob, conf=0.3, imgsz=64, name="../../etc/My Cat.jpg")
        assert r.status_code == 201, r.text
        job = r.json()
        assert job["kind"] == "predict" and job["status"] == "queued"
        assert (job["gpus"], job["queue"], job["priority"]) == (0, "cpu", 9)
        assert job["params"] == {"conf": 0.3, "iou": 0.45, "imgsz": 64, "max_det": 300}
        assert job["time_budget_s"] == api_settings.predict_time_budget_s
        store = ArtifactStore(api_settings.artifact_root)
        stored = list(store.input_dir(job["id"]).iterdir())
        assert [p.name for p in stored] == ["My_Cat.jpg"] and stored[0].read_bytes() == blob
        assert store.is_input(job["id"], stored[0])
        # the answer never names the service's folder
        assert str(api_settings.artifact_root) not in r.text
        assert store.list_files(job["id"]) == []  # the input is no artifact
