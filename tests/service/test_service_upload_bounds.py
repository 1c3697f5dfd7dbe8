"""Uploads are bounded in every dimension and stay in their folder; registered and job
data paths stay out of the service's upload and artifact roots (real API server)."""

from __future__ import annotations

import io
import zipfile

import pytest
from testkit import client, make_user

from service.storage.zipsafe import UnsafeZipError, ZipLimits, check_zip


@pytest.fixture
def carol(server, sessions):
    _, token = make_user(sessions)
    with client(server.url, token) as c:
        yield c


def _zip(members: dict[str, bytes], method=zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _upload(c, body: bytes, name: str = "ds"):
    return c.post("/v1/datasets", params={"name": name}, content=body,
                  headers={"Content-Type": "application/zip"})


def _refused(c, server, body: bytes, *words: str) -> None:
    uploads = server.app.state.settings.upload_root
    before = set(uploads.iterdir()) if uploads.exists() else set()
    r = _upload(c, body)
    assert r.status_code == 422, r.text
    for w in words:
        assert w in r.json()["detail"], r.json()["detail"]
    assert set(uploads.iterdir()) == before  # nothing left on disk


def _other_upload(server) -> str:
    """Another user's extracted upload, as the upload endpoint leaves it (made directly:
    the engine's scan of a real upload is not what is tested here)."""
    folder = server.app.state.settings.upload_root / "d_someoneelse"
    (folder / "images" / "train").mkdir(parents=True, exist_ok=True)
    (folder / "images" / "train" / "a.jpg").write_bytes(b"private")
    (folder / "data.yaml").write_text("train: images/train\nnames: [a]\n")
    return folder.name


def test_a_split_path_into_another_upload_is_refused(carol, server):
    other_id = _other_upload(server)
    body = _zip({"data.yaml": f"train: ../{other_id}/images/train\nnames: [a]\n".encode()})
    _refused(carol, server, body, "key 'train'", f"'../{other_id}/images/train' leads outside the uploaded dataset")


@pytest.mark.parametrize("members, words", [
    ({"data.yaml": b"path: ..\ntrain: images\nnames: [a]\n"}, ("key 'path'", "outside")),
    ({"data.yaml": b"train: /etc\nnames: [a]\n"}, ("key 'train'", "'/etc' leads outside")),
    ({"data.yaml": b"train: ~/images\nnames: [a]\n"}, ("key 'train'", "outside")),
    ({"data.yaml": b"train: [images, ../../x]\nnames: [a]\n"}, ("key 'train'", "'../../x'")),
    ({"data.yaml": b"train: train.txt\nnames: [a]\n", "train.txt": b"images/a.jpg\n../d_x/images/b.jpg\n"},
     ("train.txt:2", "'../d_x/images/b.jpg' leads outside")),
])
def test_every_path_of_an_uploaded_yaml_stays_inside(carol, server, members, words):
    _refused(carol, server, _zip(members), *words)


LIMITS = [
    ("max_zip_members", 3, {"data.yaml": b"a: 1", "b": b"", "c": b"", "d": b""}, "4 members, more than the limit of 3"),
    ("max_zip_member_bytes", 100, {"data.yaml": b"a: 1", "big.bin": b"x" * 200}, "inflates to 200 bytes"),
    ("max_zip_path_depth", 3, {"data.yaml": b"a: 1", "a/b/c/d/e.txt": b""}, "5 folders deep"),
    ("max_zip_path_chars", 50, {"data.yaml": b"a: 1", "x" * 60 + ".txt": b""}, "64 characters"),
    ("max_yaml_bytes", 100, {"data.yaml": b"names: [a]\n" + b"#" * 200 + b"\n"}, "data.yaml: 212 bytes"),
    ("max_uncompressed_bytes", 1000, {"data.yaml": b"a: 1", "a.bin": b"1" * 600, "b.bin": b"2" * 600},
     "more than 1000 bytes"),
]


@pytest.mark.parametrize("setting, value, members, words", LIMITS, ids=[x[0] for x in LIMITS])
def test_each_archive_limit_refuses_naming_it(carol, server, monkeypatch, setting, value, members, words):
    monkeypatch.setattr(server.app.state.settings, setting, value)
    _refused(carol, server, _zip(members), words, setting)


def test_duplicate_members_and_alias_bombs_are_refused(carol, server):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf, pytest.warns(UserWarning, match="Duplicate name"):
        zf.writestr("data.yaml", b"a: 1")
        zf.writestr("data.yaml", b"a: 2")
    _refused(carol, server, buf.getvalue(), "'data.yaml' appears twice")
    bomb = b"a: &a [x, x, x, x, x, x, x, x, x, x]\n" + b"".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n".encode()
        for i in range(6))
    _refused(carol, server, _zip({"data.yaml": bomb}), "more than 100000 values")


def test_many_small_highly_compressed_members_pass_the_whole_archive_ratio():
    members = {f"f{i}.txt": b"\0" * 60_000 for i in range(40)}  # 2.4 MB of zeros, each < 1 MiB
    with zipfile.ZipFile(io.BytesIO(_zip(members))) as zf, \
            pytest.raises(UnsafeZipError, match=r"inflates \d+ times its compressed size.*max_compression_ratio"):
        check_zip(zf, limits=ZipLimits(max_ratio=100))


def test_registered_and_job_paths_stay_out_of_the_upload_and_artifact_roots(carol, server, data_yaml, monkeypatch):
    settings = server.app.state.settings
    inside = str(settings.upload_root / _other_upload(server) / "data.yaml")  # another user's upload
    r = carol.post("/v1/datasets/register", json={"name": "x", "path": inside})
    assert r.status_code == 422 and "lies in the service's own storage" in r.json()["detail"]
    body = {"kind": "train", "model": "yolo9-t", "data": inside, "params": {"epochs": 1}, "gpus": 0}
    r = carol.post("/v1/jobs", json=body)
    assert r.status_code == 422 and r.json()["field"] == "data" and "use an uploaded dataset by its id" in r.json()["detail"]
    monkeypatch.setattr(settings, "dataset_roots", [settings.home])
    r = carol.post("/v1/datasets/register", json={"name": "x", "path": data_yaml})
    assert r.status_code == 422 and "not under the configured dataset roots" in r.json()["detail"]
    assert "LIBREYOLO_DATASET_ROOTS" in r.json()["detail"]
    monkeypatch.setattr(settings, "dataset_roots", [])
    assert carol.post("/v1/datasets/register", json={"name": "x", "path": data_yaml}).status_code == 201
