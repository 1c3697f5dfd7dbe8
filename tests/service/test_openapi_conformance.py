"""The OpenAPI document tells the truth: a schemathesis run against the real API.

A real uvicorn server on a migrated SQLite database, a real user token, every operation
of ``/openapi.json``, every schemathesis check (status codes, content types, response
schemas, headers, Allow on 405/OPTIONS, negative data rejected, positive data accepted,
auth not ignored), the examples, coverage, fuzzing and stateful phases with a fixed seed
and bounded examples (``schemathesis.toml`` beside this file). The bar is 0 failures.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from testkit import ServerThread, fresh_database, make_user

HERE = Path(__file__).resolve().parent

pytest.importorskip("schemathesis", reason="install the dev extra: pip install -e .[dev]")


def test_schemathesis_finds_no_failure(tmp_path):
    from service.app import create_app
    from service.settings import Settings

    with fresh_database("sqlite", tmp_path) as url:
        settings = Settings(home=tmp_path / "home", database_url=url, broker_url="memory://",
                            reaper_enabled=False, sse_poll_s=0.05, sse_ping_s=5)
        app = create_app(settings)
        _, token = make_user(app.state.sessions)
        srv = ServerThread(app).start()
        try:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                [str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])}
            proc = subprocess.run(
                [sys.executable, "-m", "schemathesis.cli", "--config-file",
                 str(HERE / "schemathesis.toml"), "run", f"{srv.url}/openapi.json",
                 "--header", f"Authorization: Bearer {token}", "--request-timeout", "60"],
                capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
        finally:
            srv.stop()
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report[-6000:]
    assert "Tested: " in report, report[-3000:]
