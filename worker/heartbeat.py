"""A worker announces itself: one ``workers`` row renewed every ``worker_heartbeat_s``.

The row says which queues the worker serves, so the API can warn when a job is sent to a
queue nobody serves (``service/workers.py``). A clean shutdown deletes the row; a killed
worker's row goes stale after ``worker_ttl_s``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Sequence
from typing import cast

from sqlalchemy import CursorResult, delete, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from service.db.models import WorkerRow, utcnow

__all__ = ["Heartbeat", "queues_for"]

log = logging.getLogger(__name__)


def queues_for(gpu_ids: Sequence[str]) -> list[str]:
    """Queues a worker with these GPUs serves: ``gpu-k`` for k in 1, 2, 4, 8 up to its GPU
    count, or ``cpu`` when it has none."""
    if not gpu_ids:
        return ["cpu"]
    return [f"gpu-{k}" for k in (1, 2, 4, 8) if k <= len(gpu_ids)]


class Heartbeat:
    """Writes this worker's ``workers`` row now and every ``interval_s`` seconds from a
    daemon thread, until :meth:`stop` (which deletes the row).

    Args:
        sessions: database session factory.
        name: the worker's name (its Celery node name), the row's key.
        queues: queue names it consumes.
        gpus: GPUs it owns.
        interval_s: seconds between writes.
    """

    def __init__(self, sessions: sessionmaker[Session], name: str, queues: Sequence[str],
                 gpus: int, interval_s: float):
        self.sessions, self.name, self.queues = sessions, name, list(queues)
        self.gpus, self.interval_s = gpus, interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        """Write the row once (insert, or renew ``last_seen_at``)."""
        now = utcnow()
        with self.sessions() as s:
            result = s.execute(update(WorkerRow).where(WorkerRow.name == self.name).values(
                last_seen_at=now, queues=self.queues, gpus=self.gpus))
            n = cast(CursorResult, result).rowcount
            if not n:
                s.add(WorkerRow(name=self.name, host=socket.gethostname(), pid=os.getpid(),
                                queues=self.queues, gpus=self.gpus, started_at=now,
                                last_seen_at=now))
            s.commit()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except SQLAlchemyError as exc:  # the database is away: try again next time
                log.warning("worker heartbeat not written: %s", exc)

    def start(self) -> Heartbeat:
        """First write (errors propagate: a worker that cannot reach the database should
        say so at start), then the thread."""
        self.beat()
        self._thread = threading.Thread(target=self._run, name="worker-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and delete the row (a clean shutdown is not a stale worker)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            with self.sessions() as s:
                s.execute(delete(WorkerRow).where(WorkerRow.name == self.name))
                s.commit()
        except SQLAlchemyError as exc:
            log.warning("worker row %s not deleted: %s", self.name, exc)
