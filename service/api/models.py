"""``/v1/models``: a registry of weights files (uploads and published job checkpoints).

A model is a weights file the engine can start from: ``POST /v1/jobs`` accepts its id as
``model``. Every file is read by ``python -m libreyolo_core.weights inspect`` in a child
process with a time limit (``torch.load(weights_only=True)``; the API process never imports
torch), which says its family, size, classes and parameter count.

An upload is inspected inside its request (the client is sending the file anyway). A
publish answers at once (202) with the model ``inspecting`` and inspects the job's
checkpoint after the answer; the model then becomes ``ready``, or ``failed`` with the
reason in ``error`` (:func:`_finish_publish`). One model per published job: a unique index
on ``source`` (migration 0010p) makes two concurrent publishes one model.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, BackgroundTasks, Depends, Header, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from libreyolo_core.models.registry import ModelNameError, parse_model_name
from service.api.deps import CurrentUser, OwnedJob, SessionDep, SettingsDep
from service.api.files import RecordedDigest, current_digest, serve_file
from service.api.model_refs import FAILED, INSPECTING, READY, model_state, model_store, visible
from service.api.problems import Problem
from service.api.uploads import receive_upload
from service.db.models import Job, Model, User, new_id
from service.lifecycle import ACTIVE, JobStatus
from service.model_export import EXPORT_FAILED, EXPORT_READY, EXPORTING, onnx_status
from service.settings import Settings
from service.storage.models import WeightsRejected, inspect_in_child
from service.users import visible_to

log = logging.getLogger(__name__)

__all__ = ["router", "publish_router", "ModelPublic", "ModelsPage", "OnnxExport",
           "PublishRequest", "onnx_public", "serve_onnx"]

router = APIRouter(prefix="/v1/models", tags=["models"])
publish_router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "no such model (or another user's model)"}}
#: a 422 detail keeps the inspector's reason readable: its first lines, this many characters.
_DETAIL_CHARS = 600


class OnnxExport(BaseModel):
    """A model's ONNX export as the API shows it."""

    state: Literal["none", "exporting", "ready", "failed"] = Field(
        "none", description="none (never asked: POST /v1/models/{id}/export); exporting (sent "
        "to a worker, or running); ready (GET /v1/models/{id}/file?format=onnx); failed "
        "(error says why; export again to retry)")
    error: str | None = Field(None, description="why the export failed (state failed)")
    info: dict[str, Any] | None = Field(
        None, description="state ready: the engine's export record: max_diff (the "
        "onnxruntime check's worst |ort - torch| / (1 + |torch|)), tolerance, layout, "
        "opset, imgsz, check_shape, model, sha256 and bytes of the .onnx file")
    requested_at: datetime | None = None


def onnx_public(model: Model, settings: Settings) -> OnnxExport:
    """The model's :class:`OnnxExport` (:func:`service.model_export.onnx_status`)."""
    return OnnxExport.model_validate(onnx_status(model, settings))


class ModelPublic(BaseModel):
    """A registered model as the API shows it (no server-side path)."""

    model_config = ConfigDict(from_attributes=True)

    id: str = Field(description="pass it as a job's `model`")
    name: str
    family: str = Field(description="model family, e.g. yolo9")
    size: str = Field(description="size letter, e.g. t")
    nc: int = Field(description="classes of the detection head")
    names: dict[str, str] = Field(description="class id (as a string) -> name")
    params: int = Field(description="parameter count")
    sha256: str
    bytes: int = Field(description="file size in bytes")
    format: str = Field(description="file layout the inspector recognised, e.g. libreyolo")
    imgsz: int | None = Field(None, description="training image size stored in the file")
    source: str = Field(description="upload, or job:<job id> for a published checkpoint")
    created_at: datetime
    state: str = Field(READY, description="ready; inspecting (a publish is reading the "
                       "checkpoint: family, size, nc, names, params and sha256 are "
                       "placeholders until ready); failed (error says why; publish again to "
                       "retry)")
    error: str | None = Field(None, description="why the inspection failed (state failed)")
    onnx: OnnxExport = Field(default_factory=OnnxExport,
                             description="its ONNX export (POST /v1/models/{id}/export)")
    warnings: list[str] = Field(default_factory=list, description="export only: what may "
                                "keep the export from running (no live worker)")


class ModelsPage(BaseModel):
    data: list[ModelPublic]


class PublishRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"name": "shapes-v1"}]})

    name: str = Field(..., min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]*$",
                      description="the new model's name")


def owned_model(model_id: str, user: CurrentUser, session: SessionDep) -> Model:
    """The model ``model_id`` if the user owns it (or is an admin).

    Raises:
        Problem 404: no such model, or another user's (the two are indistinguishable).
    """
    model = session.get(Model, model_id)
    if not visible(model, user):
        raise Problem(404, f"model {model_id!r} not found")
    return model


OwnedModel = Annotated[Model, Depends(owned_model)]


def _public(model: Model, settings: Settings) -> ModelPublic:
    out = ModelPublic.model_validate(model)
    out.state, out.error = model_state(model, settings)
    out.onnx = onnx_public(model, settings)
    return out


def _detail(reason: str) -> str:
    text = " ".join(reason.split())
    return text if len(text) <= _DETAIL_CHARS else text[:_DETAIL_CHARS - 3] + "..."


def _checked_info(part: Path, settings: Settings, field: str) -> dict[str, Any]:
    """The inspector's facts about ``part`` (a child process, :func:`inspect_in_child`).

    Raises:
        Problem 422 naming ``field``: the inspector refused the file (its reason), timed
            out, or found a family / size this service does not have.
    """
    try:
        info = inspect_in_child(part, python=settings.engine_python,
                                timeout_s=settings.inspect_timeout_s)
    except WeightsRejected as exc:
        raise Problem(422, f"{field}: not a usable weights file: {_detail(str(exc))}",
                      field=field) from None
    try:
        parse_model_name(f"{info['family']}-{info['size']}")
    except ModelNameError as exc:
        raise Problem(422, f"{field}: a {info['family']}-{info['size']} model, which this "
                      f"service cannot train ({exc})", field=field) from None
    return info


def _facts(info: dict[str, Any]) -> dict[str, Any]:
    """The ``models`` columns the inspector's JSON fills."""
    return dict(family=str(info["family"]), size=str(info["size"]), nc=int(info["nc"]),
                names={str(k): str(v) for k, v in (info.get("names") or {}).items()},
                params=int(info["params"]), sha256=str(info["sha256"]),
                bytes=int(info["bytes"]), format=str(info.get("format") or "unknown"),
                imgsz=info.get("imgsz"))


async def _register(session: Session, settings: Settings, *, model_id: str, part: Path,
                    owner: User, name: str, source: str, field: str) -> Model:
    """Inspect ``part`` in a child process, then move it to its final place and add the row.

    ``part`` is deleted whatever happens unless it became the model's file.

    Raises:
        Problem 422 naming ``field``: as :func:`_checked_info`.
    """
    store = model_store(settings)
    try:
        info = await anyio.to_thread.run_sync(_checked_info, part, settings, field)
        final = store.path(model_id)
        os.replace(part, final)
    finally:
        part.unlink(missing_ok=True)
    model = Model(id=model_id, owner_id=owner.id, name=name, source=source, path=str(final),
                  state=READY, **_facts(info))
    session.add(model)
    try:
        session.commit()
    except BaseException:
        final.unlink(missing_ok=True)
        raise
    return model


def _finish_publish(sessions: sessionmaker[Session], settings: Settings, model_id: str,
                    part: Path) -> None:
    """After a publish answered: inspect ``part`` (the job's checkpoint, linked or copied
    into the model store) and make model ``model_id`` ``ready`` with the inspector's facts
    (its file moved in place), or ``failed`` with the reason (``part`` deleted). Only a
    model still ``inspecting`` is changed (one deleted meanwhile stays deleted). A
    database outage here leaves it ``inspecting``, which reads as failed once
    ``inspect_timeout_s`` + 60 s have passed (:func:`service.api.model_refs.model_state`)."""
    final = model_store(settings).path(model_id)
    try:
        try:
            values: dict[str, Any] = {"state": READY, "error": None,
                                      **_facts(_checked_info(part, settings, "job"))}
        except Problem as exc:
            values = {"state": FAILED, "error": exc.detail}
        except Exception as exc:  # noqa: BLE001 - said on the model, not lost in a log
            log.exception("model %s: the inspection failed", model_id)
            values = {"state": FAILED, "error": f"the inspection failed: {type(exc).__name__}"}
        if values["state"] == READY:
            os.replace(part, final)
        with sessions() as s:
            changed = s.execute(update(Model).where(Model.id == model_id,
                                                    Model.state == INSPECTING)
                                .values(**values)).rowcount  # type: ignore[attr-defined]
            s.commit()
        if not changed:
            final.unlink(missing_ok=True)
        log.info("model %s: %s%s", model_id, values["state"],
                 f" ({values['error']})" if values.get("error") else "")
    except Exception:
        log.exception("model %s: the inspection's result was not recorded", model_id)
    finally:
        part.unlink(missing_ok=True)


@router.post(
    "", status_code=201, response_model=ModelPublic, operation_id="models-upload",
    openapi_extra={"requestBody": {"content": {"application/octet-stream": {
        "schema": {"type": "string", "format": "binary"}}}, "required": True}},
    responses={200: {"description": "the same bytes again: the model already made from them"},
               413: {"description": "file larger than max_model_bytes"},
               422: {"description": "not a weights file this service can use; the detail "
                     "says why (not a torch file, a pickle that needs code, truncated, a "
                     "family this service does not have)"}},
)
async def upload_model(
    request: Request, user: CurrentUser, session: SessionDep, settings: SettingsDep,
    response: Response,
    name: Annotated[str, Query(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$",
                                         description="model name")],
) -> ModelPublic:
    """Upload a weights file (request body: the file's bytes), streamed to disk.

    The file is read in a child process with ``torch.load(weights_only=True)`` and a time
    limit (``inspect_timeout_s``); its family, size, ``nc``, class names, parameter count
    and sha256 are stored. Nothing is kept when it is refused.

    The same bytes uploaded again by the same user (whatever the ``name``) answer 200 with
    the model already made from them (same ``sha256``), nothing stored twice.

    Raises:
        413: larger than ``max_model_bytes``.
        422 (``field: body``): the reason the file cannot be used.
    """
    model_id = new_id("m")
    part = model_store(settings).incoming(model_id)
    got = await receive_upload(request, part, max_bytes=settings.max_model_bytes,
                               too_big=f"upload exceeds {settings.max_model_bytes} bytes "
                               "(max_model_bytes)")
    if got.size == 0:
        part.unlink(missing_ok=True)
        raise Problem(422, "body: empty upload (send the weights file as the request body)",
                      field="body")
    same = session.scalar(select(Model).where(
        Model.owner_id == user.id, Model.source == "upload",
        Model.sha256 == got.sha256).order_by(Model.id).limit(1))
    if same is not None:
        part.unlink(missing_ok=True)
        response.status_code = 200
        response.headers["Location"] = f"/v1/models/{same.id}"
        return _public(same, settings)
    model = await _register(session, settings, model_id=model_id, part=part, owner=user,
                            name=name, source="upload", field="body")
    response.headers["Location"] = f"/v1/models/{model.id}"
    return _public(model, settings)


@router.get("", response_model=ModelsPage, operation_id="models-list")
def list_models(user: CurrentUser, session: SessionDep, settings: SettingsDep) -> ModelsPage:
    """Your models, newest first (admins see everyone's)."""
    stmt = visible_to(select(Model).order_by(Model.id.desc()), Model.owner_id, user)
    return ModelsPage(data=[_public(m, settings) for m in session.scalars(stmt)])


@router.get("/{model_id}", response_model=ModelPublic, operation_id="models-get",
            responses=_NOT_FOUND)
def get_model(model: OwnedModel, settings: SettingsDep) -> ModelPublic:
    """One model: family, size, classes, parameter count, sha256, source, and ``state``
    (poll it after a publish until it is ``ready`` or ``failed``)."""
    return _public(model, settings)


@router.api_route(
    "/{model_id}/file", methods=["GET", "HEAD"], operation_id="models-download",
    responses={**_NOT_FOUND, 200: {"content": {"application/octet-stream": {}}},
               206: {"description": "partial content (Range)"}, 304: {"description": "ETag"},
               409: {"description": "the model is not ready (inspecting or failed); "
                     "format=onnx: the ONNX export is not ready (none, exporting or failed)"}},
)
def download_model(
    model: OwnedModel, settings: SettingsDep,
    if_none_match: Annotated[str | None, Header(alias="If-None-Match")] = None,
    format: Annotated[Literal["pt", "onnx"], Query(
        description="pt: the weights file; onnx: its ONNX export (POST "
        "/v1/models/{id}/export first)")] = "pt",
) -> Response:
    """Download the model's weights file (``HEAD``: the headers alone), with the rules of
    job artifacts (:mod:`service.api.files`): ``Range`` (206; a stale ``If-Range`` gets the
    whole file), ``ETag`` = the sha256 of the bytes served, ``If-None-Match`` (304),
    ``X-Content-SHA256``. ``format=onnx``: its ONNX export, with the same rules.

    Raises:
        404: no such model, or its file is missing.
        409: the model is not ready; ``format=onnx``: its export is not ready (the detail
            says its state and what to do; ``onnx_state``).
    """
    if format == "onnx":
        return serve_onnx(model, settings, if_none_match)
    if model.state != READY:
        raise Problem(409, f"model {model.id} is {model.state}, not ready", state=model.state)
    file = Path(model.path)
    if not file.is_file():
        raise Problem(404, f"the file of model {model.id!r} is missing on the server")
    digest = current_digest(file, RecordedDigest(model.sha256, model.bytes, model.created_at))
    return serve_file(file, digest, if_none_match, filename=f"{_safe_name(model.name)}.pt")


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"


def serve_onnx(model: Model, settings: Settings, if_none_match: str | None) -> Response:
    """The model's ``.onnx`` file with the download rules of :func:`service.api.files.
    serve_file` (Range, ETag = its sha256, If-None-Match).

    Raises:
        Problem 409: the export is not ready (its state and what to do). 404: the file is
            missing on the server.
    """
    status = onnx_status(model, settings)
    state = status["state"]
    if state != EXPORT_READY:
        what = {"none": "has no ONNX export yet: POST /v1/models/{id}/export first "
                        "(`model.export(\"onnx\")` in the SDK)",
                EXPORTING: "is being exported to ONNX: retry when GET /v1/models/{id} says "
                           "onnx.state ready",
                EXPORT_FAILED: f"has no ONNX file: its export failed ({status['error']}); "
                               "export again to retry"}[state]
        raise Problem(409, f"model {model.id} {what.replace('{id}', model.id)}",
                      onnx_state=state)
    file = model_store(settings).onnx_path(model.id)
    info = status["info"] or {}
    if not file.is_file():
        raise Problem(404, f"the ONNX file of model {model.id!r} is missing on the server")
    recorded = datetime.fromisoformat(info["finished_at"]) if info.get("finished_at") \
        else model.created_at
    digest = current_digest(file, RecordedDigest(str(info.get("sha256", "")),
                                                 int(info.get("bytes", -1)), recorded))
    return serve_file(file, digest, if_none_match, filename=f"{_safe_name(model.name)}.onnx")


@router.delete("/{model_id}", status_code=204, operation_id="models-delete",
               responses={**_NOT_FOUND, 409: {"description": "a queued or running job uses it"}})
def delete_model(model: OwnedModel, session: SessionDep, settings: SettingsDep) -> Response:
    """Delete a model and its files (its ONNX export too). Finished jobs that started from it keep their results.

    Raises:
        409: a queued or running job starts from this model (cancel it first).
    """
    busy = session.scalar(select(Job.id).where(Job.model == model.path,
                                               Job.status.in_((JobStatus.QUEUED, *ACTIVE))))
    if busy is not None:
        raise Problem(409, f"model {model.id} is used by job {busy}, which has not finished",
                      job_id=busy)
    path = Path(model.path)
    onnx = model_store(settings).onnx_path(model.id)
    session.delete(model)
    session.commit()
    for file in (path, onnx, onnx.with_name(onnx.name + ".json")):
        file.unlink(missing_ok=True)
    return Response(status_code=204)


@publish_router.post(
    "/{job_id}/publish", status_code=202, response_model=ModelPublic,
    operation_id="jobs-publish",
    responses={200: {"description": "published before under this name: that model (it may "
                     "still be inspecting)", "model": ModelPublic},
               404: {"description": "no such job (or another user's job)"},
               409: {"description": "the job has not succeeded, has no weights/best.pt, or "
                                    "was published under another name"}},
)
async def publish_job(job: OwnedJob, body: PublishRequest, session: SessionDep,
                      settings: SettingsDep, request: Request, response: Response,
                      background: BackgroundTasks) -> ModelPublic:
    """Register a finished job's ``weights/best.pt`` as a model named ``name``.

    Answers at once (202) with the model ``inspecting``: the file is linked (or copied)
    into the model store, so the model outlives the job's folder, and inspected like an
    upload after the answer (:func:`_finish_publish`); poll ``GET /v1/models/{id}`` until
    ``state`` is ``ready`` (or ``failed``, with ``error``). ``source`` is ``job:<job id>``.

    Idempotent: publishing the job again with the same name answers 200 with the model it
    made (in whatever state, nothing inspected again); with another name, 409 naming that
    model. Two concurrent publishes make one model (a unique index: the second insert
    loses and answers with the first's model). A ``failed`` model is replaced by a new
    publish (a retry).

    Raises:
        409: the job has not succeeded, has no ``weights/best.pt``, or was published
            under another name.
    """
    source = f"job:{job.id}"
    for _ in range(3):
        done = _published_before(session, settings, job, source)
        if done is not None:
            if done.name != body.name:
                raise Problem(409, f"job {job.id} is published already, as model {done.id} "
                              f"({done.name!r})", model_id=done.id)
            response.status_code = 200
            response.headers["Location"] = f"/v1/models/{done.id}"
            return _public(done, settings)
        if job.status != JobStatus.SUCCEEDED:
            raise Problem(409, f"job {job.id} is {job.status}: only a succeeded job can be "
                          "published", status_now=job.status)
        best = request.app.state.store.resolve(job.id, "weights/best.pt")
        if best is None:
            raise Problem(409, f"job {job.id} has no weights/best.pt")
        added = await _add_published(session, settings, job, body.name, best)
        if added is None:  # a concurrent publish of this job won: answer with its model
            continue
        model, part = added
        background.add_task(_finish_publish, request.app.state.sessions, settings, model.id,
                            part)
        if settings.mlflow_tracking_uri:  # a version in MLflow's registry too, best effort
            background.add_task(_register_in_mlflow, request.app.state.store, job.id, body.name,
                                model.id, settings.mlflow_tracking_uri)
        response.headers["Location"] = f"/v1/models/{model.id}"
        return _public(model, settings)
    raise Problem(409, f"job {job.id} is being published by another request; retry")


def _published_before(session: Session, settings: Settings, job: Job, source: str) -> Model | None:
    """The model already published from ``job`` (``source``: ``job:<id>``), if any; a
    ``failed`` one is deleted first, with its file (a new publish retries it)."""
    done = session.scalar(select(Model).where(Model.source == source,
                                              Model.owner_id == job.owner_id))
    if done is not None and model_state(done, settings)[0] == FAILED:
        Path(done.path).unlink(missing_ok=True)  # a retry: the failed model goes
        session.delete(done)
        session.commit()
        done = None
    return done


async def _add_published(session: Session, settings: Settings, job: Job, name: str,
                         best: Path) -> tuple[Model, Path] | None:
    """Link (or copy) ``best`` into the model store's incoming file of a new model and
    commit its row, ``inspecting`` (placeholders until :func:`_finish_publish`).

    Returns:
        The model and its incoming file, or None when a concurrent publish of ``job`` committed first (the
        unique index on ``source``; this one's file is deleted).
    """
    store = model_store(settings)
    model_id = new_id("m")
    part = store.incoming(model_id)
    await anyio.to_thread.run_sync(_link_or_copy, best, part)
    model = Model(id=model_id, owner_id=job.owner_id, name=name, family="", size="",
                  nc=0, names={}, params=0, sha256="", bytes=part.stat().st_size,
                  format="", imgsz=None, source=f"job:{job.id}",
                  path=str(store.path(model_id)), state=INSPECTING)
    session.add(model)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        part.unlink(missing_ok=True)
        return None
    return model, part


def _register_in_mlflow(store: Any, job_id: str, name: str, model_id: str, uri: str) -> None:
    """The job's MLflow run (its ``mlflow.json``) registered as a version of ``name``; a
    job without a run or a server that is down is one warning (the publish stands)."""
    from service.mlflow_registry import RegistryError, register_version

    record = store.resolve(job_id, "mlflow.json")
    if record is None:
        log.warning("publish %s: job %s has no MLflow run; nothing registered in MLflow", model_id, job_id)
        return
    try:
        version = register_version(record, name, tracking_uri=uri,
                                   tags={"libreyolo.model_id": model_id, "libreyolo.job_id": job_id})
    except RegistryError as exc:
        log.warning("publish %s: %s", model_id, exc)
        return
    log.info("publish %s: MLflow model %r version %s", model_id, version["name"], version["version"])


def _link_or_copy(src: Path, dst: Path) -> None:
    """A hard link when the two folders share a filesystem, else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
