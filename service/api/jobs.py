"""``/v1/jobs``: submit, list, read, cancel, events (JSON and SSE), logs, artifacts."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import time
import typing
from datetime import UTC
from pathlib import Path
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import PlainTextResponse
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sse_starlette import EventSourceResponse

from libreyolo_core.config import ConfigError, TrainConfig, resolve_config
from libreyolo_core.data.config import DataConfigError, load_data_config
from libreyolo_core.distributed.batch import nearest_valid_batches, per_rank_batch
from libreyolo_core.models.registry import list_models
from service.api.deps import CurrentUser, OwnedJob, SessionDep, SettingsDep, StoreDep
from service.api.files import FileDigest, RecordedDigest, current_digest, serve_file
from service.api.model_refs import (
    MODEL_ID_LIKE,
    OTHER_MODEL_FORMS,
    describe_model_ref,
    family_of_path,
    resolve_model_id,
)
from service.api.problems import Problem, error_responses
from service.api.schemas import (
    ArtifactPublic,
    ArtifactsList,
    EventPublic,
    EventsPage,
    JobCreate,
    JobKind,
    JobPublic,
    JobsPage,
    JobStatus,
    TuneOptionsIn,
)
from service.db.models import TERMINAL, Artifact, Dataset, Job, JobEvent, utcnow
from service.ops import append_events, transition
from service.outlook_cache import OutlookCache
from service.queue import enqueue, queue_for
from service.scheduler import Outlook, outlook
from service.storage.roots import path_refusal
from service.workers import live_queues, unserved_warning, waiting_reason

__all__ = ["router", "job_public", "queue_outlooks"]

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

GPU_COUNTS = (0, 1, 2, 4, 8)
#: params the service sets itself (run directory, resume, devices).
RESERVED_PARAMS = ("project", "name", "exist_ok", "resume", "device", "data", "model")
TIMELINE_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data: blob:; font-src data:; connect-src 'none'; form-action 'none'; "
    "base-uri 'none'; frame-ancestors 'self'; sandbox allow-scripts"
)
_NOT_FOUND = error_responses({404: "no such job (or another user's job)"})


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
    out = JobPublic.model_validate(job)
    out.duration_s = duration
    out.tune = job.options if job.kind == "tune" else None
    if session is not None and settings is not None:
        out.started_from = describe_model_ref(session, settings, job.model)["short"]
    if live is not None:
        out.waiting = waiting_reason(job.status, job.queue, live)
    where = (outlooks or {}).get(job.id) if job.status == "queued" else None
    if where is not None:
        out.queue_position = where.position
        out.effective_priority = where.effective_priority
        out.estimated_start = where.estimated_start
    return out


def queue_outlooks(session: Any, settings: Any, jobs: list[Job], live: dict[str, int],
                   cache: OutlookCache | None = None) -> dict[str, Outlook]:
    """:func:`service.scheduler.outlook` of the queues of the queued ones among ``jobs``
    (through ``cache``, the app's :class:`~service.outlook_cache.OutlookCache`, when given)."""
    queues = {j.queue for j in jobs if j.status == "queued"}
    if not queues:
        return {}
    return cache.outlooks(session, settings, queues, live) if cache else \
        outlook(session, settings, queues, live)


def _validate_params(body: JobCreate, gpus: int, family: str | None = None) -> dict[str, Any]:
    """Validate ``params`` with the engine's TrainConfig; returns the canonical user keys.

    ``family`` (``<family>-<size>``) stands in for ``body.model`` when the model is a
    checkpoint of an earlier job (its family decides the defaults and the stride rules).

    Raises:
        Problem 422: naming ``params.<key>`` (or ``model``) and what is allowed.
    """
    for key in body.params:
        if key.replace("-", "_") in RESERVED_PARAMS:
            where = key if key in ("data", "model") else None
            detail = (f"params.{key}: set '{key}' at the top level of the request"
                      if where else f"params.{key}: set by the service, not by the request")
            raise Problem(422, detail, field=f"params.{key}")
    try:
        cfg = resolve_config({**body.params, "model": family or body.model})
    except ConfigError as exc:
        field = "model" if exc.key == "model" else f"params.{exc.key}"
        more = f". {OTHER_MODEL_FORMS}" if field == "model" and family is None else ""
        raise Problem(422, f"{field}: {exc}{more}", field=field, value=_jsonable(exc.value),
                      allowed=_allowed_values(exc.key)) from None
    world = gpus or body.procs
    if (body.kind in ("profile", "tune") or cfg.profile) and world > 1:
        raise Problem(422, f"{'gpus' if gpus else 'procs'}: a {body.kind if body.kind != 'train' else 'profile'} "
                      "job runs on one device (the training profiler does not run under DDP); use 1",
                      field="gpus" if gpus else "procs", value=world, allowed=[1])
    if cfg.preflight and body.kind != "train":
        raise Problem(422, f"params.preflight: a preflight estimates a training run; a {body.kind} "
                      "job has none (submit kind train with params.preflight)",
                      field="params.preflight", value=True, allowed=[False])
    if cfg.preflight and world > 1:
        raise Problem(422, f"params.preflight: the preflight profiles one device; this job has "
                      f"{world} ranks ({'gpus' if gpus else 'procs'}={world})",
                      field="params.preflight", value=True, allowed=[False])
    if cfg.batch > 0:
        try:
            per_rank_batch(cfg.batch, world)
        except ValueError as exc:
            ranks = f"gpus={gpus}" if gpus else f"procs={body.procs}"
            raise Problem(422, f"params.batch: {exc} ({ranks})", field="params.batch", value=cfg.batch,
                          allowed=nearest_valid_batches(cfg.batch, world)) from None
    keys = set(cfg.model_fields_set) - {"model"}
    return cfg.model_dump(mode="json", include=keys)


def _allowed_values(key: str) -> list[Any] | None:
    """The valid values of a training key when they are a short list (the model names, a
    Literal's choices); None for ranges and free values (the detail says those)."""
    if key == "model":
        return list_models()
    info = TrainConfig.model_fields.get(key)
    if info is None:
        return None
    choices = [a for a in typing.get_args(info.annotation) if a is not type(None)]
    if typing.get_origin(info.annotation) is typing.Literal:
        return choices
    literals = [typing.get_args(a) for a in choices if typing.get_origin(a) is typing.Literal]
    return [v for group in literals for v in group] if literals and \
        len(literals) == len(choices) else None


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


#: ``job:<job id>/<artifact path>``: a checkpoint artifact of an earlier job.
_JOB_MODEL = re.compile(r"job:(?P<job>j[0-9a-f]{24})/(?P<path>.+)")
_MAX_CHAIN = 32


def _family_of(session: SessionDep, store: Any, model: str) -> str | None:
    """``<family>-<size>`` of a stored job model: a name, or a checkpoint path inside the
    artifact store (followed back through the jobs that produced it). None if unknown."""
    for _ in range(_MAX_CHAIN):
        if not model.startswith("/"):
            return model
        if (registered := family_of_path(session, model)) is not None:
            return registered
        try:
            rel = Path(model).relative_to(store.root)
        except ValueError:
            return None
        parent = session.get(Job, rel.parts[0]) if rel.parts else None
        if parent is None:
            return None
        model = parent.model
    return None


def _resolve_model(session: SessionDep, user: CurrentUser, store: Any,
                   model: str) -> tuple[str, str | None]:
    """Resolve ``job:<id>/<path>`` (or a model id, ``m...``) to the checkpoint's absolute path.

    Returns:
        ``(model, family)``: for a reference, the absolute ``.pt`` path and the
        ``<family>-<size>`` it was trained as; for a name, ``(name, None)``.

    Raises:
        Problem 422 naming ``model``: a malformed reference, another user's or an unknown
        job, a path that leaves the job's run directory, or a missing / non-``.pt`` file.
    """
    if MODEL_ID_LIKE.fullmatch(model):
        return resolve_model_id(session, user, model)
    if not model.startswith("job:"):
        return model, None
    m = _JOB_MODEL.fullmatch(model)
    if m is None:
        raise Problem(422, f"model: {model!r} is not 'job:<job id>/<artifact path>', e.g. "
                      "'job:j0123456789abcdef01234567/weights/best.pt'", field="model")
    ref_id, rel = m["job"], m["path"]
    ref = session.get(Job, ref_id)
    if ref is None or (ref.owner_id != user.id and not user.is_admin):
        raise Problem(422, f"model: job {ref_id!r} not found", field="model")
    if not rel.endswith(".pt"):
        raise Problem(422, f"model: {rel!r} is not a checkpoint (.pt)", field="model")
    path = store.resolve(ref_id, rel)
    if path is None:
        raise Problem(422, f"model: job {ref_id} has no artifact {rel!r}", field="model")
    family = _family_of(session, store, ref.model)
    if family is None:
        raise Problem(422, f"model: cannot tell the model family of job {ref_id}",
                      field="model")
    return str(path), family


def _resolve_data(session: SessionDep, user: CurrentUser, data: str, check: bool, settings: Any) -> str:
    """Dataset id -> its yaml path; a path must be absolute and allowed by
    :func:`~service.storage.roots.path_refusal` (dataset roots; never inside the upload or
    artifact root: uploads are used by id).

    Raises:
        Problem: 422 naming ``data``: an unknown or another user's dataset id, a dataset
            whose scan failed (``status: invalid``, with the scan's reason), a path that
            is not an absolute yaml, or (``check``) one the engine's torch-free
            :func:`~libreyolo_core.data.config.load_data_config` refuses (missing file,
            no ``names``, a split folder that does not exist...; its message).
    """
    if not data.startswith("/"):
        ds = session.get(Dataset, data)
        if ds is None or (ds.owner_id != user.id and not user.is_admin):
            raise Problem(422, f"data: {data!r} is neither a dataset id nor an absolute yaml "
                          "path", field="data")
        if ds.status == "invalid":
            raise Problem(422, f"data: dataset {data} ({ds.name}) failed its scan: "
                          f"{_scan_reason(ds.report)}", field="data")
        return ds.path
    path = Path(data)
    if path.suffix not in (".yaml", ".yml"):
        raise Problem(422, f"data: {data!r} must be a dataset yaml (.yaml/.yml)", field="data")
    refusal = path_refusal(path, settings)
    if refusal is not None:
        raise Problem(422, f"data: {refusal}", field="data")
    if check:
        try:
            load_data_config(path)
        except DataConfigError as exc:
            raise Problem(422, f"data: {exc}", field="data") from None
    return data


def _scan_reason(report: dict[str, Any] | None) -> str:
    """The last line a failed dataset scan printed (its error), or its exit code."""
    report = report or {}
    lines = [ln.strip() for ln in str(report.get("error") or report.get("output") or "")
             .splitlines() if ln.strip()]
    return lines[-1] if lines else f"the scan exited with {report.get('exit_code')}"


@router.post(
    "", status_code=201, response_model=JobPublic, operation_id="jobs-submit",
    responses={200: {"description": "Idempotency-Key replay: the existing job"},
               **error_responses({
                   409: "Idempotency-Key reused with a different request, or (setting "
                        "refuse_unserved) no live worker serves the job's queue",
                   422: "a field is invalid (schema) or breaks a rule the schema cannot say: "
                        "an unknown model or params key, a data yaml the engine's loader "
                        "refuses, a dataset id that is not yours or whose scan failed, a batch that does not divide by "
                        "the rank count; `field` names it"})},
)
def submit_job(
    body: JobCreate, user: CurrentUser, session: SessionDep, settings: SettingsDep,
    store: StoreDep, request: Request, response: Response,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=200)] = None,
) -> JobPublic:
    """Submit a training, profile or tune job.

    A ``tune`` job profiles the configuration ``tune.repeat`` times, tries the levers its
    verdict names (those that exist on the device) and recommends a parameter set only
    when it beats the baseline beyond noise; its result holds the table
    (``result.tune``). A train job with ``params.preflight`` first profiles a short window
    and estimates img/s, epoch time, the total time and peak memory (``result.preflight``).

    ``model`` is a name (``yolo9-t``), one of your registered models (its id, ``m...``;
    see ``/v1/models``) or a checkpoint artifact of one of your earlier jobs,
    ``job:<job id>/weights/best.pt`` (both stored as the file's absolute path; an unknown
    model or job, another user's, or a missing file is a 422 naming ``model``).
    ``params`` are validated by the engine's TrainConfig (an unknown key or bad value is a
    422 whose ``field`` is ``params.<key>``); ``batch`` must divide by the rank count
    (``gpus``, or ``procs`` for a CPU job). Nothing is queued on error. The job row is
    committed, then ``run_job`` is sent to the queue for its GPU count.

    With an ``Idempotency-Key`` header a retried submit returns the existing job (200); the
    same key with a different body is a 409.

    When no live worker serves the job's queue (``gpus: 1`` on a service with only a CPU
    worker), the job is queued with a ``warnings`` entry saying so, or, with the setting
    ``refuse_unserved``, refused with a 409 and nothing is queued.

    Returns:
        The job (201), status ``queued``.
    """
    gpus = settings.default_gpus if body.gpus is None else body.gpus
    if gpus not in GPU_COUNTS:
        raise Problem(422, f"gpus: {gpus} is not one of {', '.join(map(str, GPU_COUNTS))}",
                      field="gpus")
    if gpus and body.procs != 1:
        raise Problem(422, "procs: only a CPU job (gpus=0) sets procs", field="procs")
    if body.tune is not None and body.kind != "tune":
        raise Problem(422, f"tune: tune options go with kind tune, not {body.kind}", field="tune")
    request_sha = hashlib.sha256(
        json.dumps(body.model_dump(mode="json") | {"gpus": gpus}, sort_keys=True).encode()
    ).hexdigest()
    if idempotency_key:
        existing = _idempotent_job(session, user.id, idempotency_key, request_sha)
        if existing is not None:
            response.status_code = 200
            return job_public(existing, session=session, settings=settings)
    model, family = _resolve_model(session, user, store, body.model)
    params = _validate_params(body, gpus, family)
    data = _resolve_data(session, user, body.data, settings.check_data_paths, settings)
    if family is None:
        model = resolve_config({"model": body.model}).model
    live = live_queues(session, settings.worker_ttl_s)
    warnings = []
    if not live.get(queue_for(gpus)):
        warning = unserved_warning(queue_for(gpus), gpus, live)
        if settings.refuse_unserved:
            raise Problem(409, warning, field="gpus", queue=queue_for(gpus))
        warnings.append(warning)
    now = utcnow()
    options = (body.tune or TuneOptionsIn()).model_dump(mode="json") if body.kind == "tune" else None
    job = Job(owner_id=user.id, kind=body.kind, model=model, data=data, params=params,
              options=options,
              gpus=gpus, procs=body.procs if gpus == 0 else gpus, priority=body.priority,
              queue=queue_for(gpus), status="queued", attempt=0,
              max_attempts=settings.max_attempts, time_budget_s=body.time_budget_s,
              idempotency_key=idempotency_key, request_sha256=request_sha,
              cancel_requested=False, event_seq=0, events_offset=0, log_offset=0,
              created_at=now, enqueued_at=now, sent_at=now)
    session.add(job)
    try:
        session.flush()
    except IntegrityError:  # a concurrent submit with the same Idempotency-Key won
        session.rollback()
        existing = _idempotent_job(session, user.id, idempotency_key or "", request_sha)
        if existing is None:
            raise
        response.status_code = 200
        return job_public(existing, session=session, settings=settings)
    append_events(session, job.id, [("status", time.time(), {"event": "status",
                                                              "status": "queued"})])
    session.commit()
    session.refresh(job)
    try:
        enqueue(request.app.state.celery, job.id, job.queue, job.priority)
    except Exception:  # broker down: the reaper re-sends queued jobs later
        log.exception("could not send job %s to queue %s; the reaper will retry",
                      job.id, job.queue)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    out = job_public(job, live, session=session, settings=settings,
                     outlooks=queue_outlooks(session, settings, [job], live,
                                             request.app.state.outlooks))
    out.warnings = warnings
    return out


def _idempotent_job(session: SessionDep, owner_id: str, key: str, request_sha: str) -> Job | None:
    job = session.scalar(select(Job).where(Job.owner_id == owner_id, Job.idempotency_key == key))
    if job is not None and job.request_sha256 != request_sha:
        raise Problem(409, f"Idempotency-Key {key!r} was used for a different request "
                      f"(job {job.id})", field="Idempotency-Key", job_id=job.id)
    return job


@router.get("", response_model=JobsPage, operation_id="jobs-list", responses=error_responses({
    422: "a filter is not one of its values, or the cursor was not returned by this endpoint"}))
def list_jobs(
    user: CurrentUser, session: SessionDep, settings: SettingsDep, request: Request,
    status: Annotated[list[JobStatus] | None, Query(
        description="only jobs in these statuses; repeat the parameter for several "
                    "(?status=queued&status=running)")] = None,
    kind: Annotated[JobKind | None, Query(description="only jobs of this kind")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
) -> JobsPage:
    """List your jobs, newest first (admins see everyone's).

    Cursor pagination: pass ``next_cursor`` back as ``cursor``; it is None on the last page.

    Raises:
        422: a ``status`` or ``kind`` that is not one of the listed values, or a ``cursor``
            this endpoint did not return.
    """
    stmt = select(Job).order_by(Job.id.desc()).limit(limit + 1)
    if not user.is_admin:
        stmt = stmt.where(Job.owner_id == user.id)
    if status:
        stmt = stmt.where(Job.status.in_(set(status)))
    if kind:
        stmt = stmt.where(Job.kind == kind)
    if cursor:
        try:
            last_id = base64.urlsafe_b64decode(cursor.encode()).decode()
        except (ValueError, UnicodeDecodeError):
            last_id = ""
        if not re.fullmatch(r"j[0-9a-f]{24}", last_id):
            raise Problem(422, "cursor: not a cursor returned by this endpoint", field="cursor")
        stmt = stmt.where(Job.id < last_id)
    rows = list(session.scalars(stmt))
    next_cursor = None
    if len(rows) > limit:
        rows = rows[:limit]
        next_cursor = base64.urlsafe_b64encode(rows[-1].id.encode()).decode()
    live = live_queues(session, settings.worker_ttl_s)
    outlooks = queue_outlooks(session, settings, rows, live, request.app.state.outlooks)
    return JobsPage(data=[job_public(j, live, session=session, settings=settings,
                                     outlooks=outlooks) for j in rows],
                    next_cursor=next_cursor)


@router.get("/{job_id}", response_model=JobPublic, operation_id="jobs-get", responses=_NOT_FOUND)
def get_job(job: OwnedJob, session: SessionDep, settings: SettingsDep,
            request: Request) -> JobPublic:
    """A job: status, attempt, progress, timing, result (metrics, verdict) or error tail;
    ``waiting`` says why a queued job cannot start (no live worker serves its queue).

    A queued job also has ``queue_position`` (1: the next of its queue to start, in the
    fair-share order: effective priority, then the owner with the fewest running jobs, then
    the oldest), ``effective_priority`` (priority plus aging) and ``estimated_start``: the
    queue's live workers are slots that free when their running job ends (the engine's
    latest ``eta_s``, else the median duration of the queue's last 20 succeeded jobs minus
    the time it has run) and each job ahead holds one for that median; null when no live
    worker serves the queue, when a needed duration is unknown, or while the owner is at
    their cap (see :func:`service.scheduler.outlook`).
    """
    live = live_queues(session, settings.worker_ttl_s)
    return job_public(job, live, session=session, settings=settings,
                      outlooks=queue_outlooks(session, settings, [job], live,
                                              request.app.state.outlooks))


@router.post("/{job_id}/cancel", status_code=202, response_model=JobPublic,
             operation_id="jobs-cancel",
             responses={**_NOT_FOUND, 409: {"description": "the job already finished"}})
def cancel_job(job: OwnedJob, session: SessionDep, settings: SettingsDep) -> JobPublic:
    """Cancel a job.

    A queued job is ``cancelled`` at once; a running one becomes ``cancelling`` and its
    worker stops the engine (SIGTERM, SIGKILL after the grace period), then ``cancelled``.
    Cancelling a ``cancelling`` job again is a no-op.

    Raises:
        409: the job is already succeeded, failed or cancelled.
    """
    job_id = job.id
    done = transition(session, job_id, ["queued"], "cancelled", cancel_requested=True,
                      finished_at=utcnow(), lease_owner=None, lease_expires_at=None,
                      event={"reason": "cancelled while queued"})
    if not done:
        transition(session, job_id, ["running"], "cancelling", cancel_requested=True)
    session.commit()
    session.expire_all()
    job = session.get(Job, job_id)
    if job.status in TERMINAL and not (done and job.status == "cancelled"):
        raise Problem(409, f"job {job_id} already {job.status}", status_now=job.status)
    return job_public(job, session=session, settings=settings)


def _event_public(e: JobEvent) -> EventPublic:
    return EventPublic(seq=e.seq, time=e.time, kind=e.kind, data=e.payload)


def _events_after(session: Any, job_id: str, after: int, limit: int) -> tuple[list[EventPublic], str]:
    status = session.scalar(select(Job.status).where(Job.id == job_id))
    rows = session.scalars(
        select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.seq > after)
        .order_by(JobEvent.seq).limit(limit)
    ).all()
    return [_event_public(e) for e in rows], status


def _fetch_events(sessions: Any, job_id: str, after: int, limit: int) -> tuple[list[EventPublic], str]:
    with sessions() as session:
        return _events_after(session, job_id, after, limit)


@router.get("/{job_id}/events", response_model=EventsPage, operation_id="jobs-events",
            responses=_NOT_FOUND)
def list_events(
    job: OwnedJob, session: SessionDep,
    after: Annotated[int, Query(ge=0, description="return events with seq > after")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 500,
) -> EventsPage:
    """Events of a job in order (``seq`` 1, 2, 3... without gaps).

    Kinds: ``status`` (service transitions, run_start/run_end), ``metric`` (epoch_start,
    progress, epoch_end, profile), ``artifact`` and ``log`` (batched ``train.log`` lines
    in ``data.lines``). ``done`` is true once the job is terminal and nothing is left.
    """
    # the request's session: a second one per request deadlocked the pool at 16 clients
    events, status = _events_after(session, job.id, after, limit)
    next_after = events[-1].seq if events else after
    return EventsPage(data=events, next_after=next_after, status=status,
                      done=status in TERMINAL and len(events) < limit)


@router.get(
    "/{job_id}/events/stream", operation_id="jobs-events-stream",
    responses={**_NOT_FOUND, 200: {"content": {"text/event-stream": {}},
                                   "description": "Server-Sent Events"}},
)
def stream_events(
    job: OwnedJob, request: Request, settings: SettingsDep, session: SessionDep,
    after: Annotated[int, Query(ge=0, description="start after this seq")] = 0,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> EventSourceResponse:
    """Follow a job's events as Server-Sent Events.

    Each event has ``id: <seq>``, ``event: <kind>`` and ``data: <EventPublic JSON>``.
    Resume after a disconnect with the ``Last-Event-ID`` header (or ``?after=``). Comment
    pings keep idle connections alive. When the job is terminal and every event was sent,
    a final ``event: end`` with ``{"status": ..., "last_seq": ...}`` closes the stream;
    a stream never ends without it.
    """
    start = after
    if last_event_id and last_event_id.strip().isdigit():
        start = max(start, int(last_event_id.strip()))
    sessions, job_id, notifier = request.app.state.sessions, job.id, request.app.state.notifier
    session.close()  # the request's connection goes back to the pool: the stream may last hours

    async def gen():
        last = start
        while True:
            events, status = await anyio.to_thread.run_sync(
                _fetch_events, sessions, job_id, last, 500)
            for e in events:
                last = e.seq
                yield {"id": str(e.seq), "event": e.kind, "data": e.model_dump_json()}
            if not events:
                if status in TERMINAL or status is None:
                    yield {"event": "end", "data": json.dumps({"status": status,
                                                               "last_seq": last})}
                    return
                await notifier.wait(job_id, last)

    return EventSourceResponse(gen(), ping=int(max(1, settings.sse_ping_s)),
                               headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.get("/{job_id}/logs", response_class=PlainTextResponse, operation_id="jobs-logs",
            responses={**_NOT_FOUND, 200: {"content": {"text/plain": {}}}})
def get_logs(
    job: OwnedJob, store: StoreDep,
    offset: Annotated[int, Query(ge=0, description="byte offset to start from")] = 0,
    tail: Annotated[int | None, Query(ge=1, le=100_000, description="last N lines only")] = None,
) -> PlainTextResponse:
    """The engine's stdout+stderr (``train.log``) as text.

    ``X-Log-Size`` gives the file size in bytes: pass it back as ``offset`` to follow.
    Empty before the job starts.
    """
    path = store.log_path(job.id)
    if not path.is_file():
        return PlainTextResponse("", headers={"X-Log-Size": "0"})
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(min(offset, size))
        data = f.read()
    text = data.decode("utf-8", errors="replace")
    if tail:
        text = "\n".join(text.splitlines()[-tail:]) + ("\n" if text else "")
    return PlainTextResponse(text, headers={"X-Log-Size": str(size)})


@router.get("/{job_id}/artifacts", response_model=ArtifactsList, operation_id="jobs-artifacts",
            responses=_NOT_FOUND)
def list_artifacts(job: OwnedJob, session: SessionDep, store: StoreDep) -> ArtifactsList:
    """Files of the job's run directory: path, kind, size and sha256.

    Recorded (with sha256) when the job finishes; while it runs the files on disk are
    listed without sha256.
    """
    rows = session.scalars(select(Artifact).where(Artifact.job_id == job.id)
                           .order_by(Artifact.path)).all()
    url = f"/v1/jobs/{job.id}/artifacts/"
    if rows:
        for a in rows:  # a file rewritten since it was recorded is listed with its new digest
            file = store.resolve(job.id, a.path)
            if file is not None:
                _artifact_digest(session, a, file)
        data = [ArtifactPublic(path=a.path, kind=a.kind, size_bytes=a.size_bytes,
                               sha256=a.sha256, url=url + a.path) for a in rows]
    else:
        from service.storage import artifact_kind

        data = [ArtifactPublic(path=rel, kind=artifact_kind(rel), size_bytes=p.stat().st_size,
                               sha256=None, url=url + rel) for rel, p in store.list_files(job.id)]
    return ArtifactsList(data=data)


@router.api_route(
    "/{job_id}/artifacts/{path:path}", methods=["GET", "HEAD"], operation_id="jobs-artifact-download",
    responses={**_NOT_FOUND, 200: {"content": {"application/octet-stream": {}}},
               206: {"description": "partial content (Range)"}, 304: {"description": "ETag"}},
)
def download_artifact(
    job: OwnedJob, path: str, session: SessionDep, store: StoreDep,
    if_none_match: Annotated[str | None, Header(alias="If-None-Match")] = None,
) -> Response:
    """Download one artifact (path relative to the run dir, e.g. ``weights/best.pt``);
    ``HEAD`` gives the same headers without the body.

    The ``ETag`` (``"<sha256>"``), ``X-Content-SHA256`` and ``Repr-Digest`` describe the
    bytes served: a file changed since its digest was recorded (a resume rewrote
    ``last.pt``) is hashed again and its record updated. ``If-None-Match`` gives 304 only
    for the current ETag; ``Range`` gives 206, unless ``If-Range`` carries another
    validator (then the whole file, 200). ``timeline.html`` is served inline as HTML under
    a Content-Security-Policy that blocks all network access; every other file is an
    attachment. See :mod:`service.api.files`.

    Raises:
        404: no such file, or the path leaves the run directory (``..``, absolute, symlink).
    """
    file = store.resolve(job.id, path)
    if file is None:
        raise Problem(404, f"artifact {path!r} not found in job {job.id}")
    rel = file.relative_to(store.run_dir(job.id).resolve()).as_posix()
    row = session.scalar(select(Artifact).where(Artifact.job_id == job.id, Artifact.path == rel))
    digest = _artifact_digest(session, row, file) if row is not None else None
    if file.name == "timeline.html":
        return serve_file(file, digest, if_none_match, media_type="text/html; charset=utf-8",
                          disposition="inline", headers={"Content-Security-Policy": TIMELINE_CSP})
    return serve_file(file, digest, if_none_match)


def _artifact_digest(session: SessionDep, row: Artifact, file: Path) -> FileDigest:
    """The artifact's digest now; a changed file's new sha256 and size are stored."""
    digest = current_digest(file, RecordedDigest(row.sha256, row.size_bytes, row.created_at))
    if digest.changed:
        log.info("artifact %s of job %s changed on disk since it was recorded: sha256 %s -> %s",
                 row.path, row.job_id, row.sha256[:12], digest.sha256[:12])
        row.sha256, row.size_bytes, row.created_at = digest.sha256, digest.size, utcnow()
        session.commit()
    elif _stale_record(row, digest):
        row.created_at = utcnow()  # touched, same bytes: skip the hash next time
        session.commit()
    return digest


def _stale_record(row: Artifact, digest: FileDigest) -> bool:
    at = row.created_at if row.created_at.tzinfo else row.created_at.replace(tzinfo=UTC)
    return digest.stat.st_mtime > at.timestamp()
