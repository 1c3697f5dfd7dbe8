"""Predict jobs: the rules of ``kind: predict`` in ``POST /v1/jobs``, and ``POST /v1/predict``
("Try it": one image, one small predict job).

A predict job runs a model (a registered model id, ``job:<id>`` or a checkpoint of an
earlier job, or a base model name such as ``yolo9-t``) on images on a worker (the API
process never imports torch):
the engine's :mod:`libreyolo_core.predict_job` writes the annotated images
(``predict/<image>``), ``predictions.json`` (COCO results) and ``predict.json`` (the summary
the job's ``result.predict`` holds: images, detections, class names, files).

``POST /v1/jobs`` with ``kind: predict`` predicts a dataset (an uploaded or registered
dataset id, or a yaml path; ``params.split``, default ``val``) under the same containment
rule as training (:func:`service.api.submit_rules.resolve_data`). ``POST /v1/predict`` takes
one image as the request body (``max_predict_bytes``, JPEG, PNG, WebP or BMP, checked by
its first bytes; at most ``max_predict_pixels``, read from its header), stores it in the job's own folder
(:meth:`~service.storage.local.ArtifactStore.input_dir`: the worker reads it there, the
dataset rule is for datasets) and queues a job with the ``predict_time_budget_s`` budget on
the first queue a live worker serves (``default_gpus``'s, then ``cpu``, then ``gpu-1``);
when none does, it answers 409 at once and nothing is stored.
"""

from __future__ import annotations

import contextlib
import logging
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

from libreyolo_core.config import resolve_config
from service import job_store
from service.api.deps import CurrentUser, SessionDep, SettingsDep, StoreDep
from service.api.presenters import job_public
from service.api.problems import Problem
from service.api.schemas import JobCreate, JobPublic
from service.api.submit_rules import resolve_model
from service.api.uploads import receive_upload
from service.db.models import new_id
from service.queue import queue_for
from service.workers import live_queues

__all__ = ["router", "PredictParams", "IMAGE_TYPES", "image_type", "validate_predict_params"]

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/predict", tags=["predict"])

#: Content-Type -> file suffix of the images ``POST /v1/predict`` accepts.
IMAGE_TYPES = {"image/jpeg": ".jpg", "image/png": ".png", "image/webp": ".webp",
               "image/bmp": ".bmp"}


class PredictParams(BaseModel):
    """The params of a predict job (the engine's ``predict`` keys; the same defaults)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    conf: float = Field(0.25, ge=0, le=1, description="score threshold")
    iou: float = Field(0.45, gt=0, le=1, description="NMS IoU threshold")
    imgsz: int | None = Field(None, ge=32, le=4096, description="inference size, pixels "
                              "(default: the model's training size)")
    max_det: int = Field(300, ge=1, le=3000, description="detections per image at most")
    split: Literal["train", "val", "test"] = Field("val", description="the split of a "
                                                   "dataset to predict")


def validate_predict_params(body: JobCreate, gpus: int) -> dict[str, Any]:
    """A predict job's ``params`` checked by :class:`PredictParams`; the keys it was given.

    Raises:
        Problem 422: an unknown key or a bad value (``field`` ``params.<key>``); more than
            one node or rank (a predict job runs on one device).
    """
    if body.nodes != 1 or (gpus == 0 and body.procs != 1) or gpus > 1:
        field = "nodes" if body.nodes != 1 else "gpus" if gpus else "procs"
        raise Problem(422, f"{field}: a predict job runs on one device of one host; use 1 "
                      "(gpus 0 or 1, one proc, one node)", field=field, allowed=[1])
    try:
        params = PredictParams.model_validate(body.params)
    except PydanticValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "params"
        what = "not a predict key (conf, iou, imgsz, max_det, split)" \
            if err["type"] == "extra_forbidden" else err["msg"]
        raise Problem(422, f"params.{key}: {what}", field=f"params.{key}",
                      value=err.get("input") if err["type"] != "extra_forbidden" else None) from None
    return params.model_dump(mode="json", exclude_unset=True)


def image_type(head: bytes) -> str | None:
    """The Content-Type of an image from its first bytes (JPEG, PNG, WebP, BMP), or None."""
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    if head.startswith(b"BM"):
        return "image/bmp"
    return None


def _image_size(path: Path) -> tuple[int, int]:
    """``(width, height)`` of an image file from its header (Pillow reads no pixels).

    Raises:
        Problem 422: a file Pillow cannot identify, or one past its decompression-bomb limit.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            return img.size
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError) as exc:
        raise Problem(422, f"body: not a readable image ({exc})", field="body") from None


def _served_gpus(session: Any, settings: Any) -> tuple[int, str] | None:
    """``(gpus, queue)`` of the first queue a live worker serves among ``default_gpus``'s,
    ``cpu`` and ``gpu-1``; None when no live worker serves any of them."""
    live = live_queues(session, settings.worker_ttl_s)
    for gpus in dict.fromkeys((settings.default_gpus if settings.default_gpus <= 1 else 1, 0, 1)):
        if live.get(queue_for(gpus)):
            return gpus, queue_for(gpus)
    return None


def _model_ref(session: Any, user: Any, store: Any, model: str) -> str:
    """``model`` as a job stores it: ``job:<id>`` means its ``weights/best.pt``."""
    if re.fullmatch(r"job:j[0-9a-f]{24}", model):
        model += "/weights/best.pt"
    path, family = resolve_model(session, user, store, model)
    if family is None:
        from libreyolo_core.config import ConfigError

        try:
            path = resolve_config({"model": model}).model
        except ConfigError as exc:
            raise Problem(422, f"model: {exc}", field="model") from None
    return path


@router.post(
    "", status_code=201, response_model=JobPublic, operation_id="predict-image",
    openapi_extra={"requestBody": {"content": {t: {"schema": {"type": "string", "format": "binary"}}
                                               for t in IMAGE_TYPES}, "required": True}},
    responses={409: {"description": "no live worker serves a queue that could run it"},
               413: {"description": "image larger than max_predict_bytes"},
               415: {"description": "Content-Type is not image/jpeg, image/png, image/webp "
                                    "or image/bmp"},
               422: {"description": "a bad parameter, an unknown model, an empty body, or "
                                    "bytes that are not the image the Content-Type says"}},
)
async def predict_image(
    request: Request, user: CurrentUser, session: SessionDep, settings: SettingsDep,
    store: StoreDep, response: Response,
    model: Annotated[str, Query(min_length=1, max_length=500, pattern=r"^[^\x00-\x1f\x7f]+$",
                                description="a registered model id (m...), job:<id> (its "
                                "weights/best.pt), job:<id>/<checkpoint>, or a base model "
                                "name such as yolo9-t (untrained)")],
    name: Annotated[str, Query(max_length=200, description="the image's file name (the "
                               "annotated artifact is predict/<name>)")] = "image",
    conf: Annotated[float, Query(ge=0, le=1)] = 0.25,
    iou: Annotated[float, Query(gt=0, le=1)] = 0.45,
    imgsz: Annotated[int | None, Query(ge=32, le=4096)] = None,
    max_det: Annotated[int, Query(ge=1, le=3000)] = 300,
) -> JobPublic:
    """"Try it": run ``model`` on one image (the request body) on a worker.

    Creates a predict job (priority 9, time budget ``predict_time_budget_s``) and answers
    at once with it (201, ``queued``). Poll ``GET /v1/jobs/{id}``; once ``succeeded``,
    ``result.predict`` has ``names`` and ``files`` and the artifacts hold
    ``predict/<name>`` (the annotated image) and ``predictions.json`` (the boxes, COCO
    ``bbox`` ``[x, y, w, h]`` in image pixels).

    Raises:
        409: no live worker serves a queue that could run it (nothing is stored).
        413: larger than ``max_predict_bytes``. 415: not an image Content-Type.
        422: an empty body, bytes that are no JPEG/PNG/WebP/BMP (or more pixels than
            ``max_predict_pixels``), an unknown model.
    """
    kind = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
    if kind not in IMAGE_TYPES:
        raise Problem(415, f"body: Content-Type {kind or '(none)'!r} is not an image this "
                      f"service reads; send {', '.join(IMAGE_TYPES)}", field="body")
    path = _model_ref(session, user, store, model)
    gpus, queue = _served_or_409(session, settings)
    job_id = new_id("j")
    image, sha256 = await _received_image(request, store.input_dir(job_id), name, kind,
                                          settings)
    params = {k: v for k, v in {"conf": conf, "iou": iou, "imgsz": imgsz,
                                "max_det": max_det}.items() if v is not None}
    job = job_store.create_job(
        session=session, job_id=job_id, owner_id=user.id, kind="predict", model=path,
        data=str(image), params=params, gpus=gpus, procs=1, nodes=1, priority=9,
        queue=queue, max_attempts=settings.max_attempts,
        time_budget_s=settings.predict_time_budget_s, request_sha256=sha256)
    session.commit()
    session.refresh(job)
    from service.api.jobs import send_job  # the jobs router imports this module

    send_job(request.app.state.celery, job)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return job_public(job, session=session, settings=settings)


def _served_or_409(session: Any, settings: Any) -> tuple[int, str]:
    """:func:`_served_gpus`.

    Raises:
        Problem 409: no live worker serves any of those queues (the detail says which
            queues the online workers serve, and how to start one).
    """
    served = _served_gpus(session, settings)
    if served is None:
        online = sorted(live_queues(session, settings.worker_ttl_s))
        seen = f"online workers serve {', '.join(online)}" if online else "no worker is online"
        raise Problem(409, f"no live worker serves the cpu or gpu-1 queue ({seen}), so nothing "
                      "can run the prediction; nothing was queued. Start one with "
                      "`libreyolo-service worker --cpu` (or --gpus 0) and try again",
                      field="model")
    return served


async def _received_image(request: Request, folder: Path, name: str, kind: str,
                          settings: Any) -> tuple[Path, str]:
    """The request body streamed into ``folder`` as ``<name's stem><suffix of kind>``
    (:func:`~service.api.uploads.receive_upload`) and checked: not empty, the image type
    its first bytes say is ``kind``, at most ``max_predict_pixels``. On any refusal the
    file and the folders made for it are deleted.

    Returns:
        ``(image path, sha256 hex of its bytes)``.

    Raises:
        Problem 413: larger than ``max_predict_bytes``. 422 (``field: body``): empty,
            bytes of another type than ``kind``, an unreadable image, too many pixels.
    """
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).stem)[:100].strip("._") or "image"
    image = folder / f"{stem}{IMAGE_TYPES[kind]}"
    image.parent.mkdir(parents=True, exist_ok=True)
    try:
        got = await receive_upload(
            request, image, max_bytes=settings.max_predict_bytes, field="body",
            too_big=f"body: the image is larger than {settings.max_predict_bytes} bytes "
                    "(max_predict_bytes)")
        if got.size == 0:
            raise Problem(422, "body: empty (send the image's bytes as the request body)",
                          field="body")
        found = image_type(got.head)
        if found != kind:
            raise Problem(422, f"body: the bytes are {'a ' + found if found else 'no JPEG, PNG, WebP or BMP image'}"
                          f", not the {kind} the Content-Type says", field="body")
        width, height = await anyio.to_thread.run_sync(_image_size, image)
        if width * height > settings.max_predict_pixels:
            raise Problem(422, f"body: the image is {width}x{height} pixels, more than "
                          f"{settings.max_predict_pixels:,} (max_predict_pixels)", field="body")
    except BaseException:
        image.unlink(missing_ok=True)
        for folder_made in (image.parent, image.parent.parent):
            with contextlib.suppress(OSError):
                folder_made.rmdir()
        raise
    return image, got.sha256

