"""The hot reads under load: the outlook memo, one SSE poller per API process (streams
served by any process; idle streams cost no query each), ``serve --workers``.

Counts statements and computations, never wall-clock time (bench/service_latency.py
measures that)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import httpx
import pytest
from sqlalchemy import event
from testkit import REPO, ServerThread, free_port, make_user, queued_job, wait_for

from service.db.models import Job, User
from service.lifecycle import FINISH, JobStatus
from service.ops import append_events, transition


@pytest.fixture
def second_api(api_settings):
    """Another API app (its own engine, notifier and memo) on the same database: a second
    API process as far as the service can tell."""
    from service.app import create_app

    app = create_app(api_settings)
    srv = ServerThread(app).start()
    srv.app = app
    yield srv
    srv.stop()


def _user_id(sessions, name: str) -> str:
    with sessions() as s:
        return s.query(User).filter_by(name=name).one().id


async def _follow(url: str, token: str, job_ids: list[str], opened: asyncio.Event | None,
                  until: str, n_open: list[int]) -> list[list[dict]]:
    """Open one SSE stream per entry of ``job_ids`` and read each until an event whose
    ``data`` contains ``until``; returns the events of every stream."""
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=len(job_ids) + 1)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60,
                                 limits=limits) as c:
        async def one(job_id: str) -> list[dict]:
            got: list[dict] = []
            async with c.stream("GET", f"/v1/jobs/{job_id}/events/stream") as r:
                assert r.status_code == 200
                n_open[0] += 1
                cur: dict = {}
                async for line in r.aiter_lines():
                    if line == "":
                        if cur:
                            got.append(cur)
                            if until in cur.get("data", ""):
                                return got
                        cur = {}
                    elif not line.startswith(":"):
                        k, _, v = line.partition(":")
                        cur[k] = v.lstrip(" ")
            return got

        return await asyncio.gather(*(one(j) for j in job_ids))


def test_a_stream_on_one_api_process_gets_what_another_writes(server, second_api, sessions):
    """A stream opened on API A follows a job cancelled through API B, to its end."""
    name, token = make_user(sessions)
    job_id = queued_job(sessions, _user_id(sessions, name))
    n_open = [0]
    result: list = []

    def follow() -> None:
        result.extend(asyncio.run(_follow(server.url, token, [job_id], None, '"end"', n_open)))

    import threading

    t = threading.Thread(target=follow)
    t.start()
    wait_for(lambda: n_open[0] == 1, 20, what="the stream to open")
    r = httpx.post(f"{second_api.url}/v1/jobs/{job_id}/cancel",
                   headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 202, r.text
    t.join(30)
    assert not t.is_alive()
    events = result[0]
    kinds = [(e.get("event"), json.loads(e["data"]).get("data", {}).get("status")) for e in events]
    assert ("status", "cancelled") in kinds and events[-1]["event"] == "end", events


def test_idle_streams_cost_no_query_each_and_all_get_the_next_event(server, sessions):
    """20 streams held open on 4 running jobs: while nothing happens the process runs the
    poller's statements only (not one per stream per poll); one event per job then reaches
    all 20 streams."""
    name, token = make_user(sessions)
    owner = _user_id(sessions, name)
    jobs = [queued_job(sessions, owner, status="running") for _ in range(4)]
    engine = server.app.state.engine
    statements = [0]

    def count(*_a) -> None:
        statements[0] += 1

    n_open = [0]
    out: list = []
    import threading

    t = threading.Thread(target=lambda: out.extend(asyncio.run(
        _follow(server.url, token, jobs * 5, None, '"progress"', n_open))))
    t.start()
    wait_for(lambda: n_open[0] == 20, 30, what="20 streams to open")
    time.sleep(0.5)  # every stream has read its backlog and waits
    event.listen(engine, "before_cursor_execute", count)
    polls_before = server.app.state.notifier.checks
    try:
        time.sleep(1.0)
        idle = statements[0]
        polls = server.app.state.notifier.checks - polls_before
    finally:
        event.remove(engine, "before_cursor_execute", count)
    poll_s = server.app.state.settings.sse_poll_s
    # per-stream polling would be 20 streams x 2 statements x 1 s / poll_s = 800
    assert idle <= polls + 4, (idle, polls)
    assert polls <= 2 * (1.0 / poll_s) + 4, polls
    with sessions() as s:
        for job_id in jobs:
            append_events(s, job_id, [("metric", time.time(), {"event": "progress", "step": 1})])
        s.commit()
    t.join(30)
    assert not t.is_alive() and len(out) == 20
    assert all('"progress"' in got[-1]["data"] for got in out)
    with sessions() as s:
        for job_id in jobs:
            transition(s, job_id, FINISH, JobStatus.CANCELLED)
        s.commit()


def test_outlook_memo_recomputes_only_after_a_write_or_its_age(server, sessions, api_settings):
    from service.outlook_cache import OutlookCache
    from service.workers import live_queues

    now = [0.0]
    memo = OutlookCache(max_age_s=2.0, clock=lambda: now[0])
    name, _ = make_user(sessions)
    owner = _user_id(sessions, name)
    a = queued_job(sessions, owner, queue="gpu-8")
    with sessions() as s:
        live = live_queues(s, api_settings.worker_ttl_s)
        first = memo.outlooks(s, api_settings, ["gpu-8"], live)
        again = memo.outlooks(s, api_settings, ["gpu-8"], live)
    assert memo.computed == 1 and first == again and first[a].position >= 1
    b = queued_job(sessions, owner, queue="gpu-8")  # a submit: its status event
    with sessions() as s:
        got = memo.outlooks(s, api_settings, ["gpu-8"], live)
    assert memo.computed == 2 and got[b].position == got[a].position + 1
    now[0] = 2.5  # aging moves with the clock alone
    with sessions() as s:
        memo.outlooks(s, api_settings, ["gpu-8"], live)
        memo.outlooks(s, api_settings, ["gpu-8"], {**live, "gpu-8": 1})  # a worker came
    assert memo.computed == 4
    with sessions() as s:
        s.query(Job).filter(Job.id.in_([a, b])).update({"status": "cancelled"})
        s.commit()


def test_serve_workers_2_starts_two_api_processes_that_serve(tmp_path):
    import psutil

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "LIBREYOLO_HOME": str(tmp_path / "home"),
           "LIBREYOLO_BROKER_URL": "memory://", "LIBREYOLO_REAPER_ENABLED": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--workers", "2",
                             "--port", str(port)], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def ready() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(lambda: ready() or proc.poll() is not None, 60, 0.2, "serve --workers 2")
        assert proc.poll() is None, proc.stderr.read().decode()
        def api_children() -> list:  # uvicorn's supervisor spawns one child per process
            return [c for c in psutil.Process(proc.pid).children()
                    if "spawn_main" in " ".join(c.cmdline())]

        assert len(wait_for(lambda: len(api_children()) >= 2 and api_children(), 20,
                            what="two API processes")) == 2
        r = httpx.get(f"http://127.0.0.1:{port}/v1/jobs", timeout=5)
        assert r.status_code == 401  # served by the app (problem+json), not a bare socket
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def token_cache(server):
    """The server's token cache replaced by one on a fake clock (``now[0]`` seconds);
    the real one is put back after the test."""
    from service.users import TOKEN_CACHE_S, TokenCache

    now = [0.0]
    real = server.app.state.tokens
    server.app.state.tokens = TokenCache(ttl_s=TOKEN_CACHE_S, clock=lambda: now[0])
    yield server.app.state.tokens, now
    server.app.state.tokens = real


def _statements(engine, calls):
    """Run ``calls()``; returns the SQL statements the engine ran meanwhile."""
    seen: list[str] = []

    def record(_conn, _cursor, statement, *_a) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        calls()
    finally:
        event.remove(engine, "before_cursor_execute", record)
    return seen


def test_a_token_is_looked_up_once_per_ttl_and_a_revoked_one_refused_after_it(
        server, sessions, token_cache):
    """Hot reads with one token: its lookup runs once per TOKEN_CACHE_S, not per request;
    once revoked it still works until that bound, then is refused (401)."""
    from service.db.models import Token
    from service.users import hash_token

    cache, now = token_cache
    name, token = make_user(sessions)
    job_id = queued_job(sessions, _user_id(sessions, name), queue="gpu-8")
    headers = {"Authorization": f"Bearer {token}"}
    paths = [f"/v1/jobs/{job_id}", "/v1/jobs", f"/v1/jobs/{job_id}/events"]

    def read_all() -> None:
        for path in paths * 2:
            assert httpx.get(server.url + path, headers=headers).status_code == 200

    ran = _statements(server.app.state.engine, read_all)
    on_tokens = [s for s in ran if "tokens" in s]
    assert len(on_tokens) == 1 and cache.lookups == 1, on_tokens
    with sessions() as s:
        s.query(Token).filter_by(token_sha256=hash_token(token)).update({"revoked": True})
        s.commit()
    now[0] = cache.ttl_s - 0.1  # within the bound the process still trusts it
    assert httpx.get(server.url + paths[0], headers=headers).status_code == 200
    now[0] = cache.ttl_s  # past it: looked up again, and refused
    r = httpx.get(server.url + paths[0], headers=headers)
    assert r.status_code == 401 and "revoked" in r.json()["detail"]
    assert cache.lookups == 2
    r = httpx.get(server.url + paths[0], headers=headers)  # a refused token is not kept
    assert r.status_code == 401 and cache.lookups == 3


def test_unknown_tokens_are_never_cached(server, token_cache):
    cache, _ = token_cache
    for _ in range(3):
        r = httpx.get(f"{server.url}/v1/jobs", headers={"Authorization": "Bearer lyt_nope"})
        assert r.status_code == 401
    assert cache.lookups == 3 and cache.get("lyt_nope") is None


def test_a_hot_read_runs_only_its_own_statements(server, sessions, token_cache):
    """GET /v1/jobs/{id} of a queued job with a known token: the job, the live workers
    and the outlook memo's mark (the memo already holds the queue), nothing else."""
    name, token = make_user(sessions)
    job_id = queued_job(sessions, _user_id(sessions, name), queue="gpu-8")
    headers = {"Authorization": f"Bearer {token}"}
    url = f"{server.url}/v1/jobs/{job_id}"
    assert httpx.get(url, headers=headers).status_code == 200  # token and memo filled
    ran = _statements(server.app.state.engine,
                      lambda: httpx.get(url, headers=headers).raise_for_status())
    assert len(ran) == 3, ran
    assert not [s for s in ran if "tokens" in s], ran
