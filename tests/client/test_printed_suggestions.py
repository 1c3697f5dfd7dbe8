"""#28.4: every way out an error prints works exactly as printed, wherever it is printed:
the profile window's ways out, run as ``libreyolo profile run`` flags, as
``libreyolo-service jobs submit --kind profile`` flags (a real job on the real engine),
and as the training keys in parentheses (the SDK's params)."""

from __future__ import annotations

import re
import subprocess
import sys
import threading

import pytest
from testkit import make_user
from typer.testing import CliRunner

FLAGS = re.compile(r"((?:--[a-z-]+ \d+)(?: --[a-z-]+ \d+)*) \(([a-z_]+=\d+(?:, [a-z_]+=\d+)*)\)")
SMALL = ["--imgsz", "64", "--workers", "0", "--device", "cpu"]


def _profile_run(data, project, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "libreyolo_core.cli", "profile", "run", str(data),
                           *SMALL, "--project", str(project), *flags],
                          capture_output=True, text=True, timeout=600)


def _ways(stderr: str) -> list[tuple[list[str], dict[str, int]]]:
    """Each printed way out with numbers: (its flags, its training keys)."""
    out = []
    for flags, keys in FLAGS.findall(stderr):
        kv = dict(k.split("=") for k in keys.split(", "))
        out.append((flags.split(), {k: int(v) for k, v in kv.items()}))
    return out


@pytest.mark.slow  # three real profile runs on CPU (about 40 s)
def test_each_printed_way_out_works_as_printed(real_stack, tmp_path):
    from libreyolo_core.data.sample import generate_sample_dataset
    from service.cli import app
    from worker.runner import run_job

    data = generate_sample_dataset(tmp_path / "two", n_train=2, n_val=1, imgsz=64, seed=3)
    failed = _profile_run(data, tmp_path / "p0", "--batch", "4")
    assert failed.returncode == 3, failed.stderr[-2000:]
    ways = _ways(failed.stderr)
    assert ways, failed.stderr  # at least one way out with numbers: --batch 1 (batch=1)
    _, token = make_user(real_stack.sessions)
    env = {"LIBREYOLO_URL": real_stack.url, "LIBREYOLO_TOKEN": token, "LIBREYOLO_NO_BROWSER": "1"}
    for i, (flags, keys) in enumerate(ways):
        # 1. the engine's command, with the printed flags
        ok = _profile_run(data, tmp_path / f"p{i + 1}", "--batch", "4", *flags)
        assert ok.returncode == 0, (flags, ok.stderr[-2000:])
        # 2. the service CLI, the same flags (the last --batch wins in argparse; here the
        # printed flags are all that is given)
        r = CliRunner().invoke(app, ["jobs", "submit", "--kind", "profile", "-d", str(data),
                                     "--gpus", "0", *flags, "imgsz=64", "workers=0"], env=env)
        assert r.exit_code == 0, (flags, r.output)
        job_id = r.stdout.split()[0]
        t = threading.Thread(target=run_job, args=(job_id,), daemon=True,
                             kwargs={"settings": real_stack.settings,
                                     "sessions": real_stack.sessions})
        t.start()
        t.join(600)
        from libreyolo_client import Client

        with Client(real_stack.url, token) as c:
            info = c.job(job_id).info
            assert info.status == "succeeded", (flags, info.error)
            assert all(info.params[k] == v for k, v in keys.items()), (keys, info.params)
            # 3. the training keys in parentheses, as the SDK's params
            job = c.profile(model="yolo9-t", data=str(data), gpus=0, imgsz=64, workers=0, **keys)
            assert job.info.status == "queued" and all(job.info.params[k] == v
                                                       for k, v in keys.items())
            c.cancel(job.id)


@pytest.mark.parametrize("args, params", [
    (["--warmup", "1", "--steps", "7"], {"profile_warmup": 1, "profile_steps": 7}),
    (["--batch", "2"], {"batch": 2}),
])
def test_profile_submit_takes_the_window_and_batch_flags(stack, args, params, data_yaml):
    from service.cli import app

    env = {"LIBREYOLO_URL": stack.url, "LIBREYOLO_TOKEN": stack.token(),
           "LIBREYOLO_NO_BROWSER": "1"}
    r = CliRunner().invoke(app, ["jobs", "submit", "--kind", "profile", "-d", data_yaml, *args],
                           env=env)
    assert r.exit_code == 0, r.output
    from libreyolo_client import Client

    with Client(stack.url, env["LIBREYOLO_TOKEN"]) as c:
        info = c.job(r.stdout.split()[0]).info
        assert {k: info.params[k] for k in params} == params
        c.cancel(info.id)
    r = CliRunner().invoke(app, ["jobs", "submit", "-d", data_yaml, "--steps", "7"], env=env)
    assert r.exit_code == 2 and "use it with --kind tune (or with --kind profile)" in r.output
    r = CliRunner().invoke(app, ["jobs", "submit", "-d", data_yaml, "--batch", "2", "batch=4"],
                           env=env)
    assert r.exit_code == 2 and "batch=4 and its flag say 2" in r.output
