"""The model registry through the SDK (sync and async) and ``libreyolo-service models ...``."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil

import pytest
from testkit import write_weights
from typer.testing import CliRunner

from libreyolo_client import AsyncClient, Conflict, Model, NotFound, ValidationError


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return write_weights(tmp_path_factory.mktemp("w") / "shapes.pt")


def _finished_job_with_best(client, stack, data_yaml, weights):
    """A succeeded job (fake engine) whose run dir holds ``weights/best.pt``."""
    job = client.train(model="yolo9-t", data=data_yaml, gpus=0, epochs=1, imgsz=64, batch=2)
    stack.run_in_background(job.id, FAKE_EPOCH_S="0.05").join(60)
    best = stack.settings.artifact_root / job.id / "run" / "weights" / "best.pt"
    shutil.copyfile(weights, best)
    job.refresh()
    assert job.status == "succeeded"
    return job


def test_sdk_upload_list_download_publish_delete(client, stack, data_yaml, weights, tmp_path):
    m = client.upload_model(weights, name="shapes")
    assert isinstance(m, Model) and m.model_name == "yolo9-t" and m.nc == 2
    assert [x.id for x in client.models()][:1] == [m.id] and client.model(m.id) == m
    path = client.download_model(m.id, tmp_path / "dl")
    assert path == tmp_path / "dl" and hashlib.sha256(path.read_bytes()).hexdigest() == m.sha256

    job = client.train(model=m.id, data=data_yaml, gpus=0, epochs=1, imgsz=64, batch=2)
    assert job.info.model == m.id  # the public form of a registered model: its id
    with pytest.raises(Conflict):
        client.delete_model(m.id)
    job.cancel()

    done = _finished_job_with_best(client, stack, data_yaml, weights)
    published = done.publish("shapes-ft")
    assert published.source == f"job:{done.id}" and published.sha256 == m.sha256

    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ValidationError) as err:
        client.upload_model(bad)
    assert err.value.field == "body" and "not a torch file" in err.value.detail
    client.delete_model(m.id)
    with pytest.raises(NotFound):
        client.model(m.id)


def test_async_client_models(stack, token, weights):
    async def go():
        async with AsyncClient(stack.url, token, backoff_s=0.1) as c:
            m = await c.upload_model(weights, name="async")
            assert (await c.model(m.id)).sha256 == m.sha256
            assert m.id in [x.id for x in await c.models()]
            await c.delete_model(m.id)
            assert m.id not in [x.id for x in await c.models()]

    asyncio.run(go())


def test_cli_models_upload_list_show_publish_rm(stack, token, client, data_yaml, weights,
                                                tmp_path):
    from service.cli import app

    env = {"LIBREYOLO_URL": stack.url, "LIBREYOLO_TOKEN": token}

    def run(*args: str):
        return CliRunner().invoke(app, ["models", *args], env=env, catch_exceptions=False)

    r = run("upload", str(weights), "--name", "cli")
    assert r.exit_code == 0, r.output
    model_id = r.stdout.split()[0]
    assert model_id.startswith("m") and "yolo9-t" in r.stdout
    assert model_id in run("list").stdout
    assert json.loads(run("show", model_id, "--json").stdout)["name"] == "cli"
    shown = run("show", model_id).stdout  # #28.10: lines, as `models list` and `jobs show`
    assert f"id:       {model_id}\nname:     cli\nmodel:    yolo9-t\n" in shown, shown
    assert "params:   " in shown and "source:   upload" in shown and "{" not in shown
    r = run("download", model_id, "-o", f"{tmp_path / 'newdir'}/")  # a folder, made
    assert r.exit_code == 0 and (tmp_path / "newdir" / "cli.pt").read_bytes() == weights.read_bytes()

    job = _finished_job_with_best(client, stack, data_yaml, weights)
    r = run("publish", job.id, "--name", "from-cli")
    assert r.exit_code == 0 and f"job:{job.id}" in r.stdout, r.output

    # jobs list names the model as the job page does, never the server's file path
    tiny = dict(data=data_yaml, gpus=0, epochs=1, imgsz=64, batch=2)
    from_model = client.train(model=model_id, **tiny)
    from_job = client.train(model=f"job:{job.id}/weights/best.pt", **tiny)
    listed = CliRunner().invoke(app, ["jobs", "list"], env=env, catch_exceptions=False).stdout
    rows = {line.split()[0]: line.split() for line in listed.splitlines()[1:]}
    assert rows[from_model.id][2] == model_id and rows[from_job.id][2] == f"job:{job.id}", listed
    assert rows[job.id][2] == "yolo9-t" and str(stack.settings.model_root) not in listed, listed
    from_model.cancel()
    from_job.cancel()

    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"nope")
    r = run("upload", str(bad))
    assert r.exit_code == 2 and "not a usable weights file" in r.output
    assert run("rm", model_id).exit_code == 0
    r = run("show", model_id)
    assert r.exit_code == 1 and "not found" in r.output
