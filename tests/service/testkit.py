"""Shared test helpers for tests/service and tests/worker: databases, servers, fake engine."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn

REPO = Path(__file__).resolve().parents[2]
PG_ADMIN = os.environ.get("LIBREYOLO_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("LIBREYOLO_TEST_REDIS", "redis://127.0.0.1:6379/11")


def pg_available() -> bool:
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN.replace("+psycopg", ""), connect_timeout=3):
            return True
    except Exception:
        return False


@contextlib.contextmanager
def fresh_database(kind: str, tmp: Path) -> Iterator[str]:
    """A new, migrated database: SQLite file under ``tmp`` or a new PostgreSQL database."""
    from service.db.migrate import upgrade

    if kind == "sqlite":
        url = f"sqlite:///{tmp / 'test.db'}"
        upgrade(url)
        yield url
        return
    import psycopg

    name = f"lyt_{secrets.token_hex(6)}"
    admin = PG_ADMIN.replace("+psycopg", "")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    try:
        upgrade(url)
        yield url
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    """uvicorn serving ``app`` in a thread on a free port (a real HTTP server)."""

    def __init__(self, app: Any, port: int | None = None, **config_kw: Any):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="on", timeout_graceful_shutdown=1, **config_kw)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def make_user(sessions: Any, name: str | None = None, admin: bool = False) -> tuple[str, str]:
    """Create a user and token; returns (user name, token)."""
    from service.users import create_user_token

    name = name or f"user-{secrets.token_hex(4)}"
    with sessions() as s:
        _, token = create_user_token(s, name=name, admin=admin)
        s.commit()
    return name, token


def queued_job(sessions: Any, owner_id: str, **fields: Any) -> str:
    """Insert a queued yolo9-t train job of ``owner_id`` (with its "queued" status event)
    straight into the database, as a submit would leave it; ``fields`` override any
    column. Returns the job id."""
    from service.db.models import Job, utcnow
    from service.ops import append_events

    now = utcnow()
    row = dict(owner_id=owner_id, kind="train", model="yolo9-t", data="/data/x.yaml",
               params={"epochs": 1}, gpus=0, procs=1, priority=0, queue="cpu",
               status="queued", attempt=0, max_attempts=3, cancel_requested=False,
               event_seq=0, events_offset=0, log_offset=0, created_at=now, enqueued_at=now)
    with sessions() as s:
        job = Job(**{**row, **fields})
        s.add(job)
        s.flush()
        append_events(s, job.id, [("status", time.time(), {"event": "status",
                                                            "status": "queued"})])
        s.commit()
        return job.id


def take_node(sessions: Any, job_id: str, worker: str, addr: str, *, nodes: int = 2,
              attempt: int = 1) -> Any:
    """Claim the lowest free node slot of queued multi-node job ``job_id`` for ``attempt``
    as worker ``worker`` at ``addr`` (host ``host-<worker>``, port 29500), as a woken
    worker does (:func:`service.gang.take_slot`: the claim that takes the last slot starts
    the job). Returns the :class:`~service.gang.Claim`."""
    from service.gang import NodeAddress, take_slot

    with sessions() as s:
        claim = take_slot(s, job_id=job_id, attempt=attempt, nodes=nodes, worker_id=worker,
                          where=NodeAddress(f"host-{worker}", addr, 29500), lease_s=600, cap=0)
        assert claim is not None, f"no free node slot of {job_id} for {worker}"
        s.commit()
        return claim


def client(url: str, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url, headers=headers, timeout=30)


def wait_for(pred: Callable[[], Any], timeout: float = 30.0, interval: float = 0.1,
             what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def until_inspected(c: httpx.Client, model_id: str, timeout: float = 180.0) -> dict:
    """A published model's answer once its background inspection ended (ready or failed)."""
    got: dict = {}

    def done() -> bool:
        got.update(c.get(f"/v1/models/{model_id}").json())
        return got["state"] != "inspecting"

    wait_for(done, timeout=timeout, interval=0.2, what=f"model {model_id} inspected")
    return got


def write_data_yaml(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "images").mkdir(exist_ok=True)
    (folder / "images" / "0.jpg").write_bytes(b"")  # the loader at submit wants an image file
    path = folder / "data.yaml"
    path.write_text("path: .\ntrain: images\nval: images\nnames: {0: thing}\n")
    return path


# A stand-in for `python -m libreyolo_core.cli train spec=...`: reads job.json, writes
# events.jsonl and weights/last.pt under <project>/<name>, resumes from last.pt, and on
# SIGTERM finishes the step, writes last.pt, records run_end interrupted and exits 143.
# `node=<r>` (the engine_command's {node_rank}): a node other than 0 of a multi-node job
# writes no events and no last.pt (as torchrun's other ranks); it sleeps through the same
# epochs, stops on SIGTERM (143) and fails like node 0.
# Knobs (params first, then env): fake_epoch_s / FAKE_EPOCH_S, fake_exit / FAKE_EXIT,
# fake_ignore_term / FAKE_IGNORE_TERM, fake_steps / FAKE_STEPS, and fake_node_exit /
# FAKE_NODE_EXIT (the exit code of the nodes other than 0 only, at their start).
FAKE_ENGINE = r'''
import json, os, signal, sys, time
spec_path = sys.argv[1].split("=", 1)[1] if "=" in sys.argv[1] else sys.argv[1]
spec = json.load(open(spec_path))
p = spec["params"]
def knob(name, default):
    v = p.get(name, os.environ.get(name.upper(), default))
    return type(default)(v)
epochs = int(p.get("epochs", 3))
epoch_s = knob("fake_epoch_s", 0.2)
steps = knob("fake_steps", 4)
fail = knob("fake_exit", 0)
ignore = knob("fake_ignore_term", 0)
node = int(dict(a.split("=", 1) for a in sys.argv[2:] if "=" in a).get("node", 0))
stop = {"term": False}
def on_term(signum, frame):
    stop["term"] = True
signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore else on_term)
start = 1
if spec.get("resume"):
    start = json.load(open(spec["resume"]))["epoch"] + 1
    print(f"resuming from {spec['resume']} at epoch {start}", flush=True)
if node:
    fail = knob("fake_node_exit", fail)
    print(f"fake engine node {node} pid={os.getpid()} epochs={epochs}", flush=True)
    if fail:
        print(f"fatal: node {node} broke", flush=True)
        sys.exit(fail)
    for epoch in range(start, epochs + 1):
        for step in range(1, steps + 1):
            time.sleep(epoch_s / steps)
            if stop["term"]:
                print("interrupted", flush=True)
                sys.exit(143)
    print("done", flush=True)
    sys.exit(0)
run = os.path.join(spec["project"], spec["name"])
os.makedirs(os.path.join(run, "weights"), exist_ok=True)
ev = open(os.path.join(run, "events.jsonl"), "a")
def emit(name, **kw):
    ev.write(json.dumps({"event": name, "time": time.time(), **kw}) + "\n"); ev.flush()
emit("run_start", config=p, run_dir=run, pid=os.getpid())
print(f"fake engine pid={os.getpid()} epochs={epochs}", flush=True)
if fail:
    print("fatal: something broke in the data", flush=True)
    emit("run_end", status="failed", best_epoch=None, metrics={}, error="data broke")
    if os.environ.get("LIBREYOLO_ERROR_FILE"):  # as the real CLI does
        json.dump({"exit_code": int(fail), "error": "DatasetError: data broke", "rank": 0},
                  open(os.environ["LIBREYOLO_ERROR_FILE"], "w"))
    sys.exit(fail)
def save(epoch):
    tmp = os.path.join(run, "weights", "last.pt.tmp")
    json.dump({"epoch": epoch}, open(tmp, "w")); os.replace(tmp, os.path.join(run, "weights", "last.pt"))
    emit("artifact", path="weights/last.pt", kind="checkpoint")
for epoch in range(start, epochs + 1):
    emit("epoch_start", epoch=epoch, epochs=epochs)
    for step in range(1, steps + 1):
        time.sleep(epoch_s / steps)
        emit("progress", epoch=epoch, epochs=epochs, step=step, steps=steps, eta_s=1.0,
             img_per_s=10.0, losses={"box": 1.0 / epoch})
        print(f"epoch {epoch} step {step}/{steps}", flush=True)
        if knob("fake_say_run", 0):  # a line naming the service's own folder (the run's)
            print(f"checkpoint {run}/weights/last.pt", flush=True)
        if stop["term"]:
            save(epoch - 1)
            emit("run_end", status="interrupted", best_epoch=epoch - 1, metrics={})
            print("interrupted", flush=True)
            sys.exit(143)
    save(epoch)
    m = {"mAP50": 0.1 * epoch, "mAP50-95": 0.05 * epoch, "precision": 0.5, "recall": 0.5}
    emit("epoch_end", epoch=epoch, epochs=epochs, losses={"box": 1.0 / epoch}, metrics=m,
         lr=0.01, epoch_time_s=epoch_s, fitness=0.05 * epoch, is_best=True)
open(os.path.join(run, "results.csv"), "w").write("epoch,mAP50\n")
open(os.path.join(run, "timeline.html"), "w").write("<html><script>1</script></html>")
emit("artifact", path="results.csv", kind="results")
emit("run_end", status="succeeded", best_epoch=epochs,
     metrics={"mAP50": 0.1 * epochs, "mAP50-95": 0.05 * epochs, "per_class_AP": {0: 0.05 * epochs}},
     names={0: "circle"})
print("done", flush=True)
'''


def fake_engine(tmp: Path) -> list[str]:
    """Write the fake engine script; returns the ``engine_command`` template."""
    path = tmp / "fake_engine.py"
    path.write_text(FAKE_ENGINE)
    return [sys.executable, str(path), "spec={spec}", "node={node_rank}"]


def engine_lines(run_dir: Path, settings: Any = None) -> list[dict[str, Any]]:
    """The engine's ``events.jsonl`` lines; with ``settings``, as the API shows them (the
    service's folders replaced by ``job:<id>`` / ``dataset:<id>``: ``public_text``)."""
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    lines = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    if settings is None:
        return lines
    from service.storage.roots import public_text

    return [json.loads(public_text(json.dumps(line), settings)) for line in lines]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def write_weights(path: Path, nc: int = 2) -> Path:
    """A real yolo9-t state dict (float16, ``nc`` classes) in our checkpoint format: what
    a published ``best.pt`` holds. Imports torch (test processes only)."""
    import torch

    from libreyolo_core.models.registry import parse_model_name

    family, size = parse_model_name("yolo9-t")
    model = family.build_model(size, nc)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": {k: v.half() if v.is_floating_point() else v
                          for k, v in model.state_dict().items()},
                "model_family": "yolo9", "size": "t", "nc": nc,
                "names": {i: f"class{i}" for i in range(nc)}, "imgsz": 128}, path)
    return path
