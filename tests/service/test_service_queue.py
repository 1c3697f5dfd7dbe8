"""Queue position, effective priority and estimated start in the API, the OpenAPI document
and the pages; ``libreyolo-service users cap``. A database of its own per backend, so that
jobs other tests leave queued do not count."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from testkit import ServerThread, client, fresh_database, make_user, pg_available, write_data_yaml

from service.db.models import Job, User, WorkerRow, utcnow

BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.skipif(
    not pg_available(), reason="PostgreSQL at 127.0.0.1:5432 not reachable"))]


@pytest.fixture(scope="module", params=BACKENDS)
def queue_api(request, tmp_path_factory):
    from service.app import create_app
    from service.settings import Settings

    tmp = tmp_path_factory.mktemp(f"queue-{request.param}")
    with fresh_database(request.param, tmp) as url:
        settings = Settings(home=tmp / "home", database_url=url, broker_url="memory://",
                            reaper_enabled=False, check_data_paths=True)
        app = create_app(settings)
        srv = ServerThread(app).start()
        srv.settings, srv.sessions = settings, app.state.sessions
        yield srv
        srv.stop()


def _submit(c, data: str, priority: int = 0) -> dict:
    r = c.post("/v1/jobs", json={"model": "yolo9-t", "data": data, "gpus": 0,
                                 "priority": priority, "params": {"epochs": 1}})
    assert r.status_code == 201, r.text
    return r.json()


def test_queue_position_and_estimated_start(queue_api, tmp_path):
    data = str(write_data_yaml(tmp_path / "ds"))
    _, token_a = make_user(queue_api.sessions)
    _, token_b = make_user(queue_api.sessions)
    with client(queue_api.url, token_a) as ca, client(queue_api.url, token_b) as cb:
        a = [_submit(ca, data) for _ in range(3)]
        b = _submit(cb, data)
        assert a[0]["queue_position"] == 1 and b["queue_position"] == 2  # the submit answer too
        pos = {j["id"]: ca.get(f"/v1/jobs/{j['id']}").json()["queue_position"] for j in a}
        pos[b["id"]] = cb.get(f"/v1/jobs/{b['id']}").json()["queue_position"]
        # users take turns: A's first, B's, then A's others
        assert [pos[j] for j in (a[0]["id"], b["id"], a[1]["id"], a[2]["id"])] == [1, 2, 3, 4]
        got = cb.get(f"/v1/jobs/{b['id']}").json()
        assert got["effective_priority"] == 0 and got["estimated_start"] is None  # no worker
        listed = {j["id"]: j for j in ca.get("/v1/jobs").json()["data"]}
        assert listed[a[1]["id"]]["queue_position"] == 3
        # a live worker serves cpu and jobs of cpu took 60 s: B starts a job-length after A's
        with queue_api.sessions() as s:
            owner = s.get(Job, b["id"]).owner_id
            now = utcnow()
            s.add(Job(owner_id=owner, kind="train", model="yolo9-t", data=data, params={},
                      gpus=0, procs=1, priority=0, queue="cpu", status="succeeded",
                      created_at=now, started_at=now - timedelta(seconds=90),
                      finished_at=now - timedelta(seconds=30)))
            s.add(WorkerRow(name="w-queue-test", host="h", pid=1, queues=["cpu"], gpus=0))
            s.commit()
        try:
            t0 = utcnow()
            got = cb.get(f"/v1/jobs/{b['id']}").json()
            start = datetime.fromisoformat(got["estimated_start"].replace("Z", "+00:00"))
            assert 55 <= (start - t0).total_seconds() <= 65, got
            first = ca.get(f"/v1/jobs/{a[0]['id']}").json()
            assert first["queue_position"] == 1 and first["estimated_start"] is not None
            # the pages: the jobs table and the job's summary say the same
            rows = ca.get("/web/jobs/rows").text
            assert "next in queue · starts now" in rows and "3rd in queue" in rows
            summary = cb.get(f"/web/jobs/{b['id']}/summary").text
            assert 'id="queue-place">2nd in queue · starts in ~1 min (around <time' in summary
        finally:
            with queue_api.sessions() as s:
                s.query(WorkerRow).filter_by(name="w-queue-test").delete()
                s.commit()
        # a job that left the queue has no position
        for j in a:
            ca.post(f"/v1/jobs/{j['id']}/cancel")
        done = ca.get(f"/v1/jobs/{a[0]['id']}").json()
        assert done["status"] == "cancelled" and done["queue_position"] is None
        assert cb.get(f"/v1/jobs/{b['id']}").json()["queue_position"] == 1


def test_openapi_documents_the_queue_fields(queue_api):
    with client(queue_api.url, None) as c:
        props = c.get("/openapi.json").json()["components"]["schemas"]["JobPublic"]["properties"]
    for name in ("queue_position", "effective_priority", "estimated_start"):
        assert name in props and props[name].get("description"), name


def test_users_cap_command_sets_shows_and_resets(queue_api, monkeypatch):
    from typer.testing import CliRunner

    from service.cli import app

    name, _ = make_user(queue_api.sessions)
    env = {"LIBREYOLO_DATABASE_URL": queue_api.settings.database_url,
           "LIBREYOLO_BROKER_URL": "memory://", "LIBREYOLO_HOME": str(queue_api.settings.home)}
    run = CliRunner()

    def cap_in_db() -> int | None:
        with queue_api.sessions() as s:
            return s.query(User).filter_by(name=name).one().max_running

    r = run.invoke(app, ["users", "cap", name, "6"], env=env)
    assert r.exit_code == 0, r.output
    assert f"{name}: cap 6" in r.output and cap_in_db() == 6
    r = run.invoke(app, ["users", "list"], env=env)
    assert r.exit_code == 0 and any(line.split()[:3] == [name, "no", "6"]
                                    for line in r.output.splitlines()), r.output
    r = run.invoke(app, ["users", "cap", name], env=env)
    assert r.stdout.strip() == f"{name}: cap 6"
    r = run.invoke(app, ["users", "cap", name, "--default"], env=env)
    assert r.exit_code == 0 and cap_in_db() is None and "(default)" in r.output
    r = run.invoke(app, ["users", "cap", "nobody-at-all", "2"], env=env)
    assert r.exit_code == 2 and "no user named 'nobody-at-all'" in r.output
    r = run.invoke(app, ["users", "cap", name, "-1"], env=env)
    assert r.exit_code == 2 and cap_in_db() is None


@pytest.mark.parametrize("kind", BACKENDS)
def test_migration_0004_down_and_up_keeps_the_rows(kind, tmp_path):
    """0004 adds users.max_running and jobs.sent_at to a database with rows in it, and
    goes back down to 0003 without losing them."""
    from alembic import command
    from sqlalchemy import inspect, text

    from service.db.migrate import alembic_config, upgrade
    from service.db.session import make_engine

    with fresh_database(kind, tmp_path) as url:
        command.downgrade(alembic_config(url), "0003")
        engine = make_engine(url)
        try:
            with engine.begin() as conn:
                conn.execute(text("INSERT INTO users (id, name, is_admin, created_at) "
                                  "VALUES ('u1', 'old', false, '2026-01-01 00:00:00')"))
            upgrade(url)
            cols = {c["name"] for c in inspect(engine).get_columns("users")}
            assert "max_running" in cols
            assert "sent_at" in {c["name"] for c in inspect(engine).get_columns("jobs")}
            with engine.begin() as conn:
                assert conn.execute(text("SELECT max_running FROM users WHERE id = 'u1'")
                                    ).scalar_one() is None
            command.downgrade(alembic_config(url), "0003")
            assert "max_running" not in {c["name"] for c in inspect(engine).get_columns("users")}
            with engine.begin() as conn:
                assert conn.execute(text("SELECT name FROM users")).scalar_one() == "old"
            upgrade(url)
        finally:
            engine.dispose()


@pytest.mark.parametrize("kind", BACKENDS)
def test_migration_0006_down_and_up_keeps_the_jobs(kind, tmp_path):
    """0006 adds jobs.nodes (existing jobs: 1) and the job_nodes table, and goes back down
    to 0005 without losing the job rows."""
    from alembic import command
    from sqlalchemy import inspect, text

    from service.db.migrate import alembic_config, upgrade
    from service.db.session import make_engine

    with fresh_database(kind, tmp_path) as url:
        command.downgrade(alembic_config(url), "0005")
        engine = make_engine(url)
        try:
            with engine.begin() as conn:
                conn.execute(text("INSERT INTO users (id, name, is_admin, created_at) "
                                  "VALUES ('u1', 'old', false, '2026-01-01 00:00:00')"))
                conn.execute(text(
                    "INSERT INTO jobs (id, owner_id, kind, model, data, params, gpus, procs, "
                    "priority, queue, status, attempt, max_attempts, cancel_requested, "
                    "event_seq, events_offset, log_offset, created_at) VALUES ('j1', 'u1', "
                    "'train', 'yolo9-t', '/d.yaml', '{}', 0, 1, 0, 'cpu', 'succeeded', 1, 3, "
                    "false, 0, 0, 0, '2026-01-01 00:00:00')"))
            upgrade(url)
            assert "job_nodes" in inspect(engine).get_table_names()
            with engine.begin() as conn:
                assert conn.execute(text("SELECT nodes FROM jobs WHERE id = 'j1'")).scalar_one() == 1
            command.downgrade(alembic_config(url), "0005")
            assert "job_nodes" not in inspect(engine).get_table_names()
            assert "nodes" not in {c["name"] for c in inspect(engine).get_columns("jobs")}
            with engine.begin() as conn:
                assert conn.execute(text("SELECT model FROM jobs")).scalar_one() == "yolo9-t"
            upgrade(url)
        finally:
            engine.dispose()


@pytest.mark.parametrize("kind", BACKENDS)
def test_migration_0010p_keeps_earlier_duplicate_publishes_and_goes_down(kind, tmp_path):
    """0010p (models.state and error, jobs.waiting_note, one model per published job): a
    job published twice before publishing was idempotent keeps both rows (the later one's
    source suffixed), existing models are ready, a third publish of that job is refused by
    the unique index, and it goes back down to 0009s."""
    from alembic import command
    from sqlalchemy import inspect, text
    from sqlalchemy.exc import IntegrityError

    from service.db.migrate import alembic_config, upgrade
    from service.db.session import make_engine

    def model(mid: str, source: str) -> str:
        return ("INSERT INTO models (id, owner_id, name, family, size, nc, names, params, "
                "sha256, bytes, format, source, path, created_at) VALUES "
                f"('{mid}', 'u1', 'x', 'yolo9', 't', 2, '{{}}', 1, 'ab', 1, 'libreyolo', "
                f"'{source}', '/m/{mid}.pt', '2026-01-01 00:00:00')")

    with fresh_database(kind, tmp_path) as url:
        command.downgrade(alembic_config(url), "0009s")
        engine = make_engine(url)
        try:
            with engine.begin() as conn:
                conn.execute(text("INSERT INTO users (id, name, is_admin, created_at) "
                                  "VALUES ('u1', 'old', false, '2026-01-01 00:00:00')"))
                for mid, source in (("m1", "job:j1"), ("m2", "job:j1"), ("m3", "upload"),
                                    ("m4", "upload")):
                    conn.execute(text(model(mid, source)))
            upgrade(url)
            with engine.begin() as conn:
                rows = dict(conn.execute(text("SELECT id, source FROM models ORDER BY id")).all())
                assert rows == {"m1": "job:j1", "m2": "job:j1#m2", "m3": "upload",
                                "m4": "upload"}
                assert {s for (s,) in conn.execute(text("SELECT state FROM models"))} == {"ready"}
            with pytest.raises(IntegrityError), engine.begin() as conn:
                conn.execute(text(model("m5", "job:j1")))
            with engine.begin() as conn:
                conn.execute(text(model("m6", "upload")))  # uploads may repeat
            command.downgrade(alembic_config(url), "0009s")
            assert "state" not in {c["name"] for c in inspect(engine).get_columns("models")}
            assert "waiting_note" not in {c["name"] for c in inspect(engine).get_columns("jobs")}
            upgrade(url)
        finally:
            engine.dispose()
