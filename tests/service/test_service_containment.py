"""One containment rule for every dataset path (issue 27, section 1), on a real server:
another user's upload is reachable by no route (register, a job's ``data`` as a path or a
dataset id, ``path:``, a split folder, a ``.txt`` list entry, a symlinked folder or image);
answers and logs name ``dataset:<id>``, never the service's folders."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import pytest
from testkit import client, make_user


@pytest.fixture
def alice(server, sessions):
    _, token = make_user(sessions)
    with client(server.url, token) as c:
        yield c


@pytest.fixture
def eve(server, sessions):
    _, token = make_user(sessions)
    with client(server.url, token) as c:
        yield c


@pytest.fixture(scope="session")
def alice_upload(server, sessions, tmp_path_factory):
    """A real upload of a tiny sample dataset by its own user: (client token, dataset)."""
    sample = pytest.importorskip("libreyolo_core.data.sample")
    root = sample.generate_sample_dataset(tmp_path_factory.mktemp("a") / "s", n_train=2,
                                          n_val=1, imgsz=64).parent
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for p in sorted(root.rglob("*")):
            if p.is_file():
                zf.write(p, f"sample/{p.relative_to(root)}")
    _, token = make_user(sessions)
    with client(server.url, token) as c:
        r = c.post("/v1/datasets", params={"name": "private"}, content=buf.getvalue(),
                   headers={"Content-Type": "application/zip"})
    assert r.status_code == 201, r.text
    return token, r.json()


def _job(c, data):
    return c.post("/v1/jobs", json={"model": "yolo9-t", "data": data, "gpus": 0,
                                    "params": {"epochs": 1}})


def _yaml(folder: Path, text: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data.yaml").write_text(text)
    return str(folder / "data.yaml")


def _attacks(tmp_path: Path, uploads: Path, victim: Path) -> dict[str, str]:
    """Every way a yaml of the attacker's own folder could reach the victim's upload."""
    out = {
        "path: the upload root": _yaml(tmp_path / "a1", f"path: {uploads}\ntrain: .\nval: .\nnames: [a]\n"),
        "path: the victim's folder": _yaml(tmp_path / "a2", f"path: {victim}\ntrain: .\nnames: [a]\n"),
        "absolute split": _yaml(tmp_path / "a3", f"train: {victim}/images\nnames: [a]\n"),
        "relative split": _yaml(tmp_path / "a4", f"train: {os.path.relpath(victim, tmp_path / 'a4')}\n"
                                                 "names: [a]\n"),
        "split list of splits": _yaml(tmp_path / "a5", f"train: [., {victim}]\nnames: [a]\n"),
        "home": _yaml(tmp_path / "a6", f"path: {uploads.parent}\ntrain: .\nnames: [a]\n"),
    }
    # a .txt list whose entry is the victim's image
    image = next(victim.rglob("*.png"), None) or next(victim.rglob("*.jpg"))
    (tmp_path / "a7").mkdir()
    (tmp_path / "a7" / "train.txt").write_text(f"{image}\n")
    out["txt list entry"] = _yaml(tmp_path / "a7", "train: train.txt\nnames: [a]\n")
    # a symlinked folder, and a symlinked image inside a folder of the attacker's
    (tmp_path / "a8").mkdir()
    (tmp_path / "a8" / "images").symlink_to(image.parent, target_is_directory=True)
    out["symlinked folder"] = _yaml(tmp_path / "a8", "train: images\nnames: [a]\n")
    (tmp_path / "a9" / "images").mkdir(parents=True)
    (tmp_path / "a9" / "images" / "x.png").symlink_to(image)
    out["symlinked image"] = _yaml(tmp_path / "a9", "train: images\nnames: [a]\n")
    # the yaml itself a symlink to the victim's yaml
    (tmp_path / "a10").mkdir()
    (tmp_path / "a10" / "data.yaml").symlink_to(next(victim.rglob("data.yaml")))
    out["symlinked yaml"] = str(tmp_path / "a10" / "data.yaml")
    # a folder that holds the service's state (walking it reaches every upload)
    return out


def test_no_route_reaches_another_users_upload(eve, server, alice_upload, tmp_path):
    settings = server.app.state.settings
    _, ds = alice_upload
    victim = settings.upload_root / ds["id"]
    attempts = leaks = 0
    for what, path in _attacks(tmp_path, settings.upload_root, victim).items():
        for route, r in (("register", eve.post("/v1/datasets/register", json={"name": "x", "path": path})),
                         ("job data", _job(eve, path))):
            attempts += 1
            if r.status_code != 422:
                leaks += 1
                print(f"LEAK {what} via {route}: {r.status_code} {r.text[:300]}")
                continue
            body = r.json()
            assert body["field"] in ("path", "data"), (what, route, body)
            if what.startswith("symlinked"):  # the answer names the link, never its target
                assert str(settings.upload_root) not in r.text, r.text
    # the victim's upload by id: not found for another user
    for _route, r in (("job data id", _job(eve, ds["id"])),
                      ("job data dataset:id", _job(eve, f"dataset:{ds['id']}")),
                      ("dataset get", eve.get(f"/v1/datasets/{ds['id']}"))):
        attempts += 1
        leaks += r.status_code not in (404, 422)
    print(f"cross-user attempts: {attempts}, leaks: {leaks}")
    assert leaks == 0
    assert not list(victim.rglob("*.labels.cache")), "a scan wrote into the upload's folder"


def test_a_registered_yaml_changed_after_registering_is_refused_at_submit(eve, server, alice_upload, tmp_path):
    settings = server.app.state.settings
    (tmp_path / "d" / "images").mkdir(parents=True)
    from testkit import write_data_yaml

    path = write_data_yaml(tmp_path / "d")
    ds = eve.post("/v1/datasets/register", json={"name": "mine", "path": str(path)})
    assert ds.status_code == 201, ds.text
    assert _job(eve, ds.json()["id"]).status_code == 201
    victim = settings.upload_root / alice_upload[1]["id"]
    path.write_text(f"path: {victim}\ntrain: .\nnames: [a]\n")
    r = _job(eve, ds.json()["id"])
    assert r.status_code == 422 and "key 'path'" in r.json()["detail"], r.text
    assert "service's own storage" in r.json()["detail"]


def test_a_job_on_an_upload_shows_dataset_id_never_the_service_folder(server, alice_upload):
    settings = server.app.state.settings
    token, ds = alice_upload
    with client(server.url, token) as alice:
        r = _job(alice, ds["id"])
        assert r.status_code == 201, r.text
        job = r.json()
        assert job["data"] == f"dataset:{ds['id']}"
        assert str(settings.home) not in r.text and str(settings.upload_root) not in r.text
        # the public name is accepted back as data
        assert _job(alice, job["data"]).status_code == 201
        # the engine's log names the yaml and images by their absolute paths: served with
        # the service's folders named as the API names them
        log = server.app.state.store.log_path(job["id"])
        log.parent.mkdir(parents=True, exist_ok=True)
        yaml_path = settings.upload_root / ds["id"] / "sample" / "data.yaml"
        log.write_text(f"{yaml_path}: split 'train': 2 images\n"
                       f"saved {settings.artifact_root}/{job['id']}/run/weights/best.pt\n")
        text = alice.get(f"/v1/jobs/{job['id']}/logs").text
        assert text == (f"dataset:{ds['id']}/sample/data.yaml: split 'train': 2 images\n"
                        f"saved job:{job['id']}/weights/best.pt\n"), text
        assert alice.get(f"/v1/jobs/{job['id']}").json()["data"] == f"dataset:{ds['id']}"
        # the same lines as log events, and a run_start naming the yaml
        import time

        from service.ops import append_events

        with server.app.state.sessions() as s:
            append_events(s, job["id"], [
                ("log", time.time(), {"lines": [f"{yaml_path}: split 'train'"]}),
                ("status", time.time(), {"event": "run_start", "data": str(yaml_path)})])
            s.commit()
        events = alice.get(f"/v1/jobs/{job['id']}/events").json()["data"]
        assert events[-2]["data"]["lines"] == [f"dataset:{ds['id']}/sample/data.yaml: split 'train'"]
        assert events[-1]["data"]["data"] == f"dataset:{ds['id']}/sample/data.yaml"
        with alice.stream("GET", f"/v1/jobs/{job['id']}/events/stream",
                          params={"after": events[-2]["seq"] - 1}) as stream:
            for line in stream.iter_lines():
                if line.startswith("data:") and "run_start" in line:
                    assert str(settings.upload_root) not in line and f"dataset:{ds['id']}" in line
                    break
        page = alice.get(f"/jobs/{job['id']}")
        assert page.status_code == 200 and str(settings.upload_root) not in page.text


def test_cache_dir_is_a_reserved_param(alice, data_yaml):
    r = alice.post("/v1/jobs", json={"model": "yolo9-t", "data": data_yaml, "gpus": 0,
                                     "params": {"cache_dir": "/tmp/x"}})
    assert r.status_code == 422 and r.json()["field"] == "params.cache_dir", r.text


def test_another_users_rows_are_reachable_by_no_id_route(eve, server, alice_upload):
    """Every route that takes an id, tried by another user on the owner's job and
    dataset: 404 (or a 422 naming the field), never the row."""
    token, ds = alice_upload
    with client(server.url, token) as alice:
        job = _job(alice, ds["id"]).json()
    jid, did = job["id"], ds["id"]
    tries = [eve.get(f"/v1/jobs/{jid}"), eve.get(f"/v1/jobs/{jid}/events"),
             eve.get(f"/v1/jobs/{jid}/events/stream"), eve.get(f"/v1/jobs/{jid}/logs"),
             eve.get(f"/v1/jobs/{jid}/artifacts"), eve.get(f"/v1/jobs/{jid}/artifacts/train.log"),
             eve.post(f"/v1/jobs/{jid}/cancel"), eve.post(f"/v1/jobs/{jid}/publish", json={"name": "x"}),
             eve.get(f"/v1/datasets/{did}"), eve.delete(f"/v1/datasets/{did}"),
             _job(eve, did), _job(eve, f"dataset:{did}"),
             eve.post("/v1/jobs", json={"model": f"job:{jid}/weights/best.pt", "data": did, "gpus": 0}),
             eve.get(f"/jobs/{jid}")]
    # (a 404 may echo the id that was sent; it never shows the row: the dataset's name)
    leaks = [(r.request.method, r.request.url.path, r.status_code) for r in tries
             if r.status_code not in (404, 422) or ds["name"] in r.text]
    print(f"cross-user id attempts: {len(tries)}, leaks: {len(leaks)}")
    assert leaks == []
    assert jid not in eve.get("/v1/jobs").text and did not in eve.get("/v1/datasets").text
