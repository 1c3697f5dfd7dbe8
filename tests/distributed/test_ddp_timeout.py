"""The process-group timeout is a setting, and a collective that times out names the phase
(this rank's and rank 0's) and the setting; every rank of the job then exits."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

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


#: a training rank whose rank 0 scans the train split for far longer than the timeout (a label
#: cache being built on a slow disk): the slowness is real, in the scan call itself
SLOW_SCAN = textwrap.dedent("""
    import os, sys, time
    from libreyolo_core.engine import build
    scan = build.scan_split
    def slow_scan(*args, **kwargs):
        if os.environ["RANK"] == "0":
            time.sleep(600)
        return scan(*args, **kwargs)
    build.scan_split = slow_scan
    from libreyolo_core.cli import main
    main(sys.argv[1:])
""")
REPO = Path(__file__).resolve().parents[2]


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


@pytest.mark.slow
def test_a_slow_label_cache_on_rank_0_ends_every_rank_naming_both_phases(sample_yaml, tmp_path):
    """Rank 1 waits for rank 0 at the DDP start-up sync while rank 0 is still scanning: rank 1
    times out naming its phase, rank 0's and the setting; torchrun then stops rank 0, which
    leaves its scan at once (SIGTERM during set-up) instead of being killed 30 s later."""
    script = tmp_path / "slow_rank0.py"
    script.write_text(SLOW_SCAN)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", TIMEOUT_ENV: "3",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
           "train", "model=yolo9-t", f"data={sample_yaml}", f"project={tmp_path / 'runs'}", "imgsz=128",
           "batch=8", "epochs=1", "workers=0", "device=cpu", "cache=False"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    out = proc.stdout
    assert proc.returncode != 0, out[-3000:]
    waited = ("CollectiveTimeoutError: a collective timed out after 3 s during DDP start-up (every rank "
              "waits until all have scanned the dataset and built the model, then rank 0's weights are "
              "broadcast) (rank 1); rank 0's phase: scanning the train split (reading or building its "
              "label cache; every rank)")
    assert waited in out, out[-4000:]
    assert "The timeout is LIBREYOLO_DIST_TIMEOUT_S" in out
    # rank 0 left its scan on torchrun's SIGTERM, not by the SIGKILL that follows 30 s later
    assert "SIGTERM received during set-up (scanning the train split" in out, out[-4000:]
    assert "interrupted (SIGTERM): stopped before the first epoch, nothing saved" in out, out[-4000:]
    assert "forcefully exiting via 9" not in out, out[-4000:]
    assert "tensorboard:" not in out  # a tracker that never opened has nothing to close
    assert not (tmp_path / "runs").exists()  # no rank got as far as the run folder
