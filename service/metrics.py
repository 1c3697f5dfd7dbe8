"""Prometheus collector reading the database and the broker at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from service.db.models import Job
from service.lifecycle import TERMINAL, JobStatus
from service.queue import QUEUES
from service.workers import live_queues

__all__ = ["ServiceCollector", "DURATION_BUCKETS_S"]

DURATION_BUCKETS_S = (10, 30, 60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 24 * 3600)


class ServiceCollector(Collector):
    """``libreyolo_jobs{status}``, ``libreyolo_queue_depth{queue}`` (jobs queued per queue,
    counted in the database: a cancelled job leaves the count at once, though its Celery
    message stays in the broker until a worker takes and drops it),
    ``libreyolo_workers{queue}`` (live workers serving each queue, from their heartbeats)
    and ``libreyolo_job_duration_seconds`` (finished jobs, started -> finished)."""

    def __init__(self, sessions: Any, worker_ttl_s: float):
        self.sessions, self.worker_ttl_s = sessions, worker_ttl_s

    def collect(self) -> Iterator[Any]:
        jobs = GaugeMetricFamily("libreyolo_jobs", "jobs by status", labels=["status"])
        hist = HistogramMetricFamily("libreyolo_job_duration_seconds",
                                     "run time of finished jobs, seconds")
        depth = GaugeMetricFamily("libreyolo_queue_depth", "jobs queued per queue",
                                  labels=["queue"])
        workers = GaugeMetricFamily("libreyolo_workers", "live workers serving each queue",
                                    labels=["queue"])
        with self.sessions() as session:
            counts = dict(session.execute(select(Job.status, func.count()).group_by(Job.status))
                          .all())
            queued = dict(session.execute(select(Job.queue, func.count()).where(
                Job.status == JobStatus.QUEUED).group_by(Job.queue)).all())
            live = live_queues(session, self.worker_ttl_s)
            times = session.execute(
                select(Job.started_at, Job.finished_at).where(
                    Job.status.in_(TERMINAL), Job.started_at.is_not(None),
                    Job.finished_at.is_not(None)).order_by(Job.finished_at.desc()).limit(10000)
            ).all()
        for status in JobStatus:
            jobs.add_metric([status.value], counts.get(status, 0))
        for q in QUEUES:
            depth.add_metric([q], queued.get(q, 0))
            workers.add_metric([q], live.get(q, 0))
        durations = [(f - s).total_seconds() for s, f in times]
        buckets = [(str(b), sum(d <= b for d in durations)) for b in DURATION_BUCKETS_S]
        buckets.append(("+Inf", len(durations)))
        hist.add_metric([], buckets, sum(durations))
        yield jobs
        yield hist
        yield depth
        yield workers
