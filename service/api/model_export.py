"""``POST /v1/models/{id}/export``: a registered model's ONNX file, made by a worker.

The API process never runs the export (nor imports torch): the request is recorded on the
model (``onnx_state`` ``exporting``, migration 0011e) and ``export_model(model_id)`` is sent
by name to a worker queue (:func:`service.model_export.export_queue`); the worker runs the
engine's export on the stored ``.pt`` (checked by onnxruntime, :mod:`worker.model_export`).
``GET /v1/models/{id}/file?format=onnx`` downloads the result
(:func:`service.api.models.serve_onnx`).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Annotated, Literal, cast

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy import CursorResult, update
from sqlalchemy.orm import Session

from service.api.deps import CurrentUser, SessionDep, SettingsDep
from service.api.model_refs import READY, visible
from service.api.models import ModelPublic, _public
from service.api.problems import Problem
from service.db.models import Model, utcnow
from service.model_export import (
    EXPORT_FAILED,
    EXPORT_READY,
    EXPORTING,
    enqueue_export,
    export_queue,
    onnx_status,
)
from service.workers import live_queues

__all__ = ["router"]

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/models", tags=["models"])


def _send(request: Request, session: Session, model: Model, queue: str | None,
          asked: datetime) -> None:
    """Send the export message of request ``asked``; a broker that does not answer fails
    that request on the model (exporting again retries)."""
    try:
        enqueue_export(request.app.state.celery, model.id, queue or "cpu")
    except Exception:  # the broker is down: said on the model
        log.exception("model %s: the export could not be sent to a worker", model.id)
        session.execute(update(Model).where(Model.id == model.id,
                                            Model.onnx_state == EXPORTING,
                                            Model.onnx_started_at.is_(None),
                                            Model.onnx_requested_at == asked).values(
            onnx_state=EXPORT_FAILED,
            onnx_error="the export could not be sent to a worker (the broker did not answer); "
            "export again to retry"))
        session.commit()
        session.refresh(model)


@router.post(
    "/{model_id}/export", status_code=202, response_model=ModelPublic,
    operation_id="models-export",
    responses={200: {"description": "the ONNX file is ready already: the same model"},
               404: {"description": "no such model (or another user's model)"},
               409: {"description": "the model is not ready (inspecting or failed)"},
               422: {"description": "a format other than onnx"}},
)
def export_model(
    model_id: str, user: CurrentUser, session: SessionDep, settings: SettingsDep,
    request: Request, response: Response,
    format: Annotated[Literal["onnx"], Query(description="the export format (onnx)")] = "onnx",
) -> ModelPublic:
    """Make the model's ONNX file on a worker (the engine's export, checked by
    onnxruntime: docs/export.md). Answers at once with the model (``onnx`` says where the
    export stands); poll ``GET /v1/models/{id}`` until ``onnx.state`` is ``ready`` (then
    ``GET /v1/models/{id}/file?format=onnx``) or ``failed``.

    Idempotent: ``ready`` answers 200 and exports nothing; ``exporting`` answers 202 and
    sends nothing more (unless no worker took it for ``resend_after_s``: its message is
    sent again, the worker runs it once); ``none`` or ``failed`` records a new request and
    sends it (202; of concurrent requests one records and sends).
    When no live worker serves a queue the answer carries a ``warnings`` entry (the export
    waits until a worker starts).

    Raises:
        404: no such model, or another user's. 409: the model is not ready.
    """
    model = session.get(Model, model_id)
    if not visible(model, user):
        raise Problem(404, f"model {model_id!r} not found")
    if model.state != READY:
        raise Problem(409, f"model {model.id} is {model.state}, not ready: only a ready model "
                      "can be exported", state=model.state)
    status = onnx_status(model, settings)
    live = live_queues(session, settings.worker_ttl_s)
    queue = export_queue(live)
    warnings: list[str] = []
    if status["state"] == EXPORT_READY:
        response.status_code = 200
    elif status["state"] == EXPORTING:
        if model.onnx_started_at is None and model.onnx_requested_at is not None and \
                utcnow() - model.onnx_requested_at > timedelta(seconds=settings.resend_after_s):
            # no worker took it for resend_after_s: its message may be lost (a broker
            # restart); another one is harmless (the worker's claim runs it once)
            _send(request, session, model, queue, model.onnx_requested_at)
    else:
        asked = utcnow()
        won = cast(CursorResult, session.execute(
            update(Model).where(Model.id == model.id,
                                Model.onnx_requested_at == model.onnx_requested_at)
            .values(onnx_state=EXPORTING, onnx_error=None, onnx_info=None,
                    onnx_requested_at=asked, onnx_started_at=None))).rowcount
        session.commit()
        session.refresh(model)
        if won:  # else a concurrent request recorded (and sent) it first
            _send(request, session, model, queue, asked)
    if status["state"] != EXPORT_READY and queue is None:
        served = sorted(live)
        now = f"online workers serve {', '.join(served)}" if served else "no worker is online"
        warnings.append(f"no live worker can export ({now}): the export waits in queue 'cpu' "
                        "until one starts; start one with `libreyolo-service worker --cpu`")
    out = _public(model, settings)
    out.warnings = warnings
    response.headers["Location"] = f"/v1/models/{model.id}"
    return out
