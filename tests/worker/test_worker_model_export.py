"""A registered model's ONNX export through the service: ``POST /v1/models/{id}/export``
records the request and sends ``export_model`` to a worker queue; the worker runs the
engine's export (a real one, checked by onnxruntime) and the API serves the ``.onnx``.

The first test calls the worker's task body directly (the API's messages are read off the
in-memory broker: one per export actually asked for), on SQLite and PostgreSQL; the second
runs a real Celery worker process on the embedded SQLite broker and drives it with the
SDK (``model.export("onnx")``, ``model.download(format="onnx")``). Slow: each makes one
real export of a yolo9-t (about 30 s on two CPU cores). The last test (no export run)
covers a lost message and a worker that died mid-export.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from test_worker_celery import start_worker, stop_worker
from testkit import ServerThread, client, make_user, write_weights


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return write_weights(tmp_path_factory.mktemp("mx") / "shapes.pt")


def _export_messages(celery) -> list[str]:
    """The model ids of the ``export_model`` messages waiting in the ``cpu`` queue of the
    in-memory broker (taken off it; other messages are dropped too)."""
    from service.model_export import EXPORT_TASK_NAME

    ids = []
    with celery.connection_for_read() as conn:
        queue = conn.SimpleQueue("cpu", no_ack=True)
        while True:
            try:
                msg = queue.get_nowait()
            except queue.Empty:
                break
            if msg.headers.get("task") == EXPORT_TASK_NAME:
                ids.append(msg.decode()[0][0])
        queue.close()
    return ids


def _onnx_runs(path, nc: int) -> None:
    """The file loads in onnxruntime and gives the ``raw`` layout's ``decoded (1, 4 + nc,
    A)`` for a uint8 image (docs/export.md)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    shape = sess.get_inputs()[0].shape
    image = np.random.default_rng(0).integers(0, 256, size=shape, dtype=np.uint8)
    decoded = sess.run(None, {sess.get_inputs()[0].name: image})[0]
    assert decoded.shape[:2] == (1, 4 + nc) and np.isfinite(decoded).all()


async def _async_export_and_download(url: str, token: str, model_id: str, folder):
    from libreyolo_client import AsyncClient

    folder.mkdir()
    async with AsyncClient(url, token=token) as sdk:
        model = await (await sdk.model(model_id)).export("onnx")
        return model, await model.download(folder, format="onnx")


@pytest.mark.slow
def test_export_is_idempotent_fails_with_the_reason_and_retries(make_settings, db_url,
                                                                 weights, tmp_path):
    pytest.importorskip("onnxruntime")
    from sqlalchemy import delete

    from service.app import create_app
    from service.db.models import WorkerRow
    from worker.model_export import export_model

    settings = make_settings(db_url, engine_command=None)
    app = create_app(settings)
    srv = ServerThread(app).start()
    sessions = app.state.sessions
    try:
        with sessions() as s:  # no live worker: the answer says so
            s.execute(delete(WorkerRow))
            s.commit()
        _, token = make_user(sessions)
        _, other = make_user(sessions)
        _export_messages(app.state.celery)
        with client(srv.url, token) as c, client(srv.url, other) as c2:
            up = c.post("/v1/models", params={"name": "shapes v1"}, content=weights.read_bytes(),
                        timeout=180)
            assert up.status_code == 201, up.text
            model = up.json()
            mid = model["id"]
            assert model["onnx"]["state"] == "none"
            r = c.get(f"/v1/models/{mid}/file", params={"format": "onnx"})
            assert r.status_code == 409 and "no ONNX export yet" in r.json()["detail"]
            # another user can neither export nor download it
            assert c2.post(f"/v1/models/{mid}/export").status_code == 404
            assert c2.get(f"/v1/models/{mid}/file", params={"format": "onnx"}).status_code == 404

            # a weights file the engine cannot read: the export fails with its reason
            stored = settings.model_root / f"{mid}.pt"
            good = stored.read_bytes()
            stored.write_bytes(b"PK\x03\x04 not a checkpoint")
            r = c.post(f"/v1/models/{mid}/export", params={"format": "onnx"})
            assert r.status_code == 202 and r.json()["onnx"]["state"] == "exporting", r.text
            assert any("no live worker can export" in w for w in r.json()["warnings"])
            assert _export_messages(app.state.celery) == [mid]
            assert export_model(mid, settings=settings, sessions=sessions) == "failed"
            failed = c.get(f"/v1/models/{mid}").json()["onnx"]
            assert failed["state"] == "failed" and "not a readable torch weights file" in \
                failed["error"], failed
            r = c.get(f"/v1/models/{mid}/file", params={"format": "onnx"})
            assert r.status_code == 409 and "export failed" in r.json()["detail"]

            # exporting again retries: one new message; asking while it waits sends none
            stored.write_bytes(good)
            first = c.post(f"/v1/models/{mid}/export").json()
            again = c.post(f"/v1/models/{mid}/export")
            assert again.status_code == 202 and again.json()["onnx"]["state"] == "exporting"
            assert again.json()["onnx"]["requested_at"] == first["onnx"]["requested_at"]
            assert _export_messages(app.state.celery) == [mid]
            r = c.get(f"/v1/models/{mid}/file", params={"format": "onnx"})
            assert r.status_code == 409 and "being exported" in r.json()["detail"]

            assert export_model(mid, settings=settings, sessions=sessions) == "ready"
            # a duplicate message finds nothing waiting
            assert export_model(mid, settings=settings, sessions=sessions) == "skipped"
            done = c.get(f"/v1/models/{mid}").json()["onnx"]
            assert done["state"] == "ready" and done["error"] is None
            info = done["info"]
            assert info["max_diff"] <= info["tolerance"] == 1e-4 and info["layout"] == "raw"
            assert info["model"] == "yolo9-t" and info["imgsz"] == 128
            assert "path" not in info  # no server path
            record = json.loads((settings.model_root / f"{mid}.onnx.json").read_text())
            assert record["sha256"] == info["sha256"]

            # ready: 200, the same facts, nothing sent
            r = c.post(f"/v1/models/{mid}/export")
            assert r.status_code == 200 and r.json()["onnx"] == done
            assert _export_messages(app.state.celery) == []

            got = c.get(f"/v1/models/{mid}/file", params={"format": "onnx"})
            assert got.status_code == 200, got.text
            assert 'filename="shapes_v1.onnx"' in got.headers["content-disposition"]
            assert got.headers["x-content-sha256"] == info["sha256"]
            assert len(got.content) == info["bytes"]
            cached = c.get(f"/v1/models/{mid}/file", params={"format": "onnx"},
                           headers={"If-None-Match": got.headers["etag"]})
            assert cached.status_code == 304
            onnx_file = tmp_path / "shapes.onnx"
            onnx_file.write_bytes(got.content)
            _onnx_runs(onnx_file, nc=2)
            # the async SDK: `await model.export("onnx")` (ready: at once) and the download
            again_model, via_async = asyncio.run(_async_export_and_download(
                srv.url, token, mid, tmp_path / "async"))
            assert again_model.onnx.info == info and via_async.read_bytes() == got.content
            # the .pt download is unchanged
            pt = c.get(f"/v1/models/{mid}/file")
            assert pt.status_code == 200 and pt.content == good

            # deleting the model removes its export too
            assert c.delete(f"/v1/models/{mid}").status_code == 204
            assert not (settings.model_root / f"{mid}.onnx").exists()
            assert not (settings.model_root / f"{mid}.onnx.json").exists()
    finally:
        srv.stop()


@pytest.mark.slow
def test_sdk_export_on_a_real_celery_worker(make_settings, sqlite_url, weights, tmp_path):
    """A real worker process (``python -m worker --cpu``) on the embedded SQLite broker
    takes the export message; the SDK waits for it, downloads the ``.onnx`` (sha256
    checked) and onnxruntime runs it; the terminal's `models export|show|download --format
    onnx` too. The model page shows the download and the figure."""
    pytest.importorskip("onnxruntime")
    from libreyolo_client import Client
    from service.app import create_app

    settings = make_settings(sqlite_url, engine_command=None,
                             broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}")
    app = create_app(settings)
    srv = ServerThread(app).start()
    worker = None
    try:
        _, token = make_user(app.state.sessions)
        with Client(srv.url, token=token) as sdk:
            model = sdk.upload_model(weights, name="shapes")
            worker = start_worker(settings, tmp_path / "worker.log")
            done = model.export("onnx", wait=True, timeout=600)
            assert done.onnx.state == "ready", (tmp_path / "worker.log").read_text()[-3000:]
            assert done.onnx.info is not None and done.onnx.info["max_diff"] <= 1e-4
            assert sdk.export_model(model.id).onnx == done.onnx  # ready: nothing made again
            (tmp_path / "out").mkdir()
            path = done.download(tmp_path / "out", format="onnx")
            assert path.name == "shapes.onnx" and path.stat().st_size == done.onnx.info["bytes"]
            _onnx_runs(path, nc=2)
        # the terminal: models export (ready: at once), show, download --format onnx
        from typer.testing import CliRunner

        from service.cli import app as cli_app

        env = {"LIBREYOLO_URL": srv.url, "LIBREYOLO_TOKEN": token}

        def run(*args: str):
            return CliRunner().invoke(cli_app, ["models", *args], env=env, catch_exceptions=False)

        r = run("export", model.id)
        assert r.exit_code == 0 and "onnx:     ready" in r.stdout and "max diff" in r.stdout, \
            r.output
        assert "onnx:     ready" in run("show", model.id).stdout
        r = run("download", model.id, "--format", "onnx", "-o", f"{tmp_path / 'cli'}/")
        assert r.exit_code == 0, r.output
        assert (tmp_path / "cli" / "shapes.onnx").read_bytes() == path.read_bytes()
        with client(srv.url, token) as c:
            page = c.get(f"/models/{model.id}")
        assert page.status_code == 200
        assert f'href="/v1/models/{model.id}/file?format=onnx"' in page.text
        assert "max diff" in page.text and 'data-onnx-state="ready"' in page.text
    finally:
        if worker is not None:
            stop_worker(worker)
        srv.stop()


def test_a_lost_message_is_resent_and_a_dead_workers_export_is_retried(make_settings, db_url,
                                                                      weights):
    """An export no worker took for ``resend_after_s`` is sent again when asked again (the
    worker's claim still runs it once); one a worker started and never finished reads as
    failed after ``export_timeout_s`` + 60 s, and asking again makes a new request."""
    from datetime import timedelta

    from sqlalchemy import update

    from service.app import create_app
    from service.db.models import Model, utcnow
    from worker.model_export import export_model

    settings = make_settings(db_url, engine_command=None, resend_after_s=30,
                             export_timeout_s=100)
    app = create_app(settings)
    srv = ServerThread(app).start()
    sessions = app.state.sessions
    try:
        _, token = make_user(sessions)
        _export_messages(app.state.celery)
        with client(srv.url, token) as c:
            mid = c.post("/v1/models", params={"name": "w"}, content=weights.read_bytes(),
                         timeout=180).json()["id"]
            first = c.post(f"/v1/models/{mid}/export").json()["onnx"]
            assert _export_messages(app.state.celery) == [mid]  # ... and then lost
            assert c.post(f"/v1/models/{mid}/export").status_code == 202
            assert _export_messages(app.state.celery) == []  # not yet: it may be queued
            with sessions() as s:
                s.execute(update(Model).where(Model.id == mid).values(
                    onnx_requested_at=utcnow() - timedelta(seconds=31)))
                s.commit()
            r = c.post(f"/v1/models/{mid}/export")
            assert r.status_code == 202 and r.json()["onnx"]["state"] == "exporting"
            assert _export_messages(app.state.celery) == [mid]

            # a worker claimed it and died: it reads as failed once past its time
            with sessions() as s:
                s.execute(update(Model).where(Model.id == mid).values(
                    onnx_started_at=utcnow() - timedelta(seconds=161)))
                s.commit()
            assert export_model(mid, settings=settings, sessions=sessions) == "skipped"
            stale = c.get(f"/v1/models/{mid}").json()["onnx"]
            assert stale["state"] == "failed" and "did not finish" in stale["error"]
            r = c.post(f"/v1/models/{mid}/export")
            assert r.status_code == 202 and r.json()["onnx"]["state"] == "exporting"
            assert r.json()["onnx"]["requested_at"] != first["requested_at"]
            assert _export_messages(app.state.celery) == [mid]
            with sessions() as s:
                row = s.get(Model, mid)
                assert row.onnx_started_at is None  # the new request waits for a worker
    finally:
        srv.stop()
