"""A real tiny training through the API and the runner with ``export: [onnx]`` and the
service's MLflow setting: ``weights/best.onnx`` is a downloadable artifact with its check
figure, the job's MLflow run carries the job id and user, and publishing registers a
version in MLflow's registry (slow; CPU; a real ``mlflow server``)."""

from __future__ import annotations

import json
import time

import pytest
from testkit import ServerThread, client, make_user

pytestmark = pytest.mark.slow


# one database is enough here: nothing of this is database-specific (3 min a run). Only
# SQLite is collected (not a PostgreSQL run that skips: a skip would be counted in the
# closing "skipped groups" line as something to enable)
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_export_param_and_mlflow_registry_through_the_service(make_settings, db_url, tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from mlflow_kit import mlflow_server
    from sqlalchemy import select

    from libreyolo_core.data.sample import generate_sample_dataset
    from libreyolo_core.export.onnx import read_metadata
    from service.app import create_app
    from service.db.models import User
    from worker.runner import run_job

    data = generate_sample_dataset(tmp_path / "sample", n_train=8, n_val=4, imgsz=64)
    with mlflow_server(tmp_path / "mlflow") as uri:
        settings = make_settings(db_url, engine_command=None, heartbeat_s=2, poll_interval_s=0.2,
                                 lease_s=120, mlflow_tracking_uri=uri)
        app = create_app(settings)
        srv = ServerThread(app).start()
        try:
            name, token = make_user(app.state.sessions)
            with app.state.sessions() as s:
                user_id = s.scalars(select(User).where(User.name == name)).one().id
            with client(srv.url, token) as c:
                r = c.post("/v1/jobs", json={"model": "yolox-n", "data": str(data), "gpus": 0,
                                             "params": {"epochs": 1, "imgsz": 64, "batch": 4,
                                                        "workers": 0, "export": ["onnx"]}})
                assert r.status_code == 201, r.text
                job_id = r.json()["id"]
                status = run_job(job_id, settings=settings, sessions=app.state.sessions)
                assert status == "succeeded", c.get(f"/v1/jobs/{job_id}/logs").text[-3000:]
                arts = {a["path"]: a for a in c.get(f"/v1/jobs/{job_id}/artifacts").json()["data"]}
                assert "weights/best.onnx" in arts and "weights/best.onnx.json" in arts
                record = json.loads(c.get(arts["weights/best.onnx.json"]["url"]).content)
                assert record["max_diff"] <= 1e-4 and record["layout"] == "raw"
                blob = c.get(arts["weights/best.onnx"]["url"]).content  # a real download
                onnx_file = tmp_path / "downloaded.onnx"
                onnx_file.write_bytes(blob)
                assert read_metadata(onnx_file)["libreyolo_model"] == "yolox-n"
                run_info = json.loads(c.get(arts["mlflow.json"]["url"]).content)
                mlc = MlflowClient(tracking_uri=uri)
                run = mlc.get_run(run_info["run_id"])
                assert run.data.tags["libreyolo.job_id"] == job_id
                assert run.data.tags["libreyolo.user"] == user_id
                assert "weights/best.onnx" in {a.path for a in mlc.list_artifacts(run.info.run_id, "weights")}
                r = c.post(f"/v1/jobs/{job_id}/publish", json={"name": "shapes-x"}, timeout=180)
                assert r.status_code == 202, r.text  # inspecting; MLflow's version follows
                deadline = time.monotonic() + 120
                while True:
                    state = c.get(f"/v1/models/{r.json()['id']}").json()["state"]
                    versions = mlc.search_model_versions("name='shapes-x'")
                    if (state != "inspecting" and versions) or time.monotonic() > deadline:
                        break
                    time.sleep(0.5)
                assert state == "ready"
                assert [v.run_id for v in versions] == [run_info["run_id"]]
                assert versions[0].tags["libreyolo.model_id"] == r.json()["id"]
        finally:
            srv.stop()
