"""``libreyolo-service datasets upload|list|rm`` and the SDK's dataset calls, against a
real API server (the upload's scan runs the real engine's ``checks``)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from libreyolo_client import Client


@pytest.fixture
def cli(stack, token):
    from service.cli import app

    runner = CliRunner()
    env = {"LIBREYOLO_URL": stack.url, "LIBREYOLO_TOKEN": token}

    def run(*args: str):
        return runner.invoke(app, ["datasets", *args], env=env, catch_exceptions=False)

    return run


def test_upload_again_list_and_rm(cli, tmp_path):
    from libreyolo_core.data.sample import generate_sample_dataset

    folder = generate_sample_dataset(tmp_path / "shapes", n_train=4, n_val=2, imgsz=64).parent
    first = cli("upload", str(folder))
    assert first.exit_code == 0, first.output
    ds_id = first.stdout.strip()
    assert ds_id.startswith("d") and "shapes: ready; train 4 images" in first.stderr
    again = cli("upload", str(folder), "--name", "again")
    assert again.stdout.strip() == ds_id, again.output  # the same zip: the same dataset
    listed = cli("list")
    assert listed.stdout.count(ds_id) == 1 and "data.yaml" in listed.stdout
    assert str(tmp_path) not in listed.stdout
    removed = cli("rm", ds_id)
    assert removed.exit_code == 0 and f"deleted {ds_id}" in removed.stdout
    assert ds_id not in cli("list").stdout
    gone = cli("rm", ds_id)
    assert gone.exit_code == 1 and "not found" in gone.stderr


def test_folder_without_yaml_is_named(cli, stack, token, tmp_path):
    folder = tmp_path / "no-yaml"
    (folder / "images").mkdir(parents=True)
    (folder / "images" / "a.jpg").write_bytes(b"not really")
    r = cli("upload", str(folder))
    assert r.exit_code == 2 and f"dataset folder {folder} holds no dataset yaml" in r.stderr
    with Client(stack.url, token) as c, pytest.raises(FileNotFoundError, match="no-yaml"):
        c.upload_dataset(folder)
