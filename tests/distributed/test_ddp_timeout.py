"""The process-group timeout is a setting, and a collective that times out names the phase."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest

from libreyolo_core.distributed.context import TIMEOUT_ENV, pg_timeout

SCRIPT = textwrap.dedent("""
    import logging, os, sys, time
    logging.basicConfig(level=logging.INFO)
    from libreyolo_core.distributed.context import broadcast_object, init_distributed, set_phase
    ctx, _ = init_distributed("cpu")
    set_phase("end of epoch 1 (rank 0 validates and saves, the other ranks wait)")
    if ctx.rank == 0:
        time.sleep(12)  # a validation slower than the timeout
    else:
        try:
            broadcast_object(None, ctx)
        except Exception as exc:
            print(type(exc).__name__ + ": " + str(exc), file=sys.stderr, flush=True)
            # not sys.exit: after a timed-out collective, Gloo's threads can abort the
            # interpreter's teardown ("terminate called without an active exception",
            # SIGABRT) on a loaded machine; this test is about the message
            os._exit(7)
""")


def test_timeout_setting(monkeypatch):
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    assert pg_timeout().total_seconds() == 3 * 3600
    monkeypatch.setenv(TIMEOUT_ENV, "90")
    assert pg_timeout().total_seconds() == 90
    monkeypatch.setenv(TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match="LIBREYOLO_DIST_TIMEOUT_S='soon': must be a positive number"):
        pg_timeout()


def test_a_collective_timeout_names_the_phase_and_the_setting(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "rank.py"
    script.write_text(SCRIPT)
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", TIMEOUT_ENV: "3"}
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stderr=subprocess.PIPE, text=True))
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert procs[1].returncode == 7, errs[1][-2000:]
    assert "CollectiveTimeoutError: a collective timed out after 3 s during end of epoch 1 (rank 0 validates" in errs[1]
    assert "The timeout is LIBREYOLO_DIST_TIMEOUT_S" in errs[1]
    assert f"DDP rendezvous 127.0.0.1:{port} (MASTER_ADDR:MASTER_PORT), 2 ranks, collective timeout 3 s" in errs[0]
