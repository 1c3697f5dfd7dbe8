"""A registered model through the worker: upload -> a train job from it -> publish -> download.

The engine is a stand-in that copies the weights file it was given (``job.json``'s
``model``) to ``weights/best.pt``, so the test sees the exact bytes travel: registry ->
runner -> engine -> artifact -> published model. SQLite and PostgreSQL.
"""

from __future__ import annotations

import hashlib
import json
import sys

import pytest
from testkit import (
    ServerThread,
    client,
    make_user,
    until_inspected,
    write_data_yaml,
    write_weights,
)

from worker.runner import run_job

COPY_ENGINE = r'''
import json, os, shutil, sys, time
spec = json.load(open(sys.argv[1].split("=", 1)[1]))
run = os.path.join(spec["project"], spec["name"])
os.makedirs(os.path.join(run, "weights"), exist_ok=True)
shutil.copyfile(spec["model"], os.path.join(run, "weights", "best.pt"))
with open(os.path.join(run, "events.jsonl"), "a") as ev:
    ev.write(json.dumps({"event": "run_end", "time": time.time(), "status": "succeeded",
                         "best_epoch": 1, "metrics": {"mAP50": 0.5}}) + "\n")
'''


@pytest.fixture
def api(make_settings, db_url, tmp_path):
    from service.app import create_app

    engine = tmp_path / "copy_engine.py"
    engine.write_text(COPY_ENGINE)
    settings = make_settings(db_url, engine_command=[sys.executable, str(engine), "spec={spec}"])
    app = create_app(settings)
    srv = ServerThread(app).start()
    srv.settings, srv.sessions = settings, app.state.sessions
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def good_weights(tmp_path_factory):
    return write_weights(tmp_path_factory.mktemp("w") / "shapes.pt")


def test_upload_train_publish_download(api, good_weights, tmp_path):
    data = str(write_data_yaml(tmp_path / "ds"))
    blob = good_weights.read_bytes()
    sha = hashlib.sha256(blob).hexdigest()
    _, token = make_user(api.sessions)
    with client(api.url, token) as c:
        up = c.post("/v1/models", params={"name": "shapes"}, content=blob, timeout=180)
        assert up.status_code == 201, up.text
        model = up.json()

        r = c.post("/v1/jobs", json={"model": model["id"], "data": data, "gpus": 0,
                                     "params": {"epochs": 1, "imgsz": 64, "batch": 2}})
        assert r.status_code == 201, r.text
        job = r.json()
        assert run_job(job["id"], settings=api.settings, sessions=api.sessions) == "succeeded"
        spec = json.loads((api.settings.artifact_root / job["id"] / "job.json").read_text())
        assert spec["model"] == str(api.settings.model_root / f"{model['id']}.pt")

        pub = c.post(f"/v1/jobs/{job['id']}/publish", json={"name": "shapes-ft"}, timeout=180)
        # 202: the service answers at once and inspects the checkpoint in the background
        assert pub.status_code == 202 and pub.json()["state"] == "inspecting", pub.text
        published = until_inspected(c, pub.json()["id"])
        assert published["state"] == "ready", published
        assert published["source"] == f"job:{job['id']}" and published["name"] == "shapes-ft"
        assert published["sha256"] == sha and published["id"] != model["id"]
        assert (published["family"], published["size"], published["nc"]) == ("yolo9", "t", 2)

        got = c.get(f"/v1/models/{published['id']}/file")
        assert got.status_code == 200 and hashlib.sha256(got.content).hexdigest() == sha

        # a job chained on that job's checkpoint knows the family (through the model)
        chained = c.post("/v1/jobs", json={"model": f"job:{job['id']}/weights/best.pt",
                                           "data": data, "gpus": 0, "params": {"imgsz": 64}})
        assert chained.status_code == 201, chained.text
        # the published model outlives its source: delete the upload, train from the copy
        assert c.delete(f"/v1/models/{model['id']}").status_code == 204
        again = c.post("/v1/jobs", json={"model": published["id"], "data": data, "gpus": 0,
                                         "params": {"epochs": 1, "imgsz": 64, "batch": 2}})
        assert again.status_code == 201, again.text
