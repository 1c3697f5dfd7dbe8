"""The Celery app (the doorbell) and :func:`enqueue`.

The database is the source of truth; a message only says "job X may be runnable". The
API sends ``run_job(job_id)`` BY NAME, so the service never imports the worker. Queues:
``cpu`` and ``gpu-1``, ``gpu-2``, ``gpu-4``, ``gpu-8`` (one per GPU count).
"""

from __future__ import annotations

from celery import Celery

from service.settings import Settings

__all__ = ["TASK_NAME", "QUEUES", "broker_epoch", "create_celery", "queue_for", "enqueue"]

TASK_NAME = "run_job"
QUEUES = ("cpu", "gpu-1", "gpu-2", "gpu-4", "gpu-8")


def create_celery(settings: Settings) -> Celery:
    """Build the Celery app from ``settings.broker_url``.

    Early acknowledgement (``task_acks_late=False``) and prefetch 1: recovery of a dead
    worker comes from the job lease and the reaper, never from broker redelivery (Redis
    would redeliver an unacknowledged 3-hour job every ``visibility_timeout``).
    (The worker polls the embedded SQLAlchemy broker every ``settings.broker_poll_s``: see
    ``worker.tasks``; kombu passes every transport option of that transport to
    ``create_engine``, so the interval cannot go there.)
    """
    app = Celery("libreyolo", broker=settings.broker_url, set_as_current=False)
    options = dict(settings.broker_transport_options)
    if settings.broker_url.startswith("sqla+sqlite"):
        options.setdefault("connect_args", {"timeout": 30, "check_same_thread": False})
    app.conf.update(
        broker_transport_options=options,
        broker_connection_retry_on_startup=True,
        task_acks_late=False,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        result_backend=None,
        task_default_queue="cpu",
        task_create_missing_queues=True,
        task_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        enable_utc=True,
    )
    return app


def queue_for(gpus: int) -> str:
    """Queue name of a job with ``gpus`` GPUs (0 = CPU job)."""
    return "cpu" if gpus == 0 else f"gpu-{gpus}"


def enqueue(app: Celery, job_id: str, queue: str, priority: int = 0) -> None:
    """Send ``run_job(job_id)`` to ``queue`` by name. Call only after the job row commits."""
    app.send_task(TASK_NAME, args=[job_id], queue=queue, priority=max(0, min(9, priority)),
                  ignore_result=True)


def broker_epoch(app: Celery, timeout_s: float = 2.0) -> str | None:
    """Which life of the broker this is: the Redis server's ``run_id`` (new at every start
    of ``redis-server``, so a restart, which may have lost every message, shows as a new
    value); None for a broker that keeps its messages across restarts (the embedded
    SQLAlchemy transport) or one that cannot be reached now.

    The reaper compares it pass by pass and re-sends every queued job's message as soon as
    it changes (:func:`service.reaper.reap_once`), not ``resend_after_s`` later.
    """
    if not str(app.conf.broker_url or "").startswith(("redis://", "rediss://")):
        return None
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=timeout_s)
            client = getattr(conn.default_channel, "client", None)
            info = client.info("server") if client is not None else {}
    except Exception:  # noqa: BLE001 - an unreachable broker has no epoch
        return None
    run_id = info.get("run_id") if isinstance(info, dict) else None
    return str(run_id) if run_id else None
