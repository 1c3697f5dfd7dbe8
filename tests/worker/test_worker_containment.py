"""The worker applies the containment rule again before it starts the engine (a yaml may
change between the submit and the start), and gives the engine the service's cache folder
(issue 27, section 1). Fake engine; SQLite and PostgreSQL."""

from __future__ import annotations

import json

from testkit import make_user, queued_job, write_data_yaml

from service.db.models import Job, User
from service.storage import ArtifactStore
from worker.runner import run_job


def _owner(sessions) -> str:
    name, _ = make_user(sessions)
    with sessions() as s:
        return s.query(User).filter_by(name=name).one().id


def test_worker_refuses_a_yaml_that_now_reads_another_upload(settings, sessions, tmp_path):
    victim = settings.upload_root / "d_victim"
    (victim / "images").mkdir(parents=True)
    (victim / "images" / "a.jpg").write_bytes(b"private")
    yaml_path = write_data_yaml(tmp_path / "mine")
    job_id = queued_job(sessions, _owner(sessions), data=str(yaml_path), params={"epochs": 1})
    yaml_path.write_text(f"path: {victim}\ntrain: images\nnames: [a]\n")  # after the submit
    assert run_job(job_id, settings=settings, sessions=sessions) == "failed"
    with sessions() as s:
        job = s.get(Job, job_id)
        assert "service's own storage" in job.error["reason"] and "key 'path'" in job.error["reason"]
    assert not (ArtifactStore(settings.artifact_root).job_dir(job_id) / "job.json").exists()


def test_worker_gives_the_engine_the_service_cache_folder(settings, sessions, tmp_path):
    yaml_path = write_data_yaml(tmp_path / "mine")
    job_id = queued_job(sessions, _owner(sessions), data=str(yaml_path), params={"epochs": 1})
    assert run_job(job_id, settings=settings, sessions=sessions) == "succeeded"
    spec = json.loads((ArtifactStore(settings.artifact_root).job_dir(job_id) / "job.json").read_text())
    assert spec["params"]["cache_dir"] == str(settings.cache_root)
