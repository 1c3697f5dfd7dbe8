"""Registers ``run_job`` on the service's Celery app: a thin doorbell over the runner (the
message names a job, but only wakes the worker: the database picks the job it runs); and
``export_model`` (a registered model's ONNX export, :mod:`worker.model_export`).

``create_worker_app(settings)`` builds the app; ``python -m worker`` (what
``libreyolo-service worker`` starts) runs it with the solo pool: one job at a time per
worker process, prefetch 1, early ack (recovery is the lease's job, not redelivery).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Sequence

from celery import Celery, bootsteps
from celery.signals import worker_ready, worker_shutdown, worker_shutting_down

from service.db.session import make_engine, make_session_factory
from service.model_export import EXPORT_TASK_NAME
from service.queue import TASK_NAME, create_celery, enqueue
from service.settings import Settings
from worker import runner
from worker.heartbeat import Heartbeat, queues_for
from worker.model_export import export_model

__all__ = ["create_worker_app", "poll_interval_step"]


def poll_interval_step(interval_s: float) -> type[bootsteps.StartStopStep]:
    """A consumer bootstep that sets the broker transport's poll interval to ``interval_s``.

    Polling transports (kombu's SQLAlchemy transport, the embedded default) sleep
    ``polling_interval`` (1 s by default) after an empty poll, which is the idle worker's
    submit -> running latency. The interval cannot be a transport option (that transport
    hands its options to ``create_engine``), so it is set on the transport object once the
    consumer's connection exists (again after each reconnect).
    """

    class PollInterval(bootsteps.StartStopStep):
        requires = {"celery.worker.consumer.connection:Connection"}

        def start(self, c) -> None:
            transport = getattr(c.connection, "transport", None)
            if transport is not None and getattr(transport, "polling_interval", None) is not None:
                transport.polling_interval = interval_s

    return PollInterval


def create_worker_app(settings: Settings, gpu_ids: Sequence[str] | None = None,
                      name: str | None = None) -> Celery:
    """The Celery app with ``run_job(job_id)`` and ``export_model(model_id)`` registered.

    Once the worker is ready it writes its ``workers`` row (what queues it serves), renews
    it every ``worker_heartbeat_s`` and sends wake-ups for its queues' multi-node jobs (a
    gang larger than the live workers was passed over and its messages are used up); the
    row is deleted at shutdown.

    Args:
        settings: service settings (database, broker, lease...).
        gpu_ids: GPUs this worker owns; None or empty for a CPU worker.
        name: the worker's name in the ``workers`` table (default ``worker-<pid>@<host>``).
    """
    app = create_celery(settings)
    sessions = make_session_factory(make_engine(settings.database_url))
    stop = threading.Event()

    def resend(job_id: str, queue: str, priority: int) -> None:
        enqueue(app, job_id, queue, priority)

    @app.task(name=TASK_NAME, ignore_result=True)
    def run_job(job_id: str) -> str:
        """A wake-up for the queue of job ``job_id``: run the job the scheduler picks there
        (:func:`worker.runner.run_next`; none eligible: the message is simply used up)."""
        return runner.run_next(job_id, settings=settings, sessions=sessions,
                               gpu_ids=list(gpu_ids or []), stop=stop, on_requeue=resend)

    @app.task(name=EXPORT_TASK_NAME, ignore_result=True)
    def export_model_task(model_id: str) -> str:
        """Export registered model ``model_id`` to ONNX (:func:`worker.model_export.
        export_model`; nothing waiting: the message is simply used up)."""
        return export_model(model_id, settings=settings, sessions=sessions)

    def on_shutdown(**_: object) -> None:
        stop.set()

    gpu_list = list(gpu_ids or [])
    heartbeat = Heartbeat(sessions, name or f"worker-{os.getpid()}@{socket.gethostname()}",
                          queues_for(gpu_list), len(gpu_list), settings.worker_heartbeat_s)

    def on_ready(**_: object) -> None:
        heartbeat.start()
        runner.wake_gangs_on(sessions, heartbeat.queues, resend)

    def on_worker_shutdown(**_: object) -> None:
        heartbeat.stop()

    worker_shutting_down.connect(on_shutdown, weak=False)
    worker_ready.connect(on_ready, weak=False)
    worker_shutdown.connect(on_worker_shutdown, weak=False)
    app.steps["consumer"].add(poll_interval_step(settings.broker_poll_s))
    app.libreyolo_stop = stop
    app.libreyolo_heartbeat = heartbeat
    return app
