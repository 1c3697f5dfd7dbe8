"""``/v1/jobs/{id}``: a job's events (a JSON page, and Server-Sent Events to follow them)
and its engine log."""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import PlainTextResponse
from sqlalchemy import select
from sse_starlette import EventSourceResponse

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
from service.api.problems import Problem
from service.api.schemas import EventPublic, EventsPage
from service.db.models import Job, JobEvent, User
from service.lifecycle import TERMINAL
from service.outage import is_outage
from service.storage.roots import public_text

__all__ = ["router"]

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
#: the largest seq (and byte offset) a request may name: a signed 64-bit integer
MAX_SEQ = 2**63 - 1


def _events(session: Any, job_id: str, after: int, limit: int,
            settings: Any = None) -> list[EventPublic]:
    # the four columns, not ORM rows: half the cost of a page of 50
    rows = session.execute(
        select(JobEvent.seq, JobEvent.time, JobEvent.kind, JobEvent.payload)
        .where(JobEvent.job_id == job_id, JobEvent.seq > after)
        .order_by(JobEvent.seq).limit(limit)
    )
    return [EventPublic(seq=seq, time=at, kind=kind,
                        data=_public(payload, settings) if kind in _PATHY else payload)
            for seq, at, kind, payload in rows]


#: event kinds whose payload may name the service's folders (log lines, reasons)
_PATHY = frozenset({"log", "status", "artifact"})


def _public(payload: Any, settings: Any) -> Any:
    """``payload`` without the service's folders (:func:`~service.storage.roots.public_text`)."""
    if settings is None or not payload:
        return payload
    text = json.dumps(payload)
    public = public_text(text, settings)
    return payload if public == text else json.loads(public)


def _events_after(session: Any, job_id: str, after: int, limit: int,
                  settings: Any = None) -> tuple[list[EventPublic], str]:
    status = session.scalar(select(Job.status).where(Job.id == job_id))
    return _events(session, job_id, after, limit, settings), status


def _fetch_events(sessions: Any, job_id: str, after: int, limit: int,
                  settings: Any = None) -> tuple[list[EventPublic], str]:
    with sessions() as session:
        return _events_after(session, job_id, after, limit, settings)


@router.get("/{job_id}/events", response_model=EventsPage, operation_id="jobs-events",
            responses=OWNED_JOB_ERRORS)
async def list_events(
    job_id: str, user: CurrentUser, request: Request,
    after: Annotated[int, Query(ge=0, le=MAX_SEQ, description="return events with seq > after")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 500,
) -> EventsPage:
    """Events of a job in order (``seq`` 1, 2, 3... without gaps).

    Kinds: ``status`` (service transitions, run_start/run_end), ``metric`` (epoch_start,
    progress, epoch_end, profile), ``artifact`` and ``log`` (batched ``train.log`` lines
    in ``data.lines``). ``done`` is true once the job is terminal and nothing is left.
    """
    # async, with one thread-pool hop for the ownership check and the reads
    # (docs/scaling.md, "Cost of the hot reads")
    return await read_in_thread(request, _events_page, request.app.state.sessions, job_id,
                                user, after, limit, request.app.state.settings)


def _events_page(sessions: Any, job_id: str, user: User, after: int, limit: int,
                 settings: Any = None) -> EventsPage:
    with sessions() as session:
        # the job row (read first) gives the status: terminal before the events are read
        status = owned_or_404(session, job_id, user).status
        events = _events(session, job_id, after, limit, settings)
    next_after = events[-1].seq if events else after
    return EventsPage(data=events, next_after=next_after, status=status,
                      done=status in TERMINAL and len(events) < limit)


@router.get(
    "/{job_id}/events/stream", operation_id="jobs-events-stream",
    responses={**OWNED_JOB_ERRORS, 200: {"content": {"text/event-stream": {}},
                                         "description": "Server-Sent Events"}},
)
def stream_events(
    job: OwnedJob, request: Request, settings: SettingsDep, session: SessionDep,
    after: Annotated[int, Query(ge=0, le=MAX_SEQ, description="start after this seq")] = 0,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> EventSourceResponse:
    """Follow a job's events as Server-Sent Events.

    Each event has ``id: <seq>``, ``event: <kind>`` and ``data: <EventPublic JSON>``.
    Resume after a disconnect with the ``Last-Event-ID`` header (or ``?after=``). Comment
    pings keep idle connections alive. When the job is terminal and every event was sent,
    a final ``event: end`` with ``{"status": ..., "last_seq": ...}`` closes the stream.
    A stream that ends without it (the API restarted, or the database became unavailable
    mid-stream) is to be resumed with ``Last-Event-ID``.
    """
    start = after
    if last_event_id and last_event_id.strip().isdigit():
        if len(last_event_id.strip()) > 19 or int(last_event_id.strip()) > MAX_SEQ:
            raise Problem(422, f"Last-Event-ID: more than {MAX_SEQ} (the largest seq)",
                          field="Last-Event-ID")
        start = max(start, int(last_event_id.strip()))
    sessions, job_id, notifier = request.app.state.sessions, job.id, request.app.state.notifier
    session.close()  # the request's connection goes back to the pool: the stream may last hours

    async def gen():
        last = start
        while True:
            try:
                events, status = await anyio.to_thread.run_sync(
                    _fetch_events, sessions, job_id, last, 500, settings)
            except Exception as exc:
                if not is_outage(exc):
                    raise
                # the database went away mid-stream: end the stream cleanly, without
                # `end`; the client reconnects with Last-Event-ID (503s until it is back)
                log.warning("job %s: event stream ended after seq %d: the database is "
                            "unavailable (%s)", job_id, last, type(exc).__name__)
                return
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
            responses={**OWNED_JOB_ERRORS, 200: {"content": {"text/plain": {}}}})
def get_logs(
    job: OwnedJob, store: StoreDep, settings: SettingsDep,
    offset: Annotated[int, Query(ge=0, le=MAX_SEQ, description="byte offset to start from")] = 0,
    tail: Annotated[int | None, Query(ge=1, le=100_000, description="last N lines only")] = None,
) -> PlainTextResponse:
    """The engine's stdout+stderr (``train.log``) as text.

    ``X-Log-Size`` gives the file size in bytes, which is where this answer ends: pass it
    back as ``offset`` to follow (not ``offset`` plus the text's length: the text names the
    service's folders by their public names, so it is not the file's bytes).
    Empty before the job starts. The service's own folders are named as the API names
    their contents (``dataset:<id>/...``, ``job:<id>/...``,
    :func:`~service.storage.roots.public_text`).
    """
    path = store.log_path(job.id)
    if not path.is_file():
        return PlainTextResponse("", headers={"X-Log-Size": "0"})
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        start = min(offset, size)
        f.seek(start)
        data = f.read(size - start)  # exactly up to X-Log-Size, though the file grows
    text = public_text(data.decode("utf-8", errors="replace"), settings)
    if tail:
        text = "\n".join(text.splitlines()[-tail:]) + ("\n" if text else "")
    return PlainTextResponse(text, headers={"X-Log-Size": str(size)})

