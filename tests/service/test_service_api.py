"""The jobs API against a real server, on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time

import httpx
import pytest
from sqlalchemy import select
from testkit import REPO, ServerThread, client, make_user, queued_job, take_node

from service import job_store
from service.db.models import Artifact, Job, User, utcnow
from service.lifecycle import CLAIM, FINISH, JobStatus
from service.ops import append_events, transition


def submit(c: httpx.Client, data_path: str, **over) -> httpx.Response:
    body = {"kind": "train", "model": "yolo9-t", "data": data_path,
            "params": {"epochs": 2, "imgsz": 64, "batch": 4}, "gpus": 0} | over
    return c.post("/v1/jobs", json=body)


@pytest.fixture
def alice(server, sessions):
    _, token = make_user(sessions)
    with client(server.url, token) as c:
        yield c


def test_service_never_imports_torch_nor_the_sdk():
    code = ("import sys, service.app, service.cli, service.queue, worker.tasks, worker.runner;"
            "from service.settings import Settings; service.app.create_app(Settings("
            "home='/tmp/lyt-import', broker_url='memory://'));"
            "assert 'torch' not in sys.modules, 'torch imported';"
            "assert 'libreyolo_client' not in sys.modules, 'the SDK imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_health_ready_metrics_need_no_token(server):
    with client(server.url, None) as c:
        assert c.get("/healthz").json() == {"status": "ok"}
        r = c.get("/readyz")
        assert r.status_code == 200, r.text
        assert r.json()["database"] == "ok"
        m = c.get("/metrics")
        assert m.status_code == 200
        assert 'libreyolo_jobs{status="queued"}' in m.text
        assert "libreyolo_job_duration_seconds_bucket" in m.text


def test_missing_and_bad_token_are_401_problems(server, data_yaml):
    with client(server.url, None) as c:
        r = submit(c, data_yaml)
        assert r.status_code == 401
        assert r.headers["content-type"].startswith("application/problem+json")
        assert "bearer token" in r.json()["detail"]
        assert r.headers["www-authenticate"].startswith("Bearer")
        for path in ("/v1/jobs", "/v1/jobs/x", "/v1/jobs/x/events", "/v1/datasets"):
            assert c.get(path).status_code == 401
    with client(server.url, "lyt_nope") as c:
        r = c.get("/v1/jobs")
        assert r.status_code == 401 and "unknown" in r.json()["detail"]


def test_tokens_are_stored_hashed(server, sessions):
    from service.db.models import Token

    _, token = make_user(sessions)
    with sessions() as s:
        hashes = {t.token_sha256 for t in s.query(Token)}
    assert token not in hashes and hashlib.sha256(token.encode()).hexdigest() in hashes


def test_submit_get_list(alice, data_yaml):
    r = submit(alice, data_yaml, params={"epochs": 2, "imgsz": 64, "batch": 4, "lrf": 0.1})
    assert r.status_code == 201, r.text
    job = r.json()
    assert r.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["status"] == "queued" and job["attempt"] == 0 and job["queue"] == "cpu"
    assert job["params"] == {"epochs": 2, "imgsz": 64, "batch": 4, "min_lr_ratio": 0.1}
    got = alice.get(f"/v1/jobs/{job['id']}").json()
    assert got["id"] == job["id"] and got["model"] == "yolo9-t"
    ev = alice.get(f"/v1/jobs/{job['id']}/events").json()
    assert [e["data"]["status"] for e in ev["data"]] == ["queued"]
    assert ev["data"][0]["seq"] == 1 and ev["done"] is False
    assert job["id"] in [j["id"] for j in alice.get("/v1/jobs").json()["data"]]


@pytest.mark.parametrize("over, field, words", [
    ({"params": {"epochs": 0}}, "params.epochs", "epochs=0"),
    ({"params": {"epokhs": 3}}, "params.epokhs", "Did you mean epochs"),
    ({"params": {"imgsz": 100}}, "params.imgsz", "multiple of 32"),
    ({"params": {"batch": 10}, "procs": 4}, "params.batch", "Use batch=8 or batch=12"),
    ({"params": {"batch": 6}, "gpus": 4}, "params.batch", "Use batch=4 or batch=8"),
    ({"kind": "profile", "procs": 2}, "procs", "does not run under DDP"),
    ({"params": {"profile": True}, "procs": 2}, "procs", "does not run under DDP"),
    ({"params": {"project": "/tmp"}}, "params.project", "set by the service"),
    ({"model": "yolo9-q"}, "model", "unknown model"),
    ({"model": "yolo9-q"}, "model", "registered model's id (m..., see `libreyolo-service models list`) "
                                    "or a checkpoint of an earlier job (job:<job id>/weights/best.pt)"),
    ({"model": "m01deadbeef"}, "model", "no model m01deadbeef among your models"),
    ({"gpus": 3}, "gpus", "not one of"),
    ({"data": "/nope/data.yaml"}, "data", "does not exist"),
    ({"data": "relative.yaml"}, "data", "neither a dataset id"),
    ({"kind": "detect"}, "kind", "train"),
    ({"kind": "predict", "params": {"epochs": 3}}, "params.epochs", "not a predict key"),
    ({"kind": "tune", "procs": 2}, "procs", "does not run under DDP"),
    ({"tune": {"repeat": 3}}, "tune", "tune options go with kind tune"),
    ({"kind": "tune", "tune": {"repeat": 1}}, "tune.repeat", "greater than or equal to 2"),
    ({"kind": "tune", "tune": {"trials": 3}}, "tune.trials", "Extra inputs"),
    ({"kind": "profile", "params": {"preflight": True}}, "params.preflight",
     "estimates a training run"),
    ({"params": {"preflight": True}, "procs": 2}, "params.preflight", "profiles one device"),
    ({"priority": 12}, "priority", "less than or equal"),
    ({"nodes": "2"}, "nodes", "valid integer"),
    ({"priority": True}, "priority", "valid integer"),
])
def test_submit_rejects_bad_fields_naming_them(alice, data_yaml, over, field, words):
    before = len(alice.get("/v1/jobs", params={"limit": 200}).json()["data"])
    r = submit(alice, data_yaml, **over)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["field"] == field
    assert words in body["detail"], body["detail"]
    assert len(alice.get("/v1/jobs", params={"limit": 200}).json()["data"]) == before


@pytest.mark.parametrize("body, field", [
    ('"params": {"lr0": NaN}', "params.lr0"),
    ('"params": {"imgsz": 64, "epochs": 1e400}', "params.epochs"),
    ('"kind": "tune", "tune": {"budget_s": Infinity}', "tune.budget_s"),
    ('"time_budget_s": NaN', "time_budget_s"),
])
def test_non_finite_numbers_are_a_422_not_a_500(alice, data_yaml, body, field):
    """JSON has no NaN or Infinity, but Python's parser accepts them: they must be refused
    by name, and the answer that echoes them must still be valid JSON."""
    raw = f'{{"kind": "train", "model": "yolo9-t", "data": "{data_yaml}", {body}}}'
    if '"kind": "tune"' in body:
        raw = raw.replace('"kind": "train", ', "")
    r = alice.post("/v1/jobs", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["field"] == field


def test_a_tune_job_keeps_its_options(alice, data_yaml):
    """A tune job's options are stored with the service's defaults filled in, shown as
    ``tune`` and filtered by kind; a train job has none."""
    r = submit(alice, data_yaml, kind="tune", tune={"repeat": 2, "budget_s": 600})
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["kind"] == "tune"
    assert job["tune"] == {"repeat": 2, "warmup": 3, "steps": 10, "max_candidates": 6,
                           "budget_s": 600.0, "min_gain": 0.05}
    listed = alice.get("/v1/jobs", params={"kind": "tune"}).json()["data"]
    assert job["id"] in {j["id"] for j in listed} and all(j["kind"] == "tune" for j in listed)
    assert submit(alice, data_yaml, params={"preflight": True}).json()["tune"] is None


@pytest.mark.parametrize("text, words", [
    ("path: .\ntrain: images\nval: missing\nnames: {0: thing}\n", "key 'val'"),
    ("path: .\ntrain: images\nval: images\n", "key 'names'"),
])
def test_submit_checks_the_yaml_with_the_engine_loader(alice, data_yaml, text, words):
    bad = os.path.join(os.path.dirname(data_yaml), "bad.yaml")
    with open(bad, "w") as f:
        f.write(text)
    r = submit(alice, bad)
    assert r.status_code == 422 and r.json()["field"] == "data", r.text
    assert "bad.yaml" in r.json()["detail"] and words in r.json()["detail"], r.text


def test_submit_refuses_a_dataset_whose_scan_failed(alice, sessions, data_yaml):
    from service.db.models import Dataset

    ds = alice.post("/v1/datasets/register", json={"name": "broken", "path": data_yaml}).json()
    with sessions() as s:
        row = s.get(Dataset, ds["id"])
        row.status, row.report = "invalid", {"ok": False, "exit_code": 3, "splits": {},
                                             "output": "scanning...\nerror: 0 labelled images"}
        s.commit()
    r = submit(alice, ds["id"])
    assert r.status_code == 422 and r.json()["field"] == "data", r.text
    assert ds["id"] in r.json()["detail"] and "error: 0 labelled images" in r.json()["detail"]


def test_missing_body_field_is_named(alice):
    r = alice.post("/v1/jobs", json={"kind": "train", "data": "/x.yaml"})
    assert r.status_code == 422 and r.json()["field"] == "model"


def test_idempotency_key(alice, data_yaml):
    key = {"Idempotency-Key": os.urandom(8).hex()}
    body = {"model": "yolo9-t", "data": data_yaml, "params": {"epochs": 1}, "gpus": 0}
    a = alice.post("/v1/jobs", json=body, headers=key)
    b = alice.post("/v1/jobs", json=body, headers=key)
    assert (a.status_code, b.status_code) == (201, 200)
    assert a.json()["id"] == b.json()["id"]
    c = alice.post("/v1/jobs", json=body | {"params": {"epochs": 2}}, headers=key)
    assert c.status_code == 409 and c.json()["field"] == "Idempotency-Key"
    # #28.10: `$(uuidgen)` without uuidgen sends an empty key: refused, not ignored
    before = len(alice.get("/v1/jobs").json()["data"])
    for empty in ("",):
        e = alice.post("/v1/jobs", json=body, headers={"Idempotency-Key": empty})
        assert e.status_code == 422 and e.json()["field"] == "Idempotency-Key", e.text
        assert "the header is empty" in e.json()["detail"]
    assert len(alice.get("/v1/jobs").json()["data"]) == before


def test_list_filters_and_cursor(server, sessions, data_yaml):
    _, token = make_user(sessions)
    with client(server.url, token) as c:
        ids = [submit(c, data_yaml).json()["id"] for _ in range(5)]
        assert c.post(f"/v1/jobs/{ids[0]}/cancel").status_code == 202
        seen, cursor = [], None
        while True:
            page = c.get("/v1/jobs", params={"limit": 2, **({"cursor": cursor} if cursor else {})})
            body = page.json()
            seen += [j["id"] for j in body["data"]]
            cursor = body["next_cursor"]
            if not cursor:
                break
        assert seen == ids[::-1]
        cancelled = c.get("/v1/jobs", params={"status": "cancelled"}).json()["data"]
        assert [j["id"] for j in cancelled] == [ids[0]]
        both = c.get("/v1/jobs", params={"status": ["cancelled", "queued"], "kind": "train"})
        assert len(both.json()["data"]) == 5
        for bad in ({"status": "cancelled,queued"}, {"status": "done"}, {"kind": "detect"}):
            problem = c.get("/v1/jobs", params=bad).json()
            assert problem["status"] == 422, problem
            assert problem["field"].startswith(next(iter(bad))), problem
        assert c.get("/v1/jobs", params={"cursor": "!!"}).json()["field"] == "cursor"


def test_other_users_job_is_404_admin_sees_it(server, sessions, data_yaml):
    _, t1 = make_user(sessions)
    _, t2 = make_user(sessions)
    _, tadmin = make_user(sessions, admin=True)
    with client(server.url, t1) as a, client(server.url, t2) as b, \
            client(server.url, tadmin) as adm:
        job_id = submit(a, data_yaml).json()["id"]
        for method, path in [("GET", ""), ("GET", "/events"), ("GET", "/artifacts"),
                             ("GET", "/logs"), ("POST", "/cancel"),
                             ("GET", "/artifacts/weights/last.pt"), ("GET", "/events/stream")]:
            r = b.request(method, f"/v1/jobs/{job_id}{path}")
            assert r.status_code == 404, (path, r.status_code)
            assert r.json()["detail"] == f"job {job_id!r} not found"
        assert job_id not in [j["id"] for j in b.get("/v1/jobs").json()["data"]]
        assert adm.get(f"/v1/jobs/{job_id}").status_code == 200


def test_cancel_queued_then_conflict(alice, data_yaml):
    job_id = submit(alice, data_yaml).json()["id"]
    r = alice.post(f"/v1/jobs/{job_id}/cancel")
    assert r.status_code == 202 and r.json()["status"] == "cancelled"
    again = alice.post(f"/v1/jobs/{job_id}/cancel")
    assert again.status_code == 409 and "already cancelled" in again.json()["detail"]
    statuses = [e["data"]["status"] for e in alice.get(f"/v1/jobs/{job_id}/events").json()["data"]]
    assert statuses == ["queued", "cancelled"]


def _run_fake(sessions, job_id: str, n_metric: int, finish: bool = True) -> None:
    """Play the worker: claim, add metric events, finish."""
    with sessions() as s:
        assert transition(s, job_id, CLAIM, attempt=Job.attempt + 1, started_at=utcnow())
        append_events(s, job_id, [("metric", time.time(), {"event": "progress", "step": i})
                                  for i in range(n_metric)])
        if finish:
            transition(s, job_id, FINISH, JobStatus.SUCCEEDED, finished_at=utcnow())
        s.commit()


def test_events_after_and_sse_resume(alice, sessions, data_yaml):
    job_id = submit(alice, data_yaml).json()["id"]
    _run_fake(sessions, job_id, 5)
    page = alice.get(f"/v1/jobs/{job_id}/events", params={"after": 2}).json()
    assert [e["seq"] for e in page["data"]] == [3, 4, 5, 6, 7, 8]
    assert page["done"] is True and page["status"] == "succeeded"
    events = _sse(alice, f"/v1/jobs/{job_id}/events/stream")
    assert [e["id"] for e in events[:-1]] == [str(i) for i in range(1, 9)]
    assert events[-1]["event"] == "end"
    assert json.loads(events[-1]["data"]) == {"status": "succeeded", "last_seq": 8}
    resumed = _sse(alice, f"/v1/jobs/{job_id}/events/stream", {"Last-Event-ID": "6"})
    assert [e["id"] for e in resumed[:-1]] == ["7", "8"]


def _sse(c: httpx.Client, path: str, headers: dict | None = None, limit: int | None = None
         ) -> list[dict]:
    out, cur = [], {}
    with c.stream("GET", path, headers=headers or {}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line:
                if cur:
                    out.append(cur)
                    cur = {}
                    if out[-1].get("event") == "end" or (limit and len(out) >= limit):
                        break
                continue
            if line.startswith(":"):
                continue
            k, _, v = line.partition(":")
            cur[k] = v[1:] if v.startswith(" ") else v
    return out


def test_sse_follows_a_live_job_and_survives_api_restart(server, sessions, data_yaml):
    """The stream delivers events as they come; after an API restart the client resumes
    from Last-Event-ID without gaps or duplicates, and ends with the terminal event."""
    _, token = make_user(sessions)
    app2_server = ServerThread(server.app).start()
    with client(app2_server.url, token) as c:
        job_id = submit(c, data_yaml).json()["id"]
        _run_fake(sessions, job_id, 3, finish=False)
        first = _sse(c, f"/v1/jobs/{job_id}/events/stream", limit=3)
        assert [e["id"] for e in first] == ["1", "2", "3"]
    app2_server.stop()  # the API goes away mid-stream
    with sessions() as s:
        append_events(s, job_id, [("metric", time.time(), {"event": "progress", "step": 9})])
        transition(s, job_id, FINISH, JobStatus.SUCCEEDED, finished_at=utcnow())
        s.commit()
    with client(server.url, token) as c:  # another API process on the same database
        rest = _sse(c, f"/v1/jobs/{job_id}/events/stream", {"Last-Event-ID": first[-1]["id"]})
    assert [e["id"] for e in rest[:-1]] == ["4", "5", "6", "7"]
    assert rest[-1]["event"] == "end"


def test_artifacts_download_range_etag_and_no_escape(alice, server, sessions, data_yaml, tmp_path):
    job_id = submit(alice, data_yaml).json()["id"]
    store = server.app.state.store
    run = store.run_dir(job_id)
    (run / "weights").mkdir(parents=True)
    blob = os.urandom(5000)
    (run / "weights" / "best.pt").write_bytes(blob)
    (run / "timeline.html").write_text("<html><script>fetch('http://x')</script></html>")
    outside = tmp_path / "secret.txt"
    outside.write_text("secret")
    (run / "link.txt").symlink_to(outside)
    store.log_path(job_id).write_text("line 1\nline 2\nline 3\n")
    sha = hashlib.sha256(blob).hexdigest()
    with sessions() as s:
        s.add(Artifact(job_id=job_id, path="weights/best.pt", kind="checkpoint",
                       size_bytes=len(blob), sha256=sha))
        s.commit()
    listing = alice.get(f"/v1/jobs/{job_id}/artifacts").json()["data"]
    assert listing[0]["path"] == "weights/best.pt" and listing[0]["sha256"] == sha
    r = alice.get(f"/v1/jobs/{job_id}/artifacts/weights/best.pt")
    assert r.status_code == 200 and r.content == blob
    assert hashlib.sha256(r.content).hexdigest() == r.headers["x-content-sha256"] == sha
    assert r.headers["etag"] == f'"{sha}"'
    assert r.headers["content-disposition"].startswith("attachment")
    part = alice.get(f"/v1/jobs/{job_id}/artifacts/weights/best.pt",
                     headers={"Range": "bytes=100-199"})
    assert part.status_code == 206 and part.content == blob[100:200]
    assert part.headers["content-range"] == "bytes 100-199/5000"
    assert alice.get(f"/v1/jobs/{job_id}/artifacts/weights/best.pt",
                     headers={"If-None-Match": f'"{sha}"'}).status_code == 304
    html = alice.get(f"/v1/jobs/{job_id}/artifacts/timeline.html")
    assert html.headers["content-type"].startswith("text/html")
    assert html.headers["content-disposition"].startswith("inline")
    assert "connect-src 'none'" in html.headers["content-security-policy"]
    for bad in ("../../../../etc/passwd", "..%2F..%2F..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd",
                "link.txt", "weights", "nope.pt", "weights/../../train.log"):
        r = alice.get(f"/v1/jobs/{job_id}/artifacts/{bad}")
        assert r.status_code == 404, (bad, r.status_code)
        assert b"secret" not in r.content
    logs = alice.get(f"/v1/jobs/{job_id}/logs")
    assert logs.text == "line 1\nline 2\nline 3\n" and logs.headers["x-log-size"] == "21"
    assert alice.get(f"/v1/jobs/{job_id}/logs", params={"tail": 1}).text == "line 3\n"
    assert alice.get(f"/v1/jobs/{job_id}/logs", params={"offset": 14}).text == "line 3\n"


def test_datasets_register_and_use(alice, data_yaml):
    r = alice.post("/v1/datasets/register", json={"name": "tiny", "path": data_yaml})
    assert r.status_code == 201, r.text
    ds = r.json()
    assert alice.get(f"/v1/datasets/{ds['id']}").json()["path"] == data_yaml
    assert ds["id"] in [d["id"] for d in alice.get("/v1/datasets").json()["data"]]
    job = submit(alice, ds["id"]).json()
    assert job["data"] == data_yaml
    bad = alice.post("/v1/datasets/register", json={"name": "x", "path": "rel/data.yaml"})
    assert bad.status_code == 422 and bad.json()["field"] == "path"


def test_openapi_documents_endpoints(server):
    spec = httpx.get(server.url + "/openapi.json").json()
    op = spec["paths"]["/v1/jobs"]["post"]
    assert op["operationId"] == "jobs-submit" and "Idempotency-Key" in op["description"]


def _row_of(rows_html: str, job_id: str) -> str:
    """The ``<tr>`` of ``job_id`` in the jobs table's rows fragment."""
    match = re.search(rf'<tr data-job-id="{job_id}".*?</tr>', rows_html, re.S)
    assert match, f"no row of {job_id}"
    return match.group(0)


def _node_row(summary_html: str, rank: int) -> str:
    match = re.search(rf'<tr data-node-rank="{rank}">.*?</tr>', summary_html, re.S)
    assert match, f"no row of node {rank}"
    return re.sub(r"\s+", " ", match.group(0))


def test_a_multi_node_job_on_the_pages_and_in_the_api(server, sessions):
    """A 2-node CPU job put in the database, its slots claimed by the real gang code: the
    jobs table says "2 nodes × 1 CPU rank", the summary its world size and each node's
    worker while it gathers, runs, is re-queued after a node was lost (the nodes of the
    attempt it ran), gathers again and ends; a 1-node job looks as before."""
    from service.gang import record_node_exit

    name, token = make_user(sessions)
    with sessions() as s:
        owner = s.scalar(select(User.id).where(User.name == name))
    multi = queued_job(sessions, owner, nodes=2)
    single = queued_job(sessions, owner)
    take_node(sessions, multi, "w-a", "10.0.0.1")
    with client(server.url, token) as c:
        rows = c.get("/web/jobs/rows").text
        assert '<span class="small nodes-text">2 nodes × 1 CPU rank</span>' in _row_of(rows, multi)
        assert "nodes-text" not in _row_of(rows, single)
        summary = c.get(f"/web/jobs/{multi}/summary").text
        assert "1 of 2 nodes claimed" in summary
        assert 'id="devices">2 nodes × 1 CPU rank · queue cpu</dd>' in summary
        assert 'id="world-size">2 ranks</dd>' in summary
        assert "w-a" in _node_row(summary, 0) and "host-w-a (10.0.0.1)" in _node_row(summary, 0)
        assert "claimed" in _node_row(summary, 0)
        assert "waiting for a worker" in _node_row(summary, 1)
        gathering = c.get(f"/v1/jobs/{multi}").json()
        assert (gathering["nodes"], gathering["world_size"]) == (2, 2)
        assert [n["worker"] for n in gathering["node_workers"]] == ["w-a"]

        assert take_node(sessions, multi, "w-b", "10.0.0.2").started
        summary = c.get(f"/web/jobs/{multi}/summary").text
        assert "2 nodes, world size 2, attempt 1." in summary
        assert [_node_row(summary, r).count("running") for r in (0, 1)] == [1, 1]
        events = c.get(f"/v1/jobs/{multi}/events").json()["data"]
        gang = [e["data"]["lines"] for e in events if e["data"].get("event") == "gang"]
        assert gang == [["node 0 of 2 claimed by w-a; 1 of 2 nodes gathered"]]
        running = next(e["data"] for e in events if e["data"].get("status") == "running")
        assert running["world_size"] == 2 and running["rendezvous"] == "10.0.0.1:29500"
        assert [(n["node_rank"], n["worker"], n["addr"]) for n in running["nodes"]] == [
            (0, "w-a", "10.0.0.1"), (1, "w-b", "10.0.0.2")]

        # node 1's worker shut down: node 0 re-queues the whole attempt
        with sessions() as s:
            record_node_exit(s, job_id=multi, attempt=1, node_rank=1, worker_id="w-b",
                             exit_code=143, stop="worker shutdown", detail="")
            record_node_exit(s, job_id=multi, attempt=1, node_rank=0, worker_id="w-a",
                             exit_code=143, stop=None, detail="")
            assert job_store.node_lost(session=s, job_id=multi, worker_id="w-a",
                                       reason="node 1 was stopped", progress=None,
                                       store=server.app.state.store) == JobStatus.QUEUED
            s.commit()
        summary = c.get(f"/web/jobs/{multi}/summary").text
        assert "Re-queued: waiting for 2 workers for attempt 2. Attempt 1 ran on these " \
            "nodes:" in summary
        assert "<td>143</td>" in _node_row(summary, 0)
        assert "<td>143 (worker shutdown)</td>" in _node_row(summary, 1)
        requeued = c.get(f"/v1/jobs/{multi}").json()["node_workers"]
        assert [(n["exit_code"], n["stop"]) for n in requeued] == [(143, None),
                                                                   (143, "worker shutdown")]
        take_node(sessions, multi, "w-c", "10.0.0.3", attempt=2)
        summary = c.get(f"/web/jobs/{multi}/summary").text
        assert "1 of 2 nodes claimed for attempt 2" in summary
        assert "w-c" in _node_row(summary, 0) and "waiting for a worker" in _node_row(summary, 1)
        assert c.post(f"/v1/jobs/{multi}/cancel").json()["status"] == "cancelled"
        summary = c.get(f"/web/jobs/{multi}/summary").text  # the nodes of its last run
        assert "2 nodes, world size 2, attempt 1." in summary
        assert "<td>143 (worker shutdown)</td>" in _node_row(summary, 1)

        one = c.get(f"/web/jobs/{single}/summary").text
        assert 'id="devices">CPU · queue cpu</dd>' in one
        assert "nodes-card" not in one and "world-size" not in one
        assert c.get(f"/v1/jobs/{single}").json()["node_workers"] is None
        c.post(f"/v1/jobs/{single}/cancel")
