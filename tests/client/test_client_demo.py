"""``make demo`` (``libreyolo_client.demo``) stops the service it started when it is told
to stop: Ctrl-C, SIGTERM or SIGHUP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_demo_stops_its_service_on_sigterm_and_sighup(tmp_path, sig):
    env = os.environ | {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    demo = subprocess.Popen(
        [sys.executable, "-m", "libreyolo_client.demo", "--home", str(tmp_path / "home"),
         "--out", str(tmp_path / "out"), "--epochs", "1"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "home" / "credentials").exists():  # the service is up
            assert demo.poll() is None and time.monotonic() < deadline, demo.stdout.read()
            time.sleep(0.2)
        service = psutil.Process(demo.pid).children(recursive=True)
        assert any("service.cli" in " ".join(p.cmdline()) for p in service)
        demo.send_signal(sig)
        out, _ = demo.communicate(timeout=90)
    finally:
        if demo.poll() is None:
            demo.kill()
    _, alive = psutil.wait_procs(service, timeout=10)
    for p in alive:  # left running: stop it, then fail
        p.kill()
    assert alive == [], [p.cmdline() for p in alive]
    assert demo.returncode == 130 and "stopping the service" in out, out


def test_demo_profile_window_fits_one_epoch_of_the_synthetic_set():
    from libreyolo_client.demo import EASY_SET, profile_window

    n = EASY_SET["n_train"]
    assert profile_window(8, n) == (2, 6)  # the default: 8 steps per epoch, all used
    for batch in (10, 16, 21, 32):
        warm, steps = profile_window(batch, n)
        assert steps >= 2 and warm + steps <= n // batch, batch
    assert profile_window(16, None) == (2, 6)  # a user's dataset: the engine judges it


def test_make_demo_has_a_port_knob():
    """#28.10: `make demo PORT=8123` starts the service on that port."""
    import shutil

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(["make", "-n", "demo", "PORT=8123"], cwd=root, capture_output=True,
                         text=True, timeout=60)
    assert "libreyolo_client.demo" in out.stdout and "--port 8123" in out.stdout, out.stdout


@pytest.mark.slow
def test_demo_on_its_own_synthetic_set_trains_and_publishes(tmp_path):
    """The README's first command with no DATA: the demo generates its synthetic set where
    the service may read it (beside its home, not in it: it was refused with a 422 there),
    pre-trains, publishes the weights as a model and ends with exit 0 (tiny knobs)."""
    env = os.environ | {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    home = tmp_path / "demo"
    out = subprocess.run(
        [sys.executable, "-m", "libreyolo_client.demo", "--home", str(home),
         "--out", str(tmp_path / "out"), "--epochs", "1", "--ft-epochs", "0", "--imgsz", "64",
         "--no-profile", "--no-wait"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    assert "easy SYNTHETIC dataset" in text and "Traceback" not in text, text[-4000:]
    sample = tmp_path / "demo-sample"
    assert (sample / "data.yaml").is_file() and not (home / "sample").exists()
