"""#28.4: every way out an error prints works exactly as printed, wherever it is printed.

Each test makes the real product print the error, parses the way out from the printed text
(never a copy of it), runs it where it was printed (an engine CLI way out through
``libreyolo``, a service CLI one through ``libreyolo-service``, an SDK keyword through the
SDK, a REST field through REST) and checks that it is accepted: not the same error, not
an unknown option.

- the profile window's ways out: ``libreyolo profile run`` flags, ``libreyolo-service jobs
  submit --kind profile`` flags (a real job on the real engine), and the training keys in
  parentheses (the SDK's params);
- the engine CLI: did-you-mean of a command, of ``help TOPIC`` and of a key, ``predict``'s
  "nothing saved" keys, a chain of training-key mistakes followed to a run that trains
  (``Did you mean``, ``imgsz ... use 64 or 96``, ``use mosaic_buffer=0 or loader=cpu``,
  ``use loader=cpu``, ``device ... use device=cpu``) and its "learned nothing" note's
  ``model=``, ``profile tune --set KEY=VALUE``, an interrupted run's ``resume=<last.pt>``
  and a finished one's ``epochs=``, an unreliable profile's ``--steps N``, ``--repeat 3`` and
  its CPU lever's ``device=0``;
- the service: the CLI's did-you-mean, the 401's ``token create --name NAME``, an empty
  Idempotency-Key's command, a 405's method, ``params.data``'s "top level", a profile job's
  ``nodes=1`` and ``use 1``, the batch-larger-than-the-dataset warning's ``batch=N``, an
  unknown model's ``models list``, ``--steps``' ``--kind tune``, the key=value example,
  the no-worker warning's ``worker --cpu`` and ``gpus=0``, ``users list``, the
  no-database ways (``--home``, ``LIBREYOLO_HOME``, ``LIBREYOLO_DATABASE_URL``, ``db
  upgrade``), ``models upload``'s "train from it", ``serve``'s ``--port``, a cancelled
  job's ``jobs resume`` / ``POST .../resume``, the "learned nothing" note's ``--model
  job:<id>/...``.
"""

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


# --- the engine CLI ---------------------------------------------------------------------

ENGINE = [sys.executable, "-m", "libreyolo_core.cli"]


def _engine(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([*ENGINE, *args], capture_output=True, text=True, timeout=600, cwd=cwd)


@pytest.mark.parametrize("typo", ["cgf", "vresion"])
def test_engine_command_did_you_mean_runs(typo):
    bad = _engine(typo)
    assert bad.returncode == 2, bad.stderr
    way = re.search(r"Did you mean '([a-z]+)'\?", bad.stderr)
    assert way, bad.stderr
    ok = _engine(way[1])
    assert ok.returncode == 0, ok.stderr


def test_engine_help_did_you_mean_runs():
    bad = _engine("help", "trian")
    assert bad.returncode == 2, bad.stderr
    way = re.search(r"Did you mean '([a-z]+)'\?", bad.stderr)
    assert way, bad.stderr
    ok = _engine("help", way[1])
    assert ok.returncode == 0 and ok.stdout.strip(), ok.stderr


def test_engine_predict_ways_out_run(tmp_path):
    """``sav=true``'s did-you-mean and each key that "nothing saved" names, given together in
    one run (a predict run costs seconds): each is taken, and the run saves."""
    from libreyolo_core.data.sample import generate_sample_dataset

    data = generate_sample_dataset(tmp_path / "one", n_train=1, n_val=1, imgsz=64, seed=5)
    img = next(p for p in sorted(data.parent.rglob("*")) if p.suffix in (".jpg", ".png"))
    base = [f"source={img}", "imgsz=64", "device=cpu", f"project={tmp_path / 'p'}"]

    bad = _engine("predict", *base, "sav=true")
    assert bad.returncode == 2, bad.stderr
    way = re.search(r"unknown key '(\w+)' for `libreyolo predict`\. Did you mean '(\w+)'\?",
                    bad.stderr)
    assert way and way[1] == "sav", bad.stderr
    plain = _engine("predict", *base)
    assert plain.returncode == 0, plain.stderr
    said = re.search(r"nothing saved \((.*)\)", plain.stderr)
    assert said, plain.stderr
    keys = re.findall(r"\b([a-z_]+=true)\b", said[1])
    assert len(keys) >= 4, said[1]  # save, save_txt, save_json, json
    ok = _engine("predict", *base, *dict.fromkeys([f"{way[2]}=true", *keys]))
    assert ok.returncode == 0 and "unknown key" not in ok.stderr, ok.stderr
    assert "nothing saved" not in ok.stderr, ok.stderr
    saved = {p.name for p in (tmp_path / "p").rglob("*") if p.is_file()}
    assert "predictions.json" in saved and img.name in saved, saved  # save_json, save
    assert any(n.endswith(".txt") for n in saved), saved  # save_txt
    assert ok.stdout.strip().startswith("{"), ok.stdout  # json


def _engine_way_out(stderr: str, args: list[str]) -> list[str]:
    """``args`` with the way out the engine printed in ``stderr`` applied, as printed."""
    text = stderr.strip().splitlines()[-1]

    def put(key: str, value: str) -> list[str]:
        return [a for a in args if not a.startswith(f"{key}=")] + [f"{key}={value}"]

    if m := re.search(r"unknown key '(\w+)'\. Did you mean (\w+)", text):
        return [f"{m[2]}={a.split('=', 1)[1]}" if a.startswith(f"{m[1]}=") else a for a in args]
    if m := re.search(r"unknown model '\S+'\. Did you mean '(\S+)'\?", text):
        return put("model", m[1])
    if m := re.search(r"(\w+)=\S+ must be a multiple of \d+ for \S+; use (\d+) or \d+", text):
        return put(m[1], m[2])
    if m := re.search(r"device=\S+ is invalid: use (.*)", text):
        # the CPU among the printed choices, as printed (it was 'cpu', quotes and all,
        # which the CLI took as the value "'cpu'")
        cpu = re.search(r"\b(device=\S*cpu\S*?)(?:,| or |$)", m[1])
        assert cpu, text
        return put(*cpu[1].split("=", 1))
    if m := re.search(r"[:;] use (\w+)=(\w+)(?: or \w+=\w+)?$", text):
        return put(m[1], m[2])
    raise AssertionError(f"no way out printed: {text}")


@pytest.mark.slow  # the chain ends in a real 1-epoch training run (about 20 s)
def test_engine_train_ways_out_chain_to_a_run_that_trains(tmp_path):
    """Five mistakes at once; each error's way out, applied as printed, gets past that
    error, and the last run trains."""
    from libreyolo_core.data.sample import generate_sample_dataset

    data = generate_sample_dataset(tmp_path / "two", n_train=2, n_val=1, imgsz=64, seed=3)
    args = ["train", f"data={data}", "model=yolo9t", "epoch=1", "imgsz=65", "loader=gpu",
            "mosaic_buffer=4", "device=gpu", "workers=0", f"project={tmp_path / 'runs'}"]
    seen: list[str] = []
    for _ in range(8):
        r = _engine(*args)
        if r.returncode == 0:
            break
        last = r.stderr.strip().splitlines()[-1]
        assert last not in seen, (last, args)  # the way out got past its error
        seen.append(last)
        args = _engine_way_out(r.stderr, args)
    assert r.returncode == 0, (args, r.stderr[-2000:])
    assert len(seen) >= 5, seen
    # the run learned nothing in 1 epoch: its note names ``model=<model id or weights
    # file>``; the run's own best.pt in the placeholder's place trains on
    note = re.search(r"start from a trained model \((model)=<[^>]*>\)", r.stdout + r.stderr)
    best = re.search(r"weights: (\S+best\.pt)", r.stdout + r.stderr)
    assert note and best, r.stdout[-2000:]
    more = _engine(*args, f"{note[1]}={best[1]}", "name=more")
    assert more.returncode == 0, more.stderr[-2000:]


def test_profile_tune_set_way_out_runs(tmp_path):
    """``profile tune --set mosaic`` names ``KEY=VALUE (e.g. mosaic=0.5)``; ``--set
    mosaic=0.5`` gets past it (to the too-short window of a 2-image set at batch 4: exit 3,
    cheaply)."""
    from libreyolo_core.data.sample import generate_sample_dataset

    data = generate_sample_dataset(tmp_path / "two", n_train=2, n_val=1, imgsz=64, seed=3)

    def tune(*flags: str) -> subprocess.CompletedProcess:
        return _engine("profile", "tune", str(data), *SMALL, "--project", str(tmp_path / "t"),
                       "--batch", "4", *flags)

    bad = tune("--set", "mosaic")
    assert bad.returncode == 2, bad.stderr
    way = re.search(r"e\.g\. (\w+=[\w.]+)\)", bad.stderr)
    assert way, bad.stderr
    ok = tune("--set", way[1])
    assert ok.returncode == 3 and "--set" not in ok.stderr, ok.stderr


# --- the service: CLI, REST and SDK ------------------------------------------------------


def _env(stack, token: str | None = None) -> dict[str, str]:
    return {"LIBREYOLO_URL": stack.url, "LIBREYOLO_TOKEN": token or stack.token(),
            "LIBREYOLO_NO_BROWSER": "1"}


def _service(args: list[str], env: dict[str, str]):
    from service.cli import app

    return CliRunner().invoke(app, args, env=env)


def _backticked(text: str, starts: str) -> list[str]:
    """The command in backticks of ``text`` that starts with ``starts``, split as a shell
    would; its first word (the program) dropped."""
    import shlex

    m = re.search(rf"`({re.escape(starts)}[^`]*)`", text)
    assert m, text
    return shlex.split(m[1])[1:]


def _job(data: str, **over) -> dict:
    return {"kind": "train", "model": "yolo9-t", "data": data, "gpus": 0,
            "params": {"epochs": 1}} | over


def test_service_command_did_you_mean_runs(stack):
    env = _env(stack)
    bad = _service(["job", "list"], env)
    assert bad.exit_code == 2, bad.output
    way = re.search(r"Did you mean '([a-z]+)'", bad.output)
    assert way, bad.output
    ok = _service([way[1], "list"], env)
    assert ok.exit_code == 0, ok.output


def test_missing_token_way_out_runs(stack):
    """The 401's ``libreyolo-service token create ...``, run through the service CLI on
    the service's database, gives a token the API takes."""
    import httpx

    r = httpx.get(f"{stack.url}/v1/jobs")
    assert r.status_code == 401
    detail = r.json()["detail"]
    args = [a.replace("NAME", "suggested") for a in _backticked(detail, "libreyolo-service token")]
    made = _service(args, {"LIBREYOLO_DATABASE_URL": stack.settings.database_url})
    assert made.exit_code == 0, (args, made.output)
    token = made.stdout.strip().splitlines()[-1]
    r = httpx.get(f"{stack.url}/v1/jobs", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text


def test_empty_idempotency_key_way_out_runs(stack, data_yaml):
    import shlex

    import httpx

    auth = {"Authorization": f"Bearer {stack.token()}"}
    r = httpx.post(f"{stack.url}/v1/jobs", json=_job(data_yaml),
                   headers=auth | {"Idempotency-Key": ""})
    assert r.status_code == 422, r.text
    cmd = re.search(r"e\.g\. (python3 -c '[^']*')", r.json()["detail"])
    assert cmd, r.text
    key = subprocess.run(shlex.split(cmd[1]), capture_output=True, text=True, check=True).stdout
    assert key.strip()
    r = httpx.post(f"{stack.url}/v1/jobs", json=_job(data_yaml),
                   headers=auth | {"Idempotency-Key": key.strip()})
    assert r.status_code == 201, r.text
    httpx.post(f"{stack.url}/v1/jobs/{r.json()['id']}/cancel", headers=auth)


def test_method_not_allowed_way_out_runs(stack):
    import httpx

    auth = {"Authorization": f"Bearer {stack.token()}"}
    r = httpx.delete(f"{stack.url}/v1/jobs", headers=auth)
    assert r.status_code == 405, r.text
    method = re.search(r"; use ([A-Z]+)", r.json()["detail"])
    assert method, r.text
    r = httpx.request(method[1], f"{stack.url}/v1/jobs", headers=auth,
                      **({"json": {}} if method[1] == "POST" else {}))
    assert r.status_code != 405, r.text


def test_reserved_param_way_out_runs(stack, data_yaml):
    """``params.data: set 'data' at the top level of the request``, through REST."""
    import httpx

    auth = {"Authorization": f"Bearer {stack.token()}"}
    body = _job(data_yaml, params={"data": data_yaml, "epochs": 1})
    r = httpx.post(f"{stack.url}/v1/jobs", json=body, headers=auth)
    assert r.status_code == 422, r.text
    key = re.search(r"set '(\w+)' at the top level", r.json()["detail"])
    assert key, r.text
    body[key[1]] = body["params"].pop(key[1])
    r = httpx.post(f"{stack.url}/v1/jobs", json=body, headers=auth)
    assert r.status_code == 201, r.text
    httpx.post(f"{stack.url}/v1/jobs/{r.json()['id']}/cancel", headers=auth)


def test_profile_nodes_way_out_runs_in_each_place(stack, data_yaml):
    """A profile job on 2 nodes: the printed ``nodes=1`` works as a REST field and as the
    service CLI's key=value (it was refused there: the CLI took only ``--nodes 1``)."""
    import httpx

    token = stack.token()
    auth = {"Authorization": f"Bearer {token}"}
    body = _job(data_yaml, kind="profile", nodes=2)
    r = httpx.post(f"{stack.url}/v1/jobs", json=body, headers=auth)
    assert r.status_code == 422, r.text
    way = re.search(r"use (nodes)=(\d+)", r.json()["detail"])
    assert way, r.text
    r = httpx.post(f"{stack.url}/v1/jobs", json=body | {way[1]: int(way[2])}, headers=auth)
    assert r.status_code == 201, r.text
    httpx.post(f"{stack.url}/v1/jobs/{r.json()['id']}/cancel", headers=auth)

    # two CPU ranks: "procs: ... use 1", the field named first
    r = httpx.post(f"{stack.url}/v1/jobs", json=_job(data_yaml, kind="profile", procs=2),
                   headers=auth)
    assert r.status_code == 422, r.text
    way = re.match(r"(\w+): .*; use (\d+)", r.json()["detail"])
    assert way, r.text
    r = httpx.post(f"{stack.url}/v1/jobs", headers=auth,
                   json=_job(data_yaml, kind="profile", **{way[1]: int(way[2])}))
    assert r.status_code == 201, r.text
    httpx.post(f"{stack.url}/v1/jobs/{r.json()['id']}/cancel", headers=auth)

    env = _env(stack, token)
    args = ["jobs", "submit", "--kind", "profile", "-d", data_yaml, "--gpus", "0"]
    bad = _service([*args, "--nodes", "2"], env)
    assert bad.exit_code != 0, bad.output
    way = re.search(r"use (nodes=\d+)", " ".join(bad.output.split()))
    assert way, bad.output
    ok = _service([*args, way[1]], env)  # as printed: key=value, beside the other keys
    assert ok.exit_code == 0, ok.output
    from libreyolo_client import Client

    with Client(stack.url, token) as c:
        assert c.job(ok.stdout.split()[0]).info.nodes == 1
        c.cancel(ok.stdout.split()[0])


def test_batch_larger_than_the_dataset_way_out_runs_in_each_place(stack, tmp_path):
    """``use batch=N or less``: as a service CLI key, an SDK keyword and a REST param."""
    import warnings

    import httpx

    from libreyolo_client import Client, SubmitWarning
    from libreyolo_core.data.sample import generate_sample_dataset

    data = generate_sample_dataset(tmp_path / "two", n_train=2, n_val=1, imgsz=64, seed=3)
    token = stack.token()
    with Client(stack.url, token) as c:
        ds = c.upload_dataset(data.parent)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            job = c.train(data=ds.id, gpus=0, batch=64, epochs=1)
        c.cancel(job.id)
        said = " ".join(str(w.message) for w in caught if w.category is SubmitWarning)
        way = re.search(r"use (batch)=(\d+) or less", said)
        assert way, said
        key, value = way[1], int(way[2])
        # the SDK: the keyword as printed
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            job = c.train(data=ds.id, gpus=0, epochs=1, **{key: value})
        c.cancel(job.id)
        assert not [w for w in caught if "partial batch" in str(w.message)], caught
        # REST: the param as printed
        r = httpx.post(f"{stack.url}/v1/jobs", headers={"Authorization": f"Bearer {token}"},
                       json=_job(ds.id, params={"epochs": 1, key: value}))
        assert r.status_code == 201 and not any("partial batch" in w for w in
                                                r.json().get("warnings") or []), r.text
        c.cancel(r.json()["id"])
        # the service CLI: key=value as printed
        out = _service(["jobs", "submit", "-d", ds.id, "--gpus", "0", f"{key}={value}",
                        "epochs=1"], _env(stack, token))
        assert out.exit_code == 0 and "partial batch" not in out.output, out.output
        c.cancel(out.stdout.split()[0])


def test_unknown_model_way_out_runs(stack, data_yaml):
    env = _env(stack)
    bad = _service(["jobs", "submit", "-d", data_yaml, "--model", "m0123456", "--gpus", "0"],
                   env)
    assert bad.exit_code != 0, bad.output
    args = _backticked(" ".join(bad.output.split()), "libreyolo-service models")
    ok = _service(args, env)
    assert ok.exit_code == 0, (args, ok.output)


def test_tune_option_way_out_runs(stack, data_yaml):
    """``--steps is a tune option: use it with --kind tune``: adding ``--kind tune``."""
    token = stack.token()
    env = _env(stack, token)
    args = ["jobs", "submit", "-d", data_yaml, "--gpus", "0", "--steps", "7"]
    bad = _service(args, env)
    assert bad.exit_code == 2, bad.output
    way = re.search(r"use it with (--kind \w+)", bad.output)
    assert way, bad.output
    ok = _service([*args, *way[1].split()], env)
    assert ok.exit_code == 0, ok.output
    from libreyolo_client import Client

    with Client(stack.url, token) as c:
        c.cancel(ok.stdout.split()[0])


def test_no_worker_ways_out_run(tmp_path, data_yaml):
    """The no-live-worker warning's ``libreyolo-service worker --cpu``, run as printed (a
    real worker process on this service's database), ends the warning; with that CPU
    worker live, a GPU job's warning names ``gpus=0``, which the service CLI takes as
    printed. Its own API and database: the worker's heartbeat must not reach the shared
    stack."""
    import os
    import shlex
    import signal
    import time

    from testkit import ServerThread, fresh_database

    from service.app import create_app
    from service.settings import Settings

    with fresh_database("sqlite", tmp_path) as url:
        settings = Settings(home=tmp_path / "home", database_url=url, broker_url="memory://",
                            reaper_enabled=False, worker_heartbeat_s=0.5, worker_ttl_s=5)
        app = create_app(settings)
        srv = ServerThread(app).start()
        worker = None
        try:
            _, token = make_user(app.state.sessions)
            env = {"LIBREYOLO_URL": srv.url, "LIBREYOLO_TOKEN": token,
                   "LIBREYOLO_NO_BROWSER": "1"}
            args = ["jobs", "submit", "-d", data_yaml, "--gpus", "0", "epochs=1"]
            first = _service(args, env)
            assert first.exit_code == 0 and "no live worker" in first.output, first.output
            cmd = _backticked(" ".join(first.output.split()), "libreyolo-service worker")
            worker = subprocess.Popen(
                [sys.executable, "-m", "service.cli", *cmd], cwd=tmp_path,
                env=os.environ | {"LIBREYOLO_DATABASE_URL": url, "LIBREYOLO_HOME":
                                  str(tmp_path / "home"), "LIBREYOLO_BROKER_URL": "memory://",
                                  "LIBREYOLO_WORKER_HEARTBEAT_S": "0.5",
                                  "LIBREYOLO_WORKER_TTL_S": "5"},
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                start_new_session=True)
            deadline = time.monotonic() + 90
            while True:  # the printed command's worker takes the queue: no more warning
                assert worker.poll() is None, (shlex.join(cmd), worker.stdout.read())
                again = _service(args, env)
                assert again.exit_code == 0, again.output
                if "no live worker" not in again.output:
                    break
                assert time.monotonic() < deadline, again.output
                time.sleep(1)
            gpu = _service(["jobs", "submit", "-d", data_yaml, "--gpus", "1", "epochs=1"], env)
            assert gpu.exit_code == 0, gpu.output
            way = re.search(r"submit with (gpus=\d+)", " ".join(gpu.output.split()))
            assert way, gpu.output
            ok = _service(["jobs", "submit", "-d", data_yaml, way[1], "epochs=1"], env)
            assert ok.exit_code == 0 and "no live worker" not in ok.output, ok.output
            from libreyolo_client import Client

            with Client(srv.url, token) as c:
                assert c.job(ok.stdout.split()[0]).info.gpus == 0
        finally:
            if worker is not None:
                os.killpg(worker.pid, signal.SIGTERM)
                try:
                    worker.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(worker.pid, signal.SIGKILL)
                    worker.wait(10)
            srv.stop()


def test_users_cap_unknown_user_way_out_runs(stack):
    env = {"LIBREYOLO_DATABASE_URL": stack.settings.database_url}
    bad = _service(["users", "cap", "nobody-by-this-name", "2"], env)
    assert bad.exit_code == 2, bad.output
    args = _backticked(bad.output, "libreyolo-service users")
    ok = _service(args, env)
    assert ok.exit_code == 0, (args, ok.output)


def _service_cli(*args: str, cwd, env_extra: dict[str, str] | None = None):
    import os

    env = {k: v for k, v in os.environ.items()
           if k not in ("LIBREYOLO_HOME", "LIBREYOLO_DATABASE_URL")} | (env_extra or {})
    return subprocess.run([sys.executable, "-m", "service.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_no_service_database_ways_out_run(tmp_path):
    """An admin command in a folder whose ./.libreyolo holds no service database prints
    four ways out: ``--home PATH``, ``LIBREYOLO_HOME=PATH``, ``LIBREYOLO_DATABASE_URL=URL``
    (PATH and URL: the service's), and ``libreyolo-service db upgrade`` (a new service, run
    in the same folder). Each, as printed, lets the command work."""
    from service.db.migrate import upgrade

    home = tmp_path / "srv" / ".libreyolo"
    home.mkdir(parents=True)
    url = f"sqlite:///{home / 'libreyolo.db'}"
    upgrade(url)
    fill = {"PATH": str(home), "URL": url}
    for i, cmd in enumerate((["token", "create", "--name", "alice"], ["users", "list"])):
        here = tmp_path / f"elsewhere{i}"
        here.mkdir()
        bad = _service_cli(*cmd, cwd=here)
        assert bad.returncode == 1, bad.stderr
        said = " ".join(bad.stderr.split())
        flag = re.search(r"(--home) (PATH)\b", said)
        envs = re.findall(r"\b(LIBREYOLO_[A-Z_]+)=(PATH|URL)\b", said)
        assert flag and len(envs) == 2, said
        ok = _service_cli(*cmd, flag[1], fill[flag[2]], cwd=here)
        assert ok.returncode == 0, (flag[0], ok.stderr)
        for name, what in envs:
            ok = _service_cli(*cmd, cwd=here, env_extra={name: fill[what]})
            assert ok.returncode == 0, (name, ok.stderr)
        assert list(here.iterdir()) == []  # none of them made a database here
        # a new service: the printed `db upgrade`, in the same folder
        upgrade_cmd = _backticked(said, "libreyolo-service db")
        assert _service_cli(*upgrade_cmd, cwd=here).returncode == 0
        ok = _service_cli(*cmd, cwd=here)
        assert ok.returncode == 0, ok.stderr


def test_uploaded_model_train_from_it_runs(stack, data_yaml, tmp_path):
    """``models upload`` prints ``train from it: libreyolo-service jobs submit --model <id>
    --data ...``; with the dataset in place of ``...`` it submits."""
    from testkit import write_weights

    token = stack.token()
    env = _env(stack, token)
    up = _service(["models", "upload", str(write_weights(tmp_path / "shapes.pt"))], env)
    assert up.exit_code == 0, up.output
    m = re.search(r"train from it: libreyolo-service (jobs submit .*)", up.output)
    assert m, up.output
    args = [data_yaml if a == "..." else a for a in m[1].split()]
    ok = _service([*args, "--gpus", "0", "epochs=1"], env)
    assert ok.exit_code == 0, (args, ok.output)
    from libreyolo_client import Client

    with Client(stack.url, token) as c:
        c.cancel(ok.stdout.split()[0])


@pytest.mark.slow  # a real 1-epoch training run, stopped in its second epoch, resumed twice
def test_engine_interrupted_and_finished_runs_ways_out_run(tmp_path):
    """SIGTERM prints ``resume with resume=<last.pt>``; that run ends; resuming it again
    says "nothing to train (pass a larger epochs= ...)", and a larger epochs= trains on."""
    import signal

    from libreyolo_core.data.sample import generate_sample_dataset

    data = generate_sample_dataset(tmp_path / "two", n_train=2, n_val=1, imgsz=64, seed=3)
    run = subprocess.Popen([*ENGINE, "train", f"data={data}", "epochs=2", "imgsz=64",
                            "workers=0", "device=cpu", f"project={tmp_path / 'runs'}"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert run.stdout is not None
    for line in run.stdout:  # stopped once it trains its second epoch
        if line.startswith("epoch 2/2"):
            run.send_signal(signal.SIGTERM)
            break
    _, err = run.communicate(timeout=300)
    way = re.search(r"resume with (resume=\S+)", err)
    assert way, err[-2000:]
    ok = _engine("train", way[1])
    assert ok.returncode == 0, ok.stderr[-2000:]
    again = _engine("train", way[1])
    assert "nothing to train" in again.stderr, again.stderr[-2000:]
    key = re.search(r"pass a larger (\w+)=", again.stderr)
    assert key, again.stderr[-2000:]
    more = _engine("train", way[1], f"{key[1]}=3")
    assert more.returncode == 0 and "nothing to train" not in more.stderr, more.stderr[-2000:]


@pytest.mark.slow  # a real training job on the real engine, cancelled in its second epoch
def test_cancelled_job_resume_way_out_runs(real_stack, tmp_path):
    """A cancelled service job's log says ``resume with `libreyolo-service jobs resume <id>`
    (POST /v1/jobs/<id>/resume, ...)``: both work as printed."""
    import time

    import httpx

    from libreyolo_client import Client
    from libreyolo_core.data.sample import generate_sample_dataset
    from worker.runner import run_job

    data = generate_sample_dataset(tmp_path / "two", n_train=2, n_val=1, imgsz=64, seed=3)
    _, token = make_user(real_stack.sessions)
    with Client(real_stack.url, token) as c:
        job = c.train(data=str(data), gpus=0, epochs=30, imgsz=64, workers=0)
        t = threading.Thread(target=run_job, args=(job.id,), daemon=True,
                             kwargs={"settings": real_stack.settings,
                                     "sessions": real_stack.sessions})
        t.start()
        deadline = time.monotonic() + 300
        while not any(ln.startswith("epoch 2/") for ln in job.logs()):
            assert time.monotonic() < deadline and t.is_alive(), list(job.logs())[-20:]
            time.sleep(1)
        c.cancel(job.id)
        t.join(300)
        log = "\n".join(job.logs())
        cmd = re.search(r"resume with `(libreyolo-service jobs resume \S+)` \((POST) (\S+),", log)
        assert cmd, log[-2000:]
        r = _service(cmd[1].split()[1:], {"LIBREYOLO_URL": real_stack.url,
                                          "LIBREYOLO_TOKEN": token})
        assert r.exit_code == 0, r.output
        new = r.stdout.split()[0]
        c.cancel(new)
        r = httpx.request(cmd[2], real_stack.url + cmd[3],
                          headers={"Authorization": f"Bearer {token}"})
        assert r.status_code not in (404, 405, 422), r.text


@pytest.mark.slow  # a real 2-step profile window on CPU
def test_unreliable_profile_ways_out_run(tmp_path):
    """A 2-step CPU profile is unreliable and compute-bound. Its advice ``use --steps N or
    more`` and ``--repeat 3`` are ``profile run`` flags (given here at ``--batch 4`` on 2
    images, they get past the parser to the window's exit 3, cheaply); its lever's
    ``device=0`` is a training key (``gpus=1`` was printed: an unknown key to the engine)."""
    from libreyolo_core.data.sample import generate_sample_dataset

    data = generate_sample_dataset(tmp_path / "two", n_train=2, n_val=1, imgsz=64, seed=3)
    first = _profile_run(data, tmp_path / "p0", "--batch", "1", "--warmup", "0", "--steps", "2")
    assert first.returncode == 0, first.stderr[-2000:]
    out = " ".join((first.stdout + first.stderr).split())
    assert "UNRELIABLE" in out, out[-3000:]
    flags = [m.split() for m in re.findall(r"(--steps \d+) or more", out)]
    flags += [m.split() for m in re.findall(r"\(libreyolo profile run DATA \.\.\. (--repeat \d+)\)",
                                            out)]
    assert len(flags) == 2, out[-3000:]
    for i, flag in enumerate(flags):
        r = _profile_run(data, tmp_path / f"p{i + 1}", "--batch", "4", *flag)
        assert r.returncode == 3 and "the profile window must fit" in r.stderr, (flag, r.stderr)
    gpu = re.search(r"train on a GPU \((\w+=\w+)", out)
    assert gpu, out[-3000:]
    r = _engine("train", f"data={data}", gpu[1], "epochs=1", "imgsz=64", "workers=0",
                f"project={tmp_path / 'runs'}")
    assert "unknown key" not in r.stderr, r.stderr[-2000:]
    assert r.returncode == 0 or "does not exist" in r.stderr, r.stderr[-2000:]  # no CUDA here


def test_submit_item_without_equals_way_out_runs(stack, data_yaml):
    """``jobs submit ... epochs`` names the form ``(e.g. epochs=10 imgsz=320)``."""
    token = stack.token()
    env = _env(stack, token)
    args = ["jobs", "submit", "-d", data_yaml, "--gpus", "0"]
    bad = _service([*args, "epochs"], env)
    assert bad.exit_code == 2, bad.output
    printed = " ".join(re.sub(r"[│╭╮╰╯─]", " ", bad.output).split())  # Rich's box
    way = re.search(r"e\.g\. ((?:\w+=\w+ ?)+)\)", printed)
    assert way, bad.output
    ok = _service([*args, *way[1].split()], env)
    assert ok.exit_code == 0, ok.output
    from libreyolo_client import Client

    with Client(stack.url, token) as c:
        c.cancel(ok.stdout.split()[0])


def test_port_in_use_way_out_runs(tmp_path):
    """``serve`` on a taken port says ``pass --port`` (it printed uvicorn's bind error and
    exited 3; only ``up`` checked); ``serve --port <a free one>`` serves."""
    import os
    import signal
    import socket
    import time

    import httpx
    from testkit import free_port

    env = {"LIBREYOLO_HOME": str(tmp_path / "home"), "LIBREYOLO_BROKER_URL": "memory://"}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        bad = _service_cli("serve", "--host", "127.0.0.1", "--port", str(port), cwd=tmp_path,
                           env_extra=env)
    assert bad.returncode == 1, bad.stderr
    flag = re.search(r"pass (--port) to start a second service",
                     " ".join(bad.stderr.split()))
    assert flag, bad.stderr
    other = free_port()
    srv = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1",
                            flag[1], str(other)], cwd=tmp_path, env=os.environ | env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert srv.poll() is None, srv.stderr.read() if srv.stderr else ""
            try:
                if httpx.get(f"http://127.0.0.1:{other}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.5)
    finally:
        os.killpg(srv.pid, signal.SIGTERM)
        try:
            srv.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(srv.pid, signal.SIGKILL)
            srv.wait(10)


@pytest.mark.slow  # a real 1-epoch training job on the real engine
def test_learned_nothing_note_way_out_runs(real_stack, tmp_path):
    """A 1-epoch job from scratch ends with mAP50 near 0; ``jobs show`` notes "start from a
    trained model (--model <model id> or job:<id>/weights/best.pt)": the job form, with
    this job's id, submits."""
    from libreyolo_client import Client
    from libreyolo_core.data.sample import generate_sample_dataset
    from worker.runner import run_job

    data = generate_sample_dataset(tmp_path / "two", n_train=2, n_val=1, imgsz=64, seed=3)
    _, token = make_user(real_stack.sessions)
    env = {"LIBREYOLO_URL": real_stack.url, "LIBREYOLO_TOKEN": token}
    with Client(real_stack.url, token) as c:
        job = c.train(data=str(data), gpus=0, epochs=1, imgsz=64, workers=0)
        run_job(job.id, settings=real_stack.settings, sessions=real_stack.sessions)
        assert job.refresh().status == "succeeded", job.info.error
        shown = _service(["jobs", "show", job.id], env)
        assert shown.exit_code == 0, shown.output
        printed = " ".join(shown.output.split())
        way = re.search(r"\((--model) <model id> or (job:<id>/\S+)\)", printed)
        assert way, printed
        model = way[2].replace("<id>", job.id)
        ok = _service(["jobs", "submit", "-d", str(data), "--gpus", "0", way[1], model,
                       "epochs=1", "imgsz=64"], env)
        assert ok.exit_code == 0, ok.output
        c.cancel(ok.stdout.split()[0])
