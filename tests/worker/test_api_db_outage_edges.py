"""A real PostgreSQL outage (a PRIVATE server, stopped as abruptly as a crash) at the
edges the exception handlers do not see: the request guard's token lookup (a middleware)
answers 503 with Retry-After, not 500; an event stream open when the database goes away
ends cleanly (no cut chunk), and the SDK resumes it after the last event it delivered."""

from __future__ import annotations

import os
import shutil
import threading
import time

import httpx
import pytest
from private_pg import PrivatePostgres, pg_bin
from testkit import ServerThread, client, make_user, queued_job, wait_for

pytestmark = pytest.mark.skipif(
    pg_bin() is None or (os.geteuid() == 0 and shutil.which("runuser") is None),
    reason="PostgreSQL server binaries (initdb, pg_ctl) are not installed")


@pytest.fixture
def private_pg():
    from service.db.migrate import upgrade

    pg = PrivatePostgres().start()
    upgrade(pg.url)
    yield pg
    pg.remove()


def test_token_lookup_in_the_guard_during_an_outage_is_503(make_settings, private_pg):
    from service.app import create_app

    app = create_app(make_settings(private_pg.url, sse_poll_s=0.2))
    srv = ServerThread(app).start()
    try:
        _, token = make_user(app.state.sessions)  # never used: not in the token cache
        private_pg.stop("immediate")
        with client(srv.url, token) as c:  # a body: the guard authenticates before reading it
            r = c.post("/v1/jobs", json={"model": "yolo9-t", "data": "coco128.yaml"})
        assert r.status_code == 503, r.text
        assert r.headers.get("Retry-After") == str(app.state.settings.retry_after_s)
        assert "database" in r.json()["detail"]
    finally:
        private_pg.start()
        srv.stop()


def test_event_stream_ends_cleanly_when_the_database_goes_and_the_sdk_resumes(
        make_settings, private_pg):
    from libreyolo_client import Client
    from service.app import create_app
    from service.db.models import User
    from service.ops import append_events

    app = create_app(make_settings(private_pg.url, sse_poll_s=0.2))
    srv = ServerThread(app).start()
    sessions = app.state.sessions
    try:
        name, token = make_user(sessions)
        with sessions() as s:
            owner = s.query(User).filter_by(name=name).one().id
        job_id = queued_job(sessions, owner)

        def add(n: int) -> None:
            with sessions() as s:
                append_events(s, job_id, [("log", time.time(), {"line": f"line {i}"}) for i in range(n)])
                s.commit()

        notifier = app.state.notifier

        def stream_waits() -> bool:  # sent every event, waits on the notifier for the next
            return notifier.waiting(job_id) > 0

        # 1. the raw stream: the database goes away while it is open and waiting for the
        # next event (where a stream spends its time) -> it ends, no cut chunk
        add(2)
        seen: list[str] = []
        with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {token}"},
                          timeout=30) as c, \
                c.stream("GET", f"/v1/jobs/{job_id}/events/stream") as r:
            assert r.status_code == 200
            for line in r.iter_lines():  # a cut chunk raises RemoteProtocolError here
                if line.startswith("id:"):
                    seen.append(line[3:].strip())
                    if len(seen) == 3:
                        wait_for(stream_waits, timeout=10, what="the stream to wait")
                        private_pg.stop("immediate")
        assert seen == ["1", "2", "3"], seen
        private_pg.start()
        # 2. the SDK: delivered events once each, across a database outage mid-stream
        got: list[int] = []
        sdk = Client(srv.url, token=token)
        job = sdk.job(job_id)

        def follow() -> None:
            for ev in job.events(follow=True, timeout=90):
                got.append(ev.seq)

        t = threading.Thread(target=follow, daemon=True)
        t.start()
        wait_for(lambda: len(got) >= 3, timeout=30, what="the first events")
        wait_for(stream_waits, timeout=10, what="the SDK's stream to wait")
        private_pg.stop("immediate")
        private_pg.start()
        add(2)
        wait_for(lambda: len(got) >= 5, timeout=60, what="the events after the outage")
        assert got == sorted(set(got)), got  # each once, in order
    finally:
        srv.stop()
