"""Presenters: the public views of job rows that the API and the pages share
(:func:`job_public`, :func:`queue_outlooks`), kept apart from the routers so the pages
never import a router."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import inspect

from service.api.model_refs import describe_model_ref
from service.api.schemas import JobPublic
from service.db.models import Job
from service.gang import nodes_of, world_size
from service.lifecycle import JobStatus
from service.outlook_cache import OutlookCache
from service.scheduler import Outlook, outlook
from service.storage.roots import public_data, public_model, public_text
from service.workers import waiting_reason

__all__ = ["job_public", "cluster_waiting", "queue_outlooks"]


def job_public(job: Job, live: dict[str, int] | None = None, *, session: Any = None,
               settings: Any = None, outlooks: dict[str, Outlook] | None = None) -> JobPublic:
    """Public view of a job row; with ``live`` (:func:`service.workers.live_queues`) a
    queued job no live worker serves gets its ``waiting`` reason; with ``session`` and
    ``settings``, ``started_from`` (:func:`~service.api.model_refs.describe_model_ref`,
    as the job page's "Started from" says it); with ``outlooks``
    (:func:`service.scheduler.outlook`) a queued job's ``queue_position``,
    ``effective_priority`` and ``estimated_start``."""
    duration = None
    if job.started_at and job.finished_at:
        duration = (job.finished_at - job.started_at).total_seconds()
    # from the row's loaded values: 5x cheaper than from_attributes (one instrumented
    # attribute read per field); a row with an expired or deferred column reads them
    out = JobPublic.model_validate(job if inspect(job).unloaded else job.__dict__)
    out.duration_s = duration
    out.world_size = world_size(job.nodes, job.gpus, job.procs)
    if job.nodes > 1 and session is not None:
        attempt = job.attempt + (1 if job.status == JobStatus.QUEUED else 0)
        out.node_workers = [n.public() for n in nodes_of(session, job.id, attempt)] or \
            ([n.public() for n in nodes_of(session, job.id, job.attempt)] if job.attempt else [])
    out.tune = job.options if job.kind == "tune" else None
    if settings is not None:  # never the service's own folders (dataset:<id>, job:<id>/...)
        out.data = public_data(job.data, settings)
        out.model = public_model(job.model, settings)
        out.error = _public_json(out.error, settings)
        out.result = _public_json(out.result, settings)
    if session is not None and settings is not None:
        out.started_from = describe_model_ref(session, settings, job.model)["short"]
    if live is not None:
        out.waiting = waiting_reason(job.status, job.queue, live, job.nodes)
    cluster_waiting(out)
    if out.waiting is None and job.status == JobStatus.QUEUED and job.waiting_note:
        out.waiting = job.waiting_note  # a woken worker could not start it (low disk)
    where = (outlooks or {}).get(job.id) if job.status == JobStatus.QUEUED else None
    if where is not None:
        out.queue_position = where.position
        out.effective_priority = where.effective_priority
        out.estimated_start = where.estimated_start
    return out


def _public_json(value: dict[str, Any] | None, settings: Any) -> dict[str, Any] | None:
    """``value`` with :func:`~service.storage.roots.public_text` applied to its strings."""
    if not value:
        return value
    text = json.dumps(value)
    public = public_text(text, settings)
    return value if public == text else json.loads(public)


def cluster_waiting(out: JobPublic) -> None:
    """A job its worker submitted to a cluster that still waits there (Slurm: PENDING) is
    ``queued`` in the API, ``waiting`` with the cluster's reason (``Slurm: Resources``)."""
    cluster = out.cluster or {}
    if out.status == JobStatus.RUNNING and cluster.get("state") in ("PENDING", "REQUEUED"):
        out.status = "queued"
        name = str(cluster.get("launcher") or "cluster").capitalize()
        reason = cluster.get("reason") or "waiting for resources"
        out.waiting = f"{name}: {reason} (job {cluster.get('job_id')})"


def queue_outlooks(session: Any, settings: Any, jobs: list[Job], live: dict[str, int],
                   cache: OutlookCache | None = None) -> dict[str, Outlook]:
    """:func:`service.scheduler.outlook` of the queues of the queued ones among ``jobs``
    (through ``cache``, the app's :class:`~service.outlook_cache.OutlookCache`, when given)."""
    queues = {j.queue for j in jobs if j.status == JobStatus.QUEUED}
    if not queues:
        return {}
    return cache.outlooks(session, settings, queues, live) if cache else \
        outlook(session, settings, queues, live)
