"""``model: job:<id>/weights/best.pt``: training from a checkpoint artifact of an earlier job.

The API checks the reference (your job, the file exists, no path escape), stores the
checkpoint's absolute path, and the runner's ``job.json`` hands it to the engine as
``model``. Fake engine; SQLite and PostgreSQL.
"""

from __future__ import annotations

import json

import pytest
from testkit import ServerThread, client, make_user, write_data_yaml

from service.storage import ArtifactStore
from worker.runner import run_job


@pytest.fixture
def api(settings):
    """A real API server on the test database, its session factory and artifact store."""
    from service.app import create_app

    app = create_app(settings)
    srv = ServerThread(app).start()
    srv.sessions, srv.store = app.state.sessions, ArtifactStore(settings.artifact_root)
    yield srv
    srv.stop()


def _submit(c, data: str, model: str, **params):
    return c.post("/v1/jobs", json={"model": model, "data": data, "gpus": 0,
                                    "params": {"epochs": 2, "imgsz": 64, "batch": 2, **params}})


def test_train_from_an_earlier_jobs_checkpoint(api, settings, tmp_path):
    data = str(write_data_yaml(tmp_path / "ds"))
    _, token = make_user(api.sessions)
    with client(api.url, token) as c:
        first = _submit(c, data, "yolo9-t").json()["id"]
        assert run_job(first, settings=settings, sessions=api.sessions) == "succeeded"
        ckpt = api.store.run_dir(first) / "weights" / "last.pt"
        assert ckpt.is_file()

        r = _submit(c, data, f"job:{first}/weights/last.pt")
        assert r.status_code == 201, r.text
        second = r.json()
        # the answer names the checkpoint by its job (never the service's folder); the
        # worker's job.json holds the resolved file
        assert second["model"] == f"job:{first}/weights/last.pt"
        assert run_job(second["id"], settings=settings, sessions=api.sessions) == "succeeded"
        spec = json.loads((api.store.job_dir(second["id"]) / "job.json").read_text())
        assert spec["model"] == str(ckpt.resolve())

        # a chain: the second job's checkpoint still knows its family (yolo9-t: stride 32)
        third = _submit(c, data, f"job:{second['id']}/weights/last.pt")
        assert third.status_code == 201, third.text
        bad_imgsz = _submit(c, data, f"job:{second['id']}/weights/last.pt", imgsz=65)
        assert bad_imgsz.status_code == 422 and bad_imgsz.json()["field"] == "params.imgsz"


@pytest.mark.parametrize("ref, words", [
    ("job:{id}/weights/best.pt", "no artifact"),
    ("job:{id}/../../../../etc/passwd.pt", "no artifact"),
    ("job:{id}/weights/../../job.json", "not a checkpoint"),
    ("job:{id}/events.jsonl", "not a checkpoint"),
    ("job:j000000000000000000000000/weights/last.pt", "not found"),
    ("job:nope", "is not 'job:"),
    ("job:{id}", "is not 'job:"),
])
def test_bad_checkpoint_references_are_422_naming_model(api, settings, tmp_path, ref, words):
    data = str(write_data_yaml(tmp_path / "ds"))
    _, token = make_user(api.sessions)
    with client(api.url, token) as c:
        first = _submit(c, data, "yolo9-t").json()["id"]
        assert run_job(first, settings=settings, sessions=api.sessions) == "succeeded"
        outside = api.store.job_dir(first) / "escape.pt"
        outside.write_bytes(b"x")
        (api.store.run_dir(first) / "weights" / "link.pt").symlink_to(outside)
        for bad in (ref, f"job:{first}/weights/link.pt"):
            r = _submit(c, data, bad.format(id=first))
            assert r.status_code == 422, (bad, r.text)
            problem = r.json()
            assert problem["field"] == "model"
            if bad == ref:
                assert words in problem["detail"], problem


def test_another_users_checkpoint_is_not_found(api, settings, tmp_path):
    data = str(write_data_yaml(tmp_path / "ds"))
    _, alice = make_user(api.sessions)
    _, bob = make_user(api.sessions)
    with client(api.url, alice) as a, client(api.url, bob) as b:
        first = _submit(a, data, "yolo9-t").json()["id"]
        assert run_job(first, settings=settings, sessions=api.sessions) == "succeeded"
        r = _submit(b, data, f"job:{first}/weights/last.pt")
        assert r.status_code == 422 and r.json()["field"] == "model"
        assert "not found" in r.json()["detail"]
        assert _submit(a, data, f"job:{first}/weights/last.pt").status_code == 201
