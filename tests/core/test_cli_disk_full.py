"""A full disk is named, with the free space, in the message and the error file the
service reads (issue 27, section 5). /dev/full is a real device whose writes fail with
ENOSPC."""

from __future__ import annotations

import json
import os

import pytest

from libreyolo_core import cli


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_enospc_is_named_with_the_free_space(tmp_path, monkeypatch, capsys):
    error_file = tmp_path / "engine_error.json"
    monkeypatch.setenv("LIBREYOLO_ERROR_FILE", str(error_file))
    monkeypatch.chdir(tmp_path)

    def fill(keys):
        with open("/dev/full", "wb") as f:
            try:
                f.write(b"x" * 4096)
                f.flush()
            except OSError as exc:  # as torch reports it: a RuntimeError from the OSError
                raise RuntimeError("PytorchStreamWriter failed writing file data/0") from exc
        return 0

    monkeypatch.setitem(cli.HANDLERS, "info", fill)
    assert cli.run(["info"]) == cli.EXIT_RUNTIME
    err = capsys.readouterr().err
    assert "disk full: no space left on the device of" in err and "MiB free of" in err
    record = json.loads(error_file.read_text())
    assert record["error"].startswith("DiskFull: ") and "MiB free of" in record["error"]
