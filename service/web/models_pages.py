"""The models pages: ``/models`` (your registered weights) and ``/models/{id}`` (one model,
download, ONNX export and delete). Deleting goes through ``DELETE /v1/models/{id}`` (sign-in cookie)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy import select

from service.api.deps import SessionDep, SettingsDep
from service.api.model_refs import model_state
from service.db.models import Job, Model
from service.model_export import onnx_status
from service.users import owns, visible_to
from service.web.routes import base_context, page_user, render, to_signin

__all__ = ["router"]

router = APIRouter(include_in_schema=False)


@router.get("/models", response_class=HTMLResponse)
def models_page(request: Request, session: SessionDep, settings: SettingsDep) -> Response:
    """Your models (admins: everyone's), newest first: family, classes, size, source; a
    model a publish still inspects says so (or why it failed)."""
    user = page_user(request, session, settings)
    if user is None:
        return to_signin(request)
    stmt = visible_to(select(Model).order_by(Model.id.desc()), Model.owner_id, user)
    models = list(session.scalars(stmt))
    return render(request, "models.html", {**base_context(request, user, "models"),
                                           "models": models,
                                           "states": {m.id: model_state(m, settings)
                                                      for m in models}})


@router.get("/models/{model_id}", response_class=HTMLResponse)
def model_page(model_id: str, request: Request, session: SessionDep, settings: SettingsDep
               ) -> Response:
    """One model: what the service read from the file, its ONNX export (the button, or
    the download with the check figure), its jobs, download and delete."""
    user = page_user(request, session, settings)
    if user is None:
        return to_signin(request)
    model = session.get(Model, model_id)
    if model is None or not owns(user, model.owner_id):
        return render(request, "error.html", {
            **base_context(request, user, "models"), "title": "Model not found",
            "message": f"There is no model {model_id} among your models."}, status_code=404)
    jobs = list(session.scalars(select(Job).where(Job.model == model.path)
                                .order_by(Job.id.desc()).limit(50)))
    source_job = model.source.removeprefix("job:") if model.source.startswith("job:") else None
    return render(request, "model.html", {**base_context(request, user, "models"),
                                          "model": model, "jobs": jobs,
                                          "source_job": source_job,
                                          "state": model_state(model, settings),
                                          "onnx": onnx_status(model, settings)})
