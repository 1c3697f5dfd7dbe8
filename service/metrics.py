"""Prometheus collector reading the database and the broker at scrape time."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from service.db.models import JOB_STATUSES, TERMINAL, Job
from service.queue import QUEUES

__all__ = ["ServiceCollector", "DURATION_BUCKETS_S"]

log = logging.getLogger(__name__)
DURATION_BUCKETS_S = (10, 30, 60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 24 * 3600)


class ServiceCollector(Collector):
    """``libreyolo_jobs{status}``, ``libreyolo_queue_depth{queue}``,
    ``libreyolo_job_duration_seconds`` (finished jobs, started -> finished)."""

    def __init__(self, sessions: Any, celery: Any):
        self.sessions, self.celery = sessions, celery

    def collect(self) -> Iterator[Any]:
        jobs = GaugeMetricFamily("libreyolo_jobs", "jobs by status", labels=["status"])
        hist = HistogramMetricFamily("libreyolo_job_duration_seconds",
                                     "run time of finished jobs, seconds")
        with self.sessions() as session:
            counts = dict(session.execute(select(Job.status, func.count()).group_by(Job.status))
                          .all())
            times = session.execute(
                select(Job.started_at, Job.finished_at).where(
                    Job.status.in_(TERMINAL), Job.started_at.is_not(None),
                    Job.finished_at.is_not(None)).order_by(Job.finished_at.desc()).limit(10000)
            ).all()
        for status in JOB_STATUSES:
            jobs.add_metric([status], counts.get(status, 0))
        durations = [(f - s).total_seconds() for s, f in times]
        buckets = [(str(b), sum(d <= b for d in durations)) for b in DURATION_BUCKETS_S]
        buckets.append(("+Inf", len(durations)))
        hist.add_metric([], buckets, sum(durations))
        yield jobs
        yield hist
        depth = GaugeMetricFamily("libreyolo_queue_depth", "messages waiting per queue",
                                  labels=["queue"])
        try:
            with self.celery.connection_for_read() as conn:
                channel = conn.default_channel
                for q in QUEUES:
                    try:
                        _, count, _ = channel.queue_declare(q, passive=True)
                    except Exception:
                        count = 0
                    depth.add_metric([q], count)
        except Exception:
            log.debug("queue depth unavailable", exc_info=True)
        yield depth
