"""Dataset zip uploads: safe extraction, caps, the engine's scan report."""

from __future__ import annotations

import io
import stat
import zipfile
from pathlib import Path

import pytest
from testkit import client, make_user

from service.storage.zipsafe import UnsafeZipError, extract_zip


@pytest.fixture
def bob(server, sessions):
    _, token = make_user(sessions)
    with client(server.url, token) as c:
        yield c


def _zip(members: dict[str, bytes], symlink: str | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        if symlink:
            info = zipfile.ZipInfo(symlink)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, "/etc/passwd")
    return buf.getvalue()


def _upload(c, body: bytes, name: str = "ds"):
    return c.post("/v1/datasets", params={"name": name}, content=body,
                  headers={"Content-Type": "application/zip"})


@pytest.mark.parametrize("members, symlink, words", [
    ({"../evil.txt": b"x", "data.yaml": b"a: 1"}, None, "contains '..'"),
    ({"/abs/evil.txt": b"x"}, None, "absolute path"),
    ({"data.yaml": b"a: 1"}, "images/link", "is a symlink"),
    ({"bomb.bin": b"\0" * (24 << 20)}, None, "compression ratio"),
    ({"readme.txt": b"no yaml"}, None, "no dataset yaml"),
])
def test_unsafe_zips_are_rejected_and_nothing_written(bob, server, members, symlink, words):
    uploads = server.app.state.settings.upload_root
    before = set(uploads.iterdir()) if uploads.exists() else set()
    r = _upload(bob, _zip(members, symlink))
    assert r.status_code == 422, r.text
    assert words in r.json()["detail"] and r.json()["field"] == "body"
    assert set(uploads.iterdir()) == before
    assert not (uploads.parent / "evil.txt").exists() and not Path("/abs/evil.txt").exists()


def test_not_a_zip(bob):
    r = _upload(bob, b"hello")
    assert r.status_code == 422 and "not a zip" in r.json()["detail"]


def test_extract_counts_real_bytes(tmp_path):
    data = _zip({"a.bin": b"1" * 5000, "b.bin": b"2" * 5000})
    with zipfile.ZipFile(io.BytesIO(data)) as zf, pytest.raises(UnsafeZipError, match="more than"):
        extract_zip(zf, tmp_path / "x", max_total_bytes=8000, max_ratio=1e9)
    assert not (tmp_path / "x").exists()


def test_upload_sample_dataset_scans_it(bob, server, tmp_path):
    sample = pytest.importorskip("libreyolo_core.data.sample")
    yaml_path = sample.generate_sample_dataset(tmp_path / "s", n_train=4, n_val=2, imgsz=64)
    root = yaml_path.parent
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for p in sorted(root.rglob("*")):
            if p.is_file():
                zf.write(p, f"sample/{p.relative_to(root)}")
    r = _upload(bob, buf.getvalue(), "sample")
    assert r.status_code == 201, r.text
    ds = r.json()
    assert ds["path"] == "sample/data.yaml" and ds["source"] == "upload"
    assert ds["report"]["exit_code"] == 0, ds["report"]
    assert ds["status"] == "ready" and set(ds["report"]["splits"]) >= {"train", "val"}
    # the report once (no raw output of a successful scan), no path of the service's disk
    assert "output" not in ds["report"] and "cache" not in ds["report"]["splits"]["train"]
    assert ds["report"]["splits"]["train"]["source"] == "sample/data.yaml: split 'train'"
    assert '"/' not in r.text, r.text

    again = _upload(bob, buf.getvalue(), "sample again")
    assert again.status_code == 200 and again.json()["id"] == ds["id"]
    assert [d["id"] for d in bob.get("/v1/datasets").json()["data"]].count(ds["id"]) == 1

    files = server.app.state.settings.upload_root / ds["id"]
    assert (files / "sample" / "data.yaml").is_file()
    assert bob.delete(f"/v1/datasets/{ds['id']}").status_code == 204
    assert bob.get(f"/v1/datasets/{ds['id']}").status_code == 404 and not files.exists()
    assert bob.delete(f"/v1/datasets/{ds['id']}").status_code == 404


def test_dataset_in_use_is_not_deleted(bob, server, sessions, data_yaml):
    ds = bob.post("/v1/datasets/register", json={"name": "r", "path": data_yaml}).json()
    job = bob.post("/v1/jobs", json={"model": "yolo9-t", "data": ds["id"], "gpus": 0}).json()
    r = bob.delete(f"/v1/datasets/{ds['id']}")
    assert r.status_code == 409 and r.json()["job_id"] == job["id"], r.text
    _, other = make_user(sessions)
    with client(server.url, other) as eve:
        assert eve.delete(f"/v1/datasets/{ds['id']}").status_code == 404
    assert bob.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202
    assert bob.delete(f"/v1/datasets/{ds['id']}").status_code == 204
    assert Path(data_yaml).is_file()  # a registered dataset's files are the user's


def test_upload_without_a_usable_box_is_refused_at_submit(bob, tmp_path):
    """#28.2: a zip whose labels all use class 5 while names has 2 entries: the scan marks
    it invalid, and a job on it is a 422 naming why, before anything is queued."""
    sample = pytest.importorskip("libreyolo_core.data.sample")
    yaml_path = sample.generate_sample_dataset(tmp_path / "s", n_train=4, n_val=2, imgsz=64)
    root = yaml_path.parent
    for lf in root.rglob("labels/**/*.txt"):
        lf.write_text("".join("5 " + ln.split(" ", 1)[1] + "\n"
                              for ln in lf.read_text().splitlines() if ln.strip()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for p in sorted(root.rglob("*")):
            if p.is_file():
                zf.write(p, f"bad/{p.relative_to(root)}")
    ds = _upload(bob, buf.getvalue(), "bad classes").json()
    assert ds["status"] == "invalid", ds
    assert ds["report"]["splits"]["train"]["boxes"] == 0  # the counts stay visible
    r = bob.post("/v1/jobs", json={"model": "yolo9-t", "data": ds["id"],
                                   "params": {"epochs": 1, "imgsz": 64}})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert "no usable box" in detail and "class ids must be 0.." in detail, detail
    assert "warning:" not in detail


def test_a_batch_bigger_than_an_uploaded_set_is_a_warning_at_submit(bob, tmp_path):
    sample = pytest.importorskip("libreyolo_core.data.sample")
    yaml_path = sample.generate_sample_dataset(tmp_path / "s", n_train=4, n_val=2, imgsz=64)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for p in sorted(yaml_path.parent.rglob("*")):
            if p.is_file():
                zf.write(p, f"four/{p.relative_to(yaml_path.parent)}")
    ds = _upload(bob, buf.getvalue(), "four").json()
    assert ds["status"] == "ready", ds
    r = bob.post("/v1/jobs", json={"model": "yolo9-t", "data": ds["id"], "gpus": 0,
                                   "params": {"epochs": 1, "imgsz": 64, "batch": 128}})
    assert r.status_code == 201, r.text
    assert any("params.batch: 128 is more than the 4 training images" in w
               for w in r.json()["warnings"]), r.json()["warnings"]
    ok = bob.post("/v1/jobs", json={"model": "yolo9-t", "data": ds["id"], "gpus": 0,
                                    "params": {"epochs": 1, "imgsz": 64, "batch": 4}})
    assert not any("params.batch" in w for w in ok.json()["warnings"])
    for j in (r.json()["id"], ok.json()["id"]):
        bob.post(f"/v1/jobs/{j}/cancel")
