"""``/v1/jobs``: submit, list, read and cancel jobs (their events and log:
:mod:`service.api.events`; their files: :mod:`service.api.artifacts`; the rules a submit
must pass: :mod:`service.api.submit_rules`)."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
from collections.abc import Iterable
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from libreyolo_core.config import ConfigError, resolve_config
from service import job_store
from service.api.deps import (
    OWNED_JOB_ERRORS,
    CurrentUser,
    OwnedJob,
    SessionDep,
    SettingsDep,
    StoreDep,
    owned_or_404,
    read_in_thread,
)
from service.api.model_refs import OTHER_MODEL_FORMS
from service.api.predict import validate_predict_params
from service.api.presenters import job_public, queue_outlooks
from service.api.problems import Problem, error_responses
from service.api.schemas import (
    JobCreate,
    JobKind,
    JobPublic,
    JobsPage,
    JobStatusName,
    TuneOptionsIn,
)
from service.api.submit_rules import (
    batch_warning,
    resolve_data,
    resolve_gpus,
    resolve_model,
    validate_params,
)
from service.db.models import Job, User
from service.lifecycle import TERMINAL, JobStatus
from service.queue import enqueue, queue_for
from service.workers import live_queues, unserved_warning

__all__ = ["router", "job_public", "queue_outlooks", "send_job"]

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.post(
    "", status_code=201, response_model=JobPublic, operation_id="jobs-submit",
    responses={200: {"description": "Idempotency-Key replay: the existing job"},
               **error_responses({
                   409: "Idempotency-Key reused with a different request, or (setting "
                        "refuse_unserved) no live worker serves the job's queue",
                   422: "a field is invalid (schema) or breaks a rule the schema cannot say: "
                        "an unknown model or params key, a data yaml the engine's loader "
                        "refuses, a dataset id that is not yours or whose scan failed, a batch that does not divide by "
                        "the rank count, an empty Idempotency-Key; `field` names it"})},
)
def submit_job(
    body: JobCreate, user: CurrentUser, session: SessionDep, settings: SettingsDep,
    store: StoreDep, request: Request, response: Response,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=200)] = None,
) -> JobPublic:
    """Submit a training, profile, tune or predict job.

    A ``tune`` job profiles the configuration ``tune.repeat`` times, tries the levers its
    verdict names (those that exist on the device) and recommends a parameter set only
    when it beats the baseline beyond noise; its result holds the table
    (``result.tune``). A train job with ``params.preflight`` first profiles a short window
    and estimates img/s, epoch time, the total time and peak memory (``result.preflight``).
    A ``predict`` job runs ``model`` on the images of a dataset (``data``; its
    ``params.split``, default ``val``) and keeps the annotated images (``predict/...``)
    and ``predictions.json`` as artifacts; its ``params`` are ``conf``, ``iou``, ``imgsz``,
    ``max_det`` and ``split`` (:mod:`service.api.predict`; one image: ``POST /v1/predict``).

    ``model`` is a name (``yolo9-t``), one of your registered models (its id, ``m...``;
    see ``/v1/models``) or a checkpoint artifact of one of your earlier jobs,
    ``job:<job id>/weights/best.pt`` (both stored as the file's absolute path; an unknown
    model or job, another user's, or a missing file is a 422 naming ``model``).
    ``params`` are validated by the engine's TrainConfig (an unknown key or bad value is a
    422 whose ``field`` is ``params.<key>``); ``batch`` must divide by the rank count
    (``gpus``, or ``procs`` for a CPU job). Nothing is queued on error. The job row is
    committed, then ``run_job`` is sent to the queue for its GPU count.

    With an ``Idempotency-Key`` header a retried submit returns the existing job (200); the
    same key with a different body is a 409, an empty key a 422.

    When no live worker serves the job's queue (``gpus: 1`` on a service with only a CPU
    worker), the job is queued with a ``warnings`` entry saying so, or, with the setting
    ``refuse_unserved``, refused with a 409 and nothing is queued.

    Returns:
        The job (201), status ``queued``.
    """
    _check_idempotency_key(idempotency_key)
    gpus = resolve_gpus(body, settings.default_gpus, settings.max_nodes)
    request_sha = _request_sha(body, gpus)
    existing = _idempotent_job(session, user.id, idempotency_key, request_sha) \
        if idempotency_key else None
    if existing is not None:
        return _replayed(existing, response, session, settings)
    model, params, data = _resolved_inputs(body, user, session, settings, store, gpus)
    live = live_queues(session, settings.worker_ttl_s)
    warnings = _submit_warnings(session, settings, body, gpus, params, live)
    job, created = _create(session, settings, user, body, model, data, params, gpus,
                           idempotency_key, request_sha)
    if not created:
        return _replayed(job, response, session, settings)
    session.commit()
    session.refresh(job)
    send_job(request.app.state.celery, job)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    out = job_public(job, live, session=session, settings=settings,
                     outlooks=queue_outlooks(session, settings, [job], live,
                                             request.app.state.outlooks))
    out.warnings = warnings
    return out


def _request_sha(body: JobCreate, gpus: int) -> str:
    """sha256 hex of the submit's body (with the resolved ``gpus``): what an
    ``Idempotency-Key`` replay must match."""
    return hashlib.sha256(
        json.dumps(body.model_dump(mode="json") | {"gpus": gpus}, sort_keys=True).encode()
    ).hexdigest()


def _check_idempotency_key(key: str | None) -> None:
    """Raises Problem 422 for an empty ``Idempotency-Key`` (``$(uuidgen)`` where uuidgen
    is not installed would silently give a submit without idempotency)."""
    if key is not None and not key.strip():
        raise Problem(422, "Idempotency-Key: the header is empty; send a fresh key per new "
                      "job (e.g. python3 -c 'import uuid; print(uuid.uuid4())'), or no "
                      "header at all", field="Idempotency-Key")


def _resolved_inputs(body: JobCreate, user: User, session: Any, settings: Any, store: Any,
                     gpus: int) -> tuple[str, dict[str, Any], str]:
    """``(model, params, data)`` of a submit as the job row stores them
    (:mod:`service.api.submit_rules`; a predict job's params: :mod:`service.api.predict`).

    Raises:
        Problem 422: an unknown model, a bad params key or value, a dataset the rules
            refuse (``field`` names it).
    """
    model, family = resolve_model(session, user, store, body.model)
    params = validate_predict_params(body, gpus) if body.kind == "predict" else \
        validate_params(body, gpus, family)
    data = resolve_data(session, user, body.data, settings.check_data_paths, settings)
    if family is None:
        try:
            model = resolve_config({"model": body.model}).model
        except ConfigError as exc:  # a predict job's unknown model (train's: validate_params)
            raise Problem(422, f"model: {exc}. {OTHER_MODEL_FORMS}", field="model",
                          value=body.model) from None
    return model, params, data


def _submit_warnings(session: Any, settings: Any, body: JobCreate, gpus: int,
                     params: dict[str, Any], live: dict[str, int]) -> list[str]:
    """The submit's ``warnings``: no live worker serves its queue, fewer live workers
    than its nodes, a batch larger than the dataset (:func:`batch_warning`).

    Raises:
        Problem 409: no live worker serves the queue and ``refuse_unserved`` is set.
    """
    queue = queue_for(gpus)
    warnings = []
    if not live.get(queue):
        warning = unserved_warning(queue, gpus, live)
        if settings.refuse_unserved:
            raise Problem(409, warning, field="gpus", queue=queue)
        warnings.append(warning)
    elif body.nodes > live[queue]:
        warnings.append(f"only {live[queue]} live worker(s) serve queue "
                        f"{queue!r}: this {body.nodes}-node job starts when "
                        f"{body.nodes} of them are free at once")
    too_big = batch_warning(session, body.data, params)
    if too_big:
        warnings.append(too_big)
    return warnings


def _create(session: Any, settings: Any, user: User, body: JobCreate, model: str, data: str,
            params: dict[str, Any], gpus: int, idempotency_key: str | None,
            request_sha: str) -> tuple[Job, bool]:
    """The submitted job's row and first event (:func:`service.job_store.create_job`).

    Returns:
        ``(job, True)``; ``(existing job, False)`` when a concurrent submit with the same
        ``Idempotency-Key`` won (this one's row is rolled back).

    Raises:
        IntegrityError: the insert failed for another reason.
    """
    options = (body.tune or TuneOptionsIn()).model_dump(mode="json") \
        if body.kind == "tune" else None
    try:
        job = job_store.create_job(
            session=session, owner_id=user.id, kind=body.kind, model=model, data=data,
            params=params, options=options, gpus=gpus,
            procs=body.procs if gpus == 0 else gpus, nodes=body.nodes,
            priority=body.priority, queue=queue_for(gpus),
            max_attempts=settings.max_attempts, time_budget_s=body.time_budget_s,
            idempotency_key=idempotency_key, request_sha256=request_sha)
    except IntegrityError:  # a concurrent submit with the same Idempotency-Key won
        session.rollback()
        existing = _idempotent_job(session, user.id, idempotency_key or "", request_sha)
        if existing is None:
            raise
        return existing, False
    return job, True


def _replayed(job: Job, response: Response, session: Any, settings: Any) -> JobPublic:
    """The answer to an ``Idempotency-Key`` replay: the existing ``job``, status 200."""
    response.status_code = 200
    return job_public(job, session=session, settings=settings)


def send_job(celery: Any, job: Job) -> None:
    """Send ``run_job`` for the committed queued ``job`` to its queue, once per node slot
    to gather; a broker that is down is logged (the reaper re-sends queued jobs later)."""
    try:
        for _ in range(job.nodes):  # one wake-up per node slot to gather
            enqueue(celery, job.id, job.queue, job.priority)
    except Exception:  # broker down: the reaper re-sends queued jobs later
        log.exception("could not send job %s to queue %s; the reaper will retry",
                      job.id, job.queue)


def _idempotent_job(session: SessionDep, owner_id: str, key: str, request_sha: str) -> Job | None:
    job = session.scalar(select(Job).where(Job.owner_id == owner_id, Job.idempotency_key == key))
    if job is not None and job.request_sha256 != request_sha:
        raise Problem(409, f"Idempotency-Key {key!r} was used for a different request "
                      f"(job {job.id})", field="Idempotency-Key", job_id=job.id)
    return job


@router.get("", response_model=JobsPage, operation_id="jobs-list", responses=error_responses({
    422: "a filter is not one of its values, or the cursor was not returned by this endpoint"}))
async def list_jobs(
    user: CurrentUser, request: Request,
    status: Annotated[list[JobStatusName] | None, Query(
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
    last_id = None
    if cursor:
        try:
            last_id = base64.urlsafe_b64decode(cursor.encode()).decode()
        except (ValueError, UnicodeDecodeError):
            last_id = ""
        if not re.fullmatch(r"j[0-9a-f]{24}", last_id):
            raise Problem(422, "cursor: not a cursor returned by this endpoint", field="cursor")
    # async, with one thread-pool hop for all of its reads (docs/scaling.md, "Cost of the
    # hot reads")
    return await read_in_thread(request, _jobs_page, request.app.state, user, status or (),
                                kind, last_id, limit)


def _jobs_page(state: Any, user: User, statuses: Iterable[str], kind: str | None,
               before: str | None, limit: int) -> JobsPage:
    settings = state.settings
    with state.sessions() as session:
        rows, more = job_store.list_jobs(session=session, user=user, statuses=statuses,
                                         kind=kind, before=before, limit=limit)
        next_cursor = base64.urlsafe_b64encode(rows[-1].id.encode()).decode() if more else None
        live = live_queues(session, settings.worker_ttl_s)
        outlooks = queue_outlooks(session, settings, rows, live, state.outlooks)
        return JobsPage(data=[job_public(j, live, session=session, settings=settings,
                                         outlooks=outlooks) for j in rows],
                        next_cursor=next_cursor)


@router.get("/{job_id}", response_model=JobPublic, operation_id="jobs-get", responses=OWNED_JOB_ERRORS)
async def get_job(job_id: str, user: CurrentUser, request: Request) -> JobPublic:
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
    # async, with one thread-pool hop for the ownership check and every read (a sync route
    # with OwnedJob took four; docs/scaling.md, "Cost of the hot reads")
    return await read_in_thread(request, _job_view, request.app.state, job_id, user)


def _job_view(state: Any, job_id: str, user: User) -> JobPublic:
    settings = state.settings
    with state.sessions() as session:
        job = owned_or_404(session, job_id, user)
        live = live_queues(session, settings.worker_ttl_s)
        return job_public(job, live, session=session, settings=settings,
                          outlooks=queue_outlooks(session, settings, [job], live,
                                                  state.outlooks))


@router.post("/{job_id}/resume", status_code=201, response_model=JobPublic,
             operation_id="jobs-resume",
             responses={**OWNED_JOB_ERRORS,
                        409: {"description": "the job is not a cancelled or failed train job, "
                                             "or it left no last.pt to resume from"}})
def resume_job(job: OwnedJob, session: SessionDep, settings: SettingsDep, store: StoreDep,
               request: Request, response: Response) -> JobPublic:
    """Resume a cancelled or failed train job: a new job (a new attempt of the same run)
    with the same model, data, params and devices, that continues from the old job's
    ``weights/last.pt`` (its epoch, optimizer, EMA and schedule) and ``results.csv``.
    The old job stays as it ended.

    Raises:
        409: the job is not a train job, is not cancelled or failed, or has no last.pt.
    """
    import shutil

    if job.kind != "train" or job.status not in (JobStatus.CANCELLED, JobStatus.FAILED):
        raise Problem(409, f"job {job.id} is a {job.status} {job.kind} job: only a cancelled or "
                      "failed train job can be resumed", status_now=job.status)
    last = store.last_checkpoint(job.id)
    if last is None:
        raise Problem(409, f"job {job.id} left no weights/last.pt (it stopped before its first "
                      "epoch ended): submit it again instead", status_now=job.status)
    new = job_store.create_job(
        session=session, owner_id=job.owner_id, kind=job.kind, model=job.model, data=job.data,
        params=dict(job.params or {}), options=job.options, gpus=job.gpus, procs=job.procs,
        nodes=job.nodes, priority=job.priority, queue=job.queue,
        max_attempts=settings.max_attempts, time_budget_s=job.time_budget_s,
        reason=f"resuming job {job.id} from its last.pt")
    weights = store.run_dir(new.id) / "weights"
    weights.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(last, weights / "last.pt")  # the runner resumes from the job's last.pt
    results = store.run_dir(job.id) / "results.csv"
    if results.is_file():
        shutil.copyfile(results, store.run_dir(new.id) / "results.csv")
    session.commit()
    session.refresh(new)
    send_job(request.app.state.celery, new)
    response.headers["Location"] = f"/v1/jobs/{new.id}"
    return job_public(new, session=session, settings=settings)


@router.post("/{job_id}/cancel", status_code=202, response_model=JobPublic,
             operation_id="jobs-cancel",
             responses={**OWNED_JOB_ERRORS, 409: {"description": "the job already finished"}})
def cancel_job(job: OwnedJob, session: SessionDep, settings: SettingsDep) -> JobPublic:
    """Cancel a job.

    A queued job is ``cancelled`` at once; a running one becomes ``cancelling`` and its
    worker stops the engine (SIGTERM, SIGKILL after the grace period), then ``cancelled``.
    Cancelling a ``cancelling`` job again is a no-op.

    Raises:
        409: the job is already succeeded, failed or cancelled.
    """
    job_id = job.id
    done = job_store.request_cancel(session=session, job_id=job_id)
    session.commit()
    session.expire_all()
    job = session.get_one(Job, job_id)
    if job.status in TERMINAL and not (done and job.status == JobStatus.CANCELLED):
        raise Problem(409, f"job {job_id} already {job.status}", status_now=job.status)
    return job_public(job, session=session, settings=settings)

