"""The ONNX export of a registered model: its states and the queue it is sent to.

``POST /v1/models/{id}/export`` (:mod:`service.api.model_export`) records the request on
the model (``onnx_state`` ``exporting``) and sends ``export_model(model_id)`` BY NAME to
a worker queue; the worker (:mod:`worker.model_export`) runs the engine's export on the
stored ``.pt`` in a child process. The API process never imports torch. Shared by the
API, the pages and the worker; imports neither torch nor the worker.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery import Celery

from service.db.models import Model, utcnow
from service.settings import Settings

__all__ = ["EXPORT_TASK_NAME", "EXPORTING", "EXPORT_READY", "EXPORT_FAILED", "STALE_AFTER_S",
           "enqueue_export", "export_queue", "onnx_status"]

#: the Celery task a worker registers (``worker.tasks``); sent by name
EXPORT_TASK_NAME = "export_model"
#: ``models.onnx_state`` (migration 0011e); None means never asked
EXPORTING, EXPORT_READY, EXPORT_FAILED = "exporting", "ready", "failed"
#: seconds past ``export_timeout_s`` after which an export a worker started and never
#: finished (the worker died) reads as failed, so that exporting again retries
STALE_AFTER_S = 60.0
#: GPU queues in the order an export prefers them (any GPU worker serves ``gpu-1``)
_GPU_QUEUES = ("gpu-1", "gpu-2", "gpu-4", "gpu-8")


def onnx_status(model: Model, settings: Settings) -> dict[str, Any]:
    """The ONNX export of ``model`` as the API and pages show it: ``{"state": "none" |
    "exporting" | "ready" | "failed", "error": str | None, "info": dict | None,
    "requested_at": datetime | None}``.

    ``info`` (ready): the engine's ``ExportResult`` without its server path (``format``,
    ``model``, ``imgsz``, ``layout``, ``opset``, ``max_diff``: the onnxruntime check's
    worst ``|ort - torch| / (1 + |torch|)``, ``tolerance``, ``check_shape``...) plus the
    file's ``sha256`` and ``bytes``. An export a worker started more than
    ``export_timeout_s`` + :data:`STALE_AFTER_S` seconds ago is ``failed`` (its worker
    stopped); one still waiting for a worker stays ``exporting``.
    """
    state = model.onnx_state or "none"
    error = model.onnx_error
    if state == EXPORTING and model.onnx_started_at is not None and utcnow() \
            - model.onnx_started_at > timedelta(seconds=settings.export_timeout_s + STALE_AFTER_S):
        state, error = EXPORT_FAILED, ("the export did not finish (its worker stopped "
                                       "meanwhile?); export again to retry")
    return {"state": state, "error": error if state == EXPORT_FAILED else None,
            "info": model.onnx_info if state == EXPORT_READY else None,
            "requested_at": model.onnx_requested_at}


def export_queue(live: dict[str, int]) -> str | None:
    """The queue an export goes to: ``cpu`` when a live worker serves it (the export and
    its check run on the CPU), else the first GPU queue a live worker serves; None when no
    worker is online (``live``: :func:`service.workers.live_queues`)."""
    if live.get("cpu"):
        return "cpu"
    return next((q for q in _GPU_QUEUES if live.get(q)), None)


def enqueue_export(app: Celery, model_id: str, queue: str) -> None:
    """Send ``export_model(model_id)`` to ``queue`` by name. Call after the row commits."""
    app.send_task(EXPORT_TASK_NAME, args=[model_id], queue=queue, ignore_result=True)
