"""``python -m worker [--gpus 0,1 | --cpu]``: one Celery worker process.

Listens on ``gpu-k`` for each k in 1, 2, 4, 8 up to its GPU count (or ``cpu``), runs one
job at a time (solo pool, prefetch 1). Settings come from ``LIBREYOLO_*``.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import socket
import subprocess

from service.settings import Settings
from worker.heartbeat import queues_for


def detect_gpus() -> list[str]:
    """GPU indices from ``CUDA_VISIBLE_DEVICES`` or ``nvidia-smi -L`` (no torch)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
            return [str(i) for i, ln in enumerate(out.stdout.splitlines()) if ln.startswith("GPU")]
        except (OSError, subprocess.SubprocessError):
            return []
    return []


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m worker", description=__doc__)
    parser.add_argument("--gpus", help="GPU indices this worker owns, e.g. 0,1")
    parser.add_argument("--cpu", action="store_true", help="a CPU worker (queue cpu)")
    parser.add_argument("--name", default=None, help="Celery node name")
    parser.add_argument("--loglevel", default="INFO")
    args = parser.parse_args(argv)
    if args.cpu:
        gpu_ids: list[str] = []
    elif args.gpus is not None:
        gpu_ids = [g.strip() for g in args.gpus.split(",") if g.strip()]
    else:
        gpu_ids = detect_gpus()
    settings = Settings()
    from service.db.migrate import schema_problem

    problem = schema_problem(settings.database_url)
    if problem is not None:
        raise SystemExit(
            f"worker: the database {settings.database_url} cannot be used: {problem}. A worker "
            "uses the service's database: start it in the folder where `libreyolo-service up` "
            "runs (its state is ./.libreyolo), or with the same LIBREYOLO_HOME or "
            "LIBREYOLO_DATABASE_URL as the API; a new database is set up by `libreyolo-service "
            "db upgrade`.")
    logging.basicConfig(level=args.loglevel.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings.ensure_dirs()
    from worker.tasks import create_worker_app

    name = args.name or f"worker-{os.getpid()}@{socket.gethostname()}"
    app = create_worker_app(settings, gpu_ids, name=name)
    app.worker_main([
        "worker", "--pool", "solo", "--concurrency", "1", "--prefetch-multiplier", "1",
        "-Q", ",".join(queues_for(gpu_ids)), "-n", name, "--loglevel", args.loglevel,
        "--without-gossip", "--without-mingle", "-O", "fair",
    ])


if __name__ == "__main__":
    main()
