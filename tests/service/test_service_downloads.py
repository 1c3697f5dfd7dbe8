"""Downloads are what their headers say: an artifact rewritten after it was recorded is
served under its new ETag and sha256; stale If-Range / If-None-Match get the whole file;
HEAD works. Against the real API on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import os
import time

import pytest
from testkit import client, make_user

from service.db.models import Artifact


@pytest.fixture
def alice(server, sessions):
    _, token = make_user(sessions)
    with client(server.url, token) as c:
        yield c


def _job_with_last_pt(alice, server, sessions, data_yaml):
    body = {"kind": "train", "model": "yolo9-t", "data": data_yaml,
            "params": {"epochs": 2, "imgsz": 64, "batch": 4}, "gpus": 0}
    job_id = alice.post("/v1/jobs", json=body).json()["id"]
    run = server.app.state.store.run_dir(job_id)
    (run / "weights").mkdir(parents=True)
    old = os.urandom(4000)
    (run / "weights" / "last.pt").write_bytes(old)
    with sessions() as s:
        s.add(Artifact(job_id=job_id, path="weights/last.pt", kind="checkpoint", size_bytes=len(old),
                       sha256=hashlib.sha256(old).hexdigest()))
        s.commit()
    return job_id, run / "weights" / "last.pt", old


def test_rewritten_artifact_is_served_under_its_new_digest(alice, server, sessions, data_yaml):
    job_id, path, old = _job_with_last_pt(alice, server, sessions, data_yaml)
    url = f"/v1/jobs/{job_id}/artifacts/weights/last.pt"
    old_sha = hashlib.sha256(old).hexdigest()
    assert alice.get(url).headers["etag"] == f'"{old_sha}"'
    time.sleep(0.05)
    new = os.urandom(4000)  # same size: a resume rewrote last.pt
    tmp = path.with_name(".last.pt.tmp")
    tmp.write_bytes(new)
    os.replace(tmp, path)
    new_sha = hashlib.sha256(new).hexdigest()

    stale_range = alice.get(url, headers={"Range": "bytes=0-99", "If-Range": f'"{old_sha}"'})
    assert stale_range.status_code == 200 and stale_range.content == new
    assert stale_range.headers["etag"] == f'"{new_sha}"' and stale_range.headers["x-content-sha256"] == new_sha

    stale_match = alice.get(url, headers={"If-None-Match": f'"{old_sha}"'})
    assert stale_match.status_code == 200 and hashlib.sha256(stale_match.content).hexdigest() == new_sha

    fresh_range = alice.get(url, headers={"Range": "bytes=0-99", "If-Range": f'"{new_sha}"'})
    assert fresh_range.status_code == 206 and fresh_range.content == new[:100]
    assert alice.get(url, headers={"If-None-Match": f'"{new_sha}"'}).status_code == 304

    head = alice.head(url)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["etag"] == f'"{new_sha}"' and head.headers["content-length"] == "4000"
    assert alice.head(f"/v1/jobs/{job_id}/artifacts/weights/nope.pt").status_code == 404

    listing = alice.get(f"/v1/jobs/{job_id}/artifacts").json()["data"]
    assert [(a["path"], a["sha256"]) for a in listing] == [("weights/last.pt", new_sha)]
    with sessions() as s:  # the record was updated: the next request hashes nothing
        assert s.query(Artifact).filter_by(job_id=job_id).one().sha256 == new_sha


def test_a_grown_artifact_is_rehashed(alice, server, sessions, data_yaml):
    job_id, path, old = _job_with_last_pt(alice, server, sessions, data_yaml)
    with open(path, "ab") as f:  # size changed, whatever the clocks say
        f.write(b"more")
    r = alice.get(f"/v1/jobs/{job_id}/artifacts/weights/last.pt")
    assert r.content == old + b"more"
    assert r.headers["x-content-sha256"] == hashlib.sha256(old + b"more").hexdigest()
