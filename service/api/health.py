"""``/healthz``, ``/readyz`` and ``/metrics`` (no token needed)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from service.api.problems import problem_response

__all__ = ["router", "broker_ping"]

router = APIRouter(tags=["health"])


@router.get("/healthz", operation_id="health-live")
def healthz() -> dict[str, str]:
    """Liveness: the process answers. Always ``{"status": "ok"}``."""
    return {"status": "ok"}


def broker_ping(celery: Any, timeout_s: float = 2.0) -> None:
    """Open a broker connection (raises on failure)."""
    with celery.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=timeout_s)


@router.get("/readyz", operation_id="health-ready",
            responses={503: {"description": "database or broker unreachable"}})
def readyz(request: Request) -> JSONResponse:
    """Readiness: the database answers ``SELECT 1`` and the broker accepts a connection.

    Returns 503 (problem+json naming the failing part) otherwise.
    """
    state = request.app.state
    try:
        with state.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        return problem_response(503, f"database unreachable: {type(exc).__name__}: {exc}",
                                part="database")
    try:
        broker_ping(state.celery)
    except Exception as exc:
        return problem_response(503, f"broker unreachable: {type(exc).__name__}: {exc}",
                                part="broker")
    return JSONResponse({"status": "ready", "database": "ok", "broker": "ok"})


@router.get("/metrics", operation_id="health-metrics",
            responses={200: {"content": {"text/plain": {}}}})
def metrics(request: Request) -> Response:
    """Prometheus metrics: ``libreyolo_jobs{status}``, ``libreyolo_queue_depth{queue}``
    (jobs queued), ``libreyolo_workers{queue}`` (live workers), ``libreyolo_job_duration_seconds`` (histogram of finished jobs) and HTTP counters."""
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
