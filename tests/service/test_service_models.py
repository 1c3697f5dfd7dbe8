"""The model registry (``/v1/models``) against a real server, on SQLite and PostgreSQL.

Uploads are read by the engine's weights inspector in a child process; the files here are
real yolo9-t state dicts in our checkpoint format, and bad files of each kind.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest
from testkit import ServerThread, client, make_user, until_inspected, write_weights

from service.db.models import Job, Model


class _RunsCode:
    """Unpickling this calls ``os.system`` (what a malicious checkpoint does)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="session")
def weights(tmp_path_factory) -> dict[str, Path]:
    """Weight files: ``good`` (yolo9-t, 2 classes, imgsz 128) and one bad file per kind."""
    import numpy as np
    import torch

    folder = tmp_path_factory.mktemp("weights")
    files = {"good": write_weights(folder / "good.pt")}
    ckpt = torch.load(files["good"], weights_only=True)
    files |= {name: folder / f"{name}.pt" for name in
              ("not_torch", "needs_code", "truncated", "unknown_family", "numpy_meta")}
    files["not_torch"].write_bytes(b"this is a text file, not a checkpoint\n" * 10)
    marker = folder / "pwned"
    torch.save({**ckpt, "evil": _RunsCode(marker)}, files["needs_code"])
    files["needs_code_marker"] = marker
    data = files["good"].read_bytes()
    files["truncated"].write_bytes(data[: len(data) // 2])
    torch.save({**ckpt, "model_family": "yolov8", "size": "n"}, files["unknown_family"])
    torch.save({**ckpt, "imgsz": np.int64(128), "best_fitness": np.float64(0.25)},
                files["numpy_meta"])
    assert zipfile.is_zipfile(files["good"]) and not zipfile.is_zipfile(files["truncated"])
    files["nan_weights"] = folder / "nan_weights.pt"
    torch.save({**ckpt, "model": {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
                                  for k, v in ckpt["model"].items()}}, files["nan_weights"])
    flipped = bytearray(data)  # 64 bytes of a tensor's data flipped (a damaged copy)
    middle = len(flipped) // 2
    flipped[middle:middle + 64] = bytes(b ^ 0xFF for b in flipped[middle:middle + 64])
    files["flipped"] = folder / "flipped.pt"
    files["flipped"].write_bytes(bytes(flipped))
    assert torch.load(files["flipped"], weights_only=True)  # torch itself does not notice
    return files


@pytest.fixture
def alice(server, sessions):
    _, token = make_user(sessions)
    with client(server.url, token) as c:
        yield c


def _upload(c, path: Path, name: str = "mine"):
    return c.post("/v1/models", params={"name": name}, content=path.read_bytes(),
                  headers={"Content-Type": "application/octet-stream"}, timeout=180)


def _stored_files(settings) -> list[Path]:
    return sorted(p for p in Path(settings.model_root).rglob("*") if p.is_file())


def test_upload_list_get_download_delete(alice, server, weights):
    r = _upload(alice, weights["good"], name="shapes v1")
    assert r.status_code == 201, r.text
    m = r.json()
    sha = hashlib.sha256(weights["good"].read_bytes()).hexdigest()
    assert (m["family"], m["size"], m["nc"]) == ("yolo9", "t", 2)
    assert m["names"] == {"0": "class0", "1": "class1"} and m["source"] == "upload"
    assert m["sha256"] == sha and m["bytes"] == weights["good"].stat().st_size
    assert m["params"] > 1_000_000 and "path" not in m
    assert r.headers["location"] == f"/v1/models/{m['id']}"
    assert alice.get(f"/v1/models/{m['id']}").json() == m
    assert m["id"] in [x["id"] for x in alice.get("/v1/models").json()["data"]]
    stored = _stored_files(server.app.state.settings)
    again = _upload(alice, weights["good"], name="another name")  # same bytes: the same model
    assert again.status_code == 200 and again.json() == m, again.text
    assert again.headers["location"] == f"/v1/models/{m['id']}"
    assert [x["sha256"] for x in alice.get("/v1/models").json()["data"]].count(sha) == 1
    assert _stored_files(server.app.state.settings) == stored

    f = alice.get(f"/v1/models/{m['id']}/file")
    assert f.status_code == 200 and hashlib.sha256(f.content).hexdigest() == sha
    assert f.headers["etag"] == f'"{sha}"' and f.headers["x-content-sha256"] == sha
    assert 'filename="shapes_v1.pt"' in f.headers["content-disposition"]
    part = alice.get(f"/v1/models/{m['id']}/file", headers={"Range": "bytes=10-19"})
    assert part.status_code == 206 and part.content == weights["good"].read_bytes()[10:20]
    assert alice.get(f"/v1/models/{m['id']}/file",
                     headers={"If-None-Match": f'"{sha}"'}).status_code == 304

    assert alice.delete(f"/v1/models/{m['id']}").status_code == 204
    assert alice.get(f"/v1/models/{m['id']}").status_code == 404
    assert not any(m["id"] in p.name for p in _stored_files(server.app.state.settings))


@pytest.mark.parametrize("kind, words", [
    ("not_torch", "not a torch file"),
    ("needs_code", "needs code"),
    ("truncated", "truncated or damaged"),
    ("unknown_family", "yolov8"),
    ("nan_weights", "NaN or infinite values"),
    ("flipped", "fails its CRC-32 check"),
])
def test_bad_upload_is_422_naming_the_reason_and_stores_nothing(
        alice, server, sessions, weights, kind, words):
    settings = server.app.state.settings
    before = _stored_files(settings)
    with sessions() as s:
        rows = s.query(Model).count()
    r = _upload(alice, weights[kind], name=kind)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    problem = r.json()
    assert problem["field"] == "body" and words in problem["detail"], problem
    assert str(settings.model_root) not in problem["detail"]
    assert _stored_files(settings) == before
    assert not list((Path(settings.model_root) / "incoming").iterdir())
    with sessions() as s:
        assert s.query(Model).count() == rows
    assert not weights["needs_code_marker"].exists()


def test_numpy_scalars_in_metadata_are_accepted(alice, weights):
    """LibreYOLO 1.x and upstream files carry numpy scalars (``best_fitness``); they load
    through explicit safe globals (``libreyolo_core/weights/reader.py``)."""
    r = _upload(alice, weights["numpy_meta"], name="np")
    assert r.status_code == 201, r.text
    assert r.json()["imgsz"] == 128


def test_upload_cap_time_limit_and_empty_body(server, sessions, weights, tmp_path):
    from service.app import create_app

    small = server.app.state.settings.model_copy(update={"max_model_bytes": 1000,
                                                        "inspect_timeout_s": 0.05})
    srv = ServerThread(create_app(small)).start()
    try:
        _, token = make_user(sessions)
        with client(srv.url, token) as c:
            r = _upload(c, weights["good"])
            assert r.status_code == 413 and "max_model_bytes" in r.json()["detail"]
            head = tmp_path / "head.pt"  # a zip header: under the cap, past the time limit
            head.write_bytes(b"PK\x03\x04" + bytes(400))
            r = _upload(c, head)
            assert r.status_code == 422 and "longer than 0.05 s" in r.json()["detail"]
            empty = c.post("/v1/models", params={"name": "x"}, content=b"")
            assert empty.status_code == 422 and "empty" in empty.json()["detail"]
            assert c.post("/v1/models", content=b"x").json()["field"] == "name"
        assert not list((Path(small.model_root) / "incoming").iterdir())
    finally:
        srv.stop()


def test_another_user_cannot_see_or_use_a_model(server, sessions, weights, data_yaml):
    _, alice_token = make_user(sessions)
    _, bob_token = make_user(sessions)
    _, admin_token = make_user(sessions, admin=True)
    with client(server.url, alice_token) as a, client(server.url, bob_token) as b, \
            client(server.url, admin_token) as admin:
        m = _upload(a, weights["good"]).json()
        for path in (f"/v1/models/{m['id']}", f"/v1/models/{m['id']}/file"):
            assert b.get(path).status_code == 404
        assert b.delete(f"/v1/models/{m['id']}").status_code == 404
        assert m["id"] not in [x["id"] for x in b.get("/v1/models").json()["data"]]
        job = {"model": m["id"], "data": data_yaml, "gpus": 0,
               "params": {"epochs": 1, "imgsz": 64, "batch": 2}}
        r = b.post("/v1/jobs", json=job)
        assert r.status_code == 422 and r.json()["field"] == "model", r.text
        assert "not found" in r.json()["detail"]
        assert admin.get(f"/v1/models/{m['id']}").status_code == 200

        # the owner's job resolves the id to the stored file, with the model's family rules
        ok = a.post("/v1/jobs", json=job)
        assert ok.status_code == 201, ok.text
        # (stored as the file's path; shown as the model id, never the service's folder)
        assert ok.json()["model"] == m["id"]
        with sessions() as s:
            assert s.get(Job, ok.json()["id"]).model == str(
                Path(server.app.state.settings.model_root) / f"{m['id']}.pt")
        bad = a.post("/v1/jobs", json={**job, "params": {"imgsz": 65}})
        assert bad.status_code == 422 and bad.json()["field"] == "params.imgsz"
        # a model a queued job starts from cannot be deleted
        busy = a.delete(f"/v1/models/{m['id']}")
        assert busy.status_code == 409 and ok.json()["id"] in busy.json()["detail"]
        with sessions() as s:
            s.get(Job, ok.json()["id"]).status = "cancelled"
            s.commit()
        assert a.delete(f"/v1/models/{m['id']}").status_code == 204


def test_publish_refuses_unfinished_jobs(alice, data_yaml):
    job = alice.post("/v1/jobs", json={"model": "yolo9-t", "data": data_yaml, "gpus": 0,
                                       "params": {"epochs": 1, "imgsz": 64, "batch": 2}}).json()
    r = alice.post(f"/v1/jobs/{job['id']}/publish", json={"name": "too soon"})
    assert r.status_code == 409 and "queued" in r.json()["detail"]
    assert alice.post(f"/v1/jobs/{job['id']}/publish", json={}).status_code == 422
    assert alice.post("/v1/jobs/j000000000000000000000000/publish",
                      json={"name": "x"}).status_code == 404


def _succeeded_job_with(server, sessions, best_pt: Path) -> tuple[str, str]:
    """A user (its token) and a succeeded job of theirs whose weights/best.pt is a copy of
    ``best_pt``; ``(token, job id)``."""
    import shutil

    from testkit import queued_job

    from service.db.models import User

    name, token = make_user(sessions)
    with sessions() as s:
        owner = s.query(User).filter_by(name=name).one().id
    job_id = queued_job(sessions, owner, status="succeeded")
    best = server.app.state.store.run_dir(job_id) / "weights" / "best.pt"
    best.parent.mkdir(parents=True)
    shutil.copyfile(best_pt, best)
    return token, job_id


def test_publish_is_idempotent(server, sessions, weights):
    """The same job published twice makes one model (200 the second time, nothing
    inspected again); another name for it is a 409 naming the model."""
    token, job_id = _succeeded_job_with(server, sessions, weights["good"])
    with client(server.url, token) as c:
        first = c.post(f"/v1/jobs/{job_id}/publish", json={"name": "once"}, timeout=180)
        assert first.status_code == 202, first.text
        again = c.post(f"/v1/jobs/{job_id}/publish", json={"name": "once"}, timeout=180)
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"], again.text
        other = c.post(f"/v1/jobs/{job_id}/publish", json={"name": "twice"})
        assert other.status_code == 409 and other.json()["model_id"] == first.json()["id"]
        assert c.post(f"/v1/jobs/{job_id}/publish", json={"name": "a\x1b[31m"}).status_code == 422
        ready = until_inspected(c, first.json()["id"])
        assert ready["state"] == "ready" and ready["family"] == "yolo9" and ready["nc"] == 2
        assert c.post(f"/v1/jobs/{job_id}/publish", json={"name": "once"}).json() == ready
    with sessions() as s:
        assert s.query(Model).filter_by(source=f"job:{job_id}").count() == 1


def test_publish_answers_at_once_then_the_model_becomes_ready(server, sessions, weights):
    """The publish does not wait for the inspection (a child process that imports torch:
    seconds): it answers 202 with the model ``inspecting``, which a job may not start
    from yet and whose file is not served yet; the model becomes ``ready`` with what the
    inspector read. Timed against an upload of the same file (inspected in its request),
    as a ratio of the same run (no wall-clock assertion)."""
    import time

    token, job_id = _succeeded_job_with(server, sessions, weights["good"])
    with client(server.url, token) as c:
        t0 = time.perf_counter()
        r = c.post(f"/v1/jobs/{job_id}/publish", json={"name": "quick"}, timeout=180)
        publish_s = time.perf_counter() - t0
        assert r.status_code == 202, r.text
        m = r.json()
        assert m["state"] == "inspecting" and r.headers["Location"] == f"/v1/models/{m['id']}"
        if c.get(f"/v1/models/{m['id']}").json()["state"] == "inspecting":
            refused = c.post("/v1/jobs", json={"model": m["id"], "data": "x.yaml", "gpus": 0})
            assert refused.status_code == 422 and "inspected" in refused.json()["detail"]
            assert c.get(f"/v1/models/{m['id']}/file").status_code == 409
        ready = until_inspected(c, m["id"])
        assert ready["state"] == "ready" and ready["family"] == "yolo9", ready
        assert ready["sha256"] == hashlib.sha256(weights["good"].read_bytes()).hexdigest()
        assert c.get(f"/v1/models/{m['id']}/file").content == weights["good"].read_bytes()
        t0 = time.perf_counter()
        assert _upload(c, weights["good"], name="timed").status_code == 201
        upload_s = time.perf_counter() - t0
    print(f"publish answered in {publish_s:.3f} s; an upload of the same file (inspected "
          f"in its request) {upload_s:.3f} s: {upload_s / publish_s:.0f}x")


def test_concurrent_publishes_of_one_job_make_one_model(server, sessions, weights):
    """Four publishes of one job at the same moment: one model (the unique index on the
    published source), every answer naming it; before, each request passed the "published
    already?" check while the others were inspecting, and each made a model."""
    import threading

    token, job_id = _succeeded_job_with(server, sessions, weights["good"])
    answers: list = []
    go = threading.Barrier(4)

    def publish() -> None:
        with client(server.url, token) as c:
            go.wait()
            answers.append(c.post(f"/v1/jobs/{job_id}/publish", json={"name": "race"},
                                  timeout=180))

    threads = [threading.Thread(target=publish) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r.status_code for r in answers)
    assert codes == [200, 200, 200, 202], [r.text for r in answers]
    assert len({r.json()["id"] for r in answers}) == 1
    with sessions() as s:
        assert s.query(Model).filter_by(source=f"job:{job_id}").count() == 1
    with client(server.url, token) as c:
        assert until_inspected(c, answers[0].json()["id"])["state"] == "ready"


def test_a_published_checkpoint_the_inspector_refuses_fails_with_the_reason(server, sessions,
                                                                            weights):
    """The inspection after the answer refuses the checkpoint (NaN weights): the model is
    ``failed`` with the reason, its file removed; publishing again retries (a new model)."""
    token, job_id = _succeeded_job_with(server, sessions, weights["nan_weights"])
    with client(server.url, token) as c:
        m = c.post(f"/v1/jobs/{job_id}/publish", json={"name": "bad"}, timeout=180).json()
        failed = until_inspected(c, m["id"])
        assert failed["state"] == "failed" and "NaN" in failed["error"], failed
        assert not any(m["id"] in p.name for p in _stored_files(server.app.state.settings))
        retry = c.post(f"/v1/jobs/{job_id}/publish", json={"name": "bad"}, timeout=180)
        assert retry.status_code == 202 and retry.json()["id"] != m["id"]
        assert c.get(f"/v1/models/{m['id']}").status_code == 404
        assert until_inspected(c, retry.json()["id"])["state"] == "failed"
