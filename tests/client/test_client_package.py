"""``pip install ./client`` gives a working SDK without torch (slow: a venv and a real run).

A fresh virtual environment gets only the client distribution (httpx + pydantic); a
script run by its interpreter submits a 1-epoch job to a real API server whose runner
starts the real engine, waits for it and downloads ``weights/best.pt``, checking its
sha256. The script also proves that neither torch, the engine nor the service is
importable there.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import venv
from pathlib import Path

import pytest
from testkit import REPO, ServerThread, fresh_database, make_user

pytestmark = pytest.mark.slow

SCRIPT = r"""
import importlib.util, json, sys
import libreyolo_client
assert "site-packages" in libreyolo_client.__file__, libreyolo_client.__file__
from libreyolo_client import Client
assert importlib.util.find_spec("torch") is None, "torch is installed in the client venv"
assert importlib.util.find_spec("service") is None, "the service is installed in the client venv"
assert importlib.util.find_spec("libreyolo_core") is None, "the engine is installed in the client venv"
url, token, data, out = sys.argv[1:5]
with Client(url, token) as c:
    job = c.train(model="yolo9-t", data=data, gpus=0, epochs=1, imgsz=64, batch=4, workers=0)
    print(json.dumps({"id": job.id}), flush=True)
    info = job.wait(timeout=600)
    path = job.download("weights/best.pt", out + "/models/")
    print(json.dumps({"status": info.status, "path": str(path),
                      "sha256": {a.path: a.sha256 for a in job.artifacts()}["weights/best.pt"]}))
"""


#: this interpreter's environment without the paths that would reach the repository's code
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


@pytest.fixture
def client_venv(tmp_path) -> Path:
    """A new venv with ``pip install ./client`` (from a copy: the build writes files)."""
    src = tmp_path / "client-src"
    shutil.copytree(REPO / "client", src, symlinks=False,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    str(src)], check=True, capture_output=True, timeout=600, env=CLEAN_ENV)
    return py


def test_client_package_submits_waits_downloads_without_torch(client_venv, sample_yaml,
                                                              tmp_path):
    from service.app import create_app
    from service.settings import Settings
    from worker.runner import run_job

    with fresh_database("sqlite", tmp_path) as url:
        settings = Settings(home=tmp_path / "home", database_url=url, broker_url="memory://",
                            reaper_enabled=False, sse_poll_s=0.1, lease_s=120, heartbeat_s=2,
                            poll_interval_s=0.2, engine_python=sys.executable)
        app = create_app(settings)
        _, token = make_user(app.state.sessions)
        srv = ServerThread(app).start()
        try:
            proc = subprocess.Popen(
                [str(client_venv), "-c", SCRIPT, srv.url, token, str(sample_yaml),
                 str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                cwd=tmp_path, env=CLEAN_ENV)
            first = proc.stdout.readline()
            if not first:
                pytest.fail(f"the client script stopped: {proc.communicate()[1][-3000:]}")
            job_id = json.loads(first)["id"]
            worker = threading.Thread(target=run_job, args=(job_id,), daemon=True,
                                      kwargs={"settings": settings,
                                              "sessions": app.state.sessions})
            worker.start()
            out, err = proc.communicate(timeout=900)
            worker.join(60)
        finally:
            srv.stop()
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    best = Path(result["path"])
    assert result["status"] == "succeeded" and best == tmp_path / "models" / "best.pt"
    assert hashlib.sha256(best.read_bytes()).hexdigest() == result["sha256"]
