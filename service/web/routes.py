"""Routes of the browser pages and the HTML fragments their scripts refresh.

Pages: ``/signin``, ``/jobs``, ``/jobs/{id}``, ``/datasets``. Fragments (for the page
scripts): ``/web/jobs/rows``, ``/web/jobs/{id}/summary``; ``/web/params`` turns the
submit form's YAML into JSON. The pages read the database directly (view models:
:mod:`service.web.views`); what they change (submit, cancel) goes through the ``/v1`` API,
authenticated by the sign-in cookie.
"""

from __future__ import annotations

import functools
import hashlib
import json
import typing
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, urlencode

import yaml
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy import select

from libreyolo_core.models.registry import list_models
from service import job_store
from service.api.datasets import dataset_public
from service.api.deps import (
    TOKEN_COOKIE,
    CurrentUser,
    OwnedJob,
    SessionDep,
    SettingsDep,
    check_same_origin,
    current_user,
)
from service.api.problems import Problem
from service.api.schemas import JobKind
from service.api.submit_rules import GPU_COUNTS
from service.db.models import Dataset, User
from service.lifecycle import TERMINAL, JobStatus
from service.users import user_for_token, visible_to
from service.web.formatting import fmt_age, fmt_bytes, fmt_duration, fmt_metric, iso
from service.web.views import prefill, rows_context, summary_context

__all__ = ["router", "PAGE_CSP", "render", "page_user", "to_signin", "base_context"]

router = APIRouter(include_in_schema=False)

#: Sent on every page and fragment: scripts, styles, fetches and SSE from this origin only.
#: Sent on every page and fragment: scripts, styles, fetches and SSE from this origin only.
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": PAGE_CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
#: the jobs filters: every status, every kind.
STATUS_FILTERS = tuple(s.value for s in JobStatus)
KIND_FILTERS = typing.get_args(JobKind)
COOKIE_MAX_AGE_S = 14 * 24 * 3600
TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
STATIC_DIR = Path(__file__).resolve().parent / "static"


@functools.lru_cache(maxsize=1)
def _asset_version() -> str:
    digest = hashlib.sha256()
    for path in sorted(STATIC_DIR.iterdir()):
        if path.is_file():
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:10]


def _static_url(name: str) -> str:
    return f"/web/static/{name}?v={_asset_version()}"


@functools.lru_cache(maxsize=1)
def _templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(TEMPLATES_DIR))
    env = templates.env
    env.globals["static"] = _static_url
    env.filters["duration"] = fmt_duration
    env.filters["age"] = fmt_age
    env.filters["bytes"] = fmt_bytes
    env.filters["metric"] = fmt_metric
    env.filters["iso"] = iso
    return templates


def render(request: Request, name: str, context: dict[str, Any],
           status_code: int = 200) -> HTMLResponse:
    response = _templates().TemplateResponse(request, name, context, status_code=status_code)
    response.headers.update(SECURITY_HEADERS)
    return response


def page_user(request: Request, session: SessionDep, settings: SettingsDep) -> User | None:
    """The signed-in user of a page request (cookie or bearer header), None when anonymous.

    Only used by GET routes, so the CSRF guard of :func:`current_user` never triggers.
    """
    try:
        return current_user(request, session, settings)
    except Problem as exc:
        if exc.status == 401:
            return None
        raise


def to_signin(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse("/signin?" + urlencode({"next": target}), status_code=303)


def _safe_next(value: str | None) -> str:
    """A local path to go to after sign-in (never another host: ``//evil``, ``/\\evil``)."""
    if not value or not value.startswith("/") or value.startswith(("//", "/\\")):
        return "/jobs"
    return value


def base_context(request: Request, user: User | None, nav: str) -> dict[str, Any]:
    return {"user": user, "nav": nav,
            "cookie_session": bool(request.cookies.get(TOKEN_COOKIE))}


@router.get("/")
def home() -> RedirectResponse:
    """The jobs page."""
    return RedirectResponse("/jobs", status_code=303)


@router.get("/signin", response_class=HTMLResponse)
def signin_page(request: Request, session: SessionDep, settings: SettingsDep,
                next: Annotated[str | None, Query()] = None) -> Response:
    """Sign-in form: paste an API token (``libreyolo-service token create``)."""
    user = page_user(request, session, settings)
    if user is not None and request.cookies.get(TOKEN_COOKIE):
        return RedirectResponse(_safe_next(next), status_code=303)
    return render(request, "signin.html", {**base_context(request, None, "signin"),
                                           "next": _safe_next(next), "error": None})


@router.post("/signin", response_class=HTMLResponse)
async def signin(request: Request, session: SessionDep, settings: SettingsDep) -> Response:
    """Check the pasted token and keep it in an HttpOnly, SameSite=Strict cookie.

    Form fields: ``token``, ``next`` (a local path to go to). A bad token re-renders the
    form with the error next to the field (401). Cross-origin posts are refused (403).
    """
    check_same_origin(request, settings)
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    token = (form.get("token") or [""])[0].strip()
    target = _safe_next((form.get("next") or [""])[0])
    user = user_for_token(session, token) if token else None
    if user is None:
        error = "unknown or revoked token" if token else "paste your API token"
        return render(request, "signin.html", {**base_context(request, None, "signin"),
                                               "next": target, "error": error},
                      status_code=401)
    response = RedirectResponse(target, status_code=303)
    secure = request.url.scheme == "https" or \
        request.headers.get("x-forwarded-proto", "").split(",")[0].strip() == "https"
    response.set_cookie(TOKEN_COOKIE, token, max_age=COOKIE_MAX_AGE_S, path="/",
                        httponly=True, samesite="strict", secure=secure)
    return response


@router.post("/signout")
def signout(request: Request, settings: SettingsDep) -> RedirectResponse:
    """Forget the sign-in cookie; back to the sign-in page."""
    check_same_origin(request, settings)
    response = RedirectResponse("/signin", status_code=303)
    response.delete_cookie(TOKEN_COOKIE, path="/", httponly=True, samesite="strict")
    return response


@router.get("/jobs", response_class=HTMLResponse)
def jobs_page(request: Request, session: SessionDep, settings: SettingsDep,
              status: Annotated[str | None, Query()] = None,
              kind: Annotated[str | None, Query()] = None,
              before: Annotated[str | None, Query()] = None,
              train_from: Annotated[str | None, Query()] = None) -> Response:
    """Your jobs (filters by status and kind, auto-refresh) and the submit form
    (``?train_from=<tune job id>``: pre-filled with that tune's recommended settings)."""
    user = page_user(request, session, settings)
    if user is None:
        return to_signin(request)
    datasets = _datasets(session, user)
    ctx = rows_context(session, user, status if status in STATUS_FILTERS else None,
                       kind if kind in KIND_FILTERS else None, before, settings)
    return render(request, "jobs.html", {
        **base_context(request, user, "jobs"), **ctx, "statuses": STATUS_FILTERS, "kinds": KIND_FILTERS,
        "models": list_models(), "datasets": datasets, "gpu_choices": GPU_COUNTS,
        "default_gpus": settings.default_gpus, "max_nodes": settings.max_nodes,
        "before": before,
        "prefill": prefill(session, settings, user, train_from)})


@router.get("/web/jobs/rows", response_class=HTMLResponse)
def jobs_rows(request: Request, session: SessionDep, settings: SettingsDep,
              status: Annotated[str | None, Query()] = None,
              kind: Annotated[str | None, Query()] = None) -> Response:
    """The ``<tbody>`` rows of the jobs table (the page's auto-refresh).

    Raises:
        401: not signed in (the script then goes to the sign-in page).
    """
    user = current_user(request, session, settings)
    ctx = rows_context(session, user, status if status in STATUS_FILTERS else None,
                       kind if kind in KIND_FILTERS else None, None, settings)
    return render(request, "_job_rows.html", ctx)


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(job_id: str, request: Request, session: SessionDep, settings: SettingsDep
             ) -> Response:
    """One job: live log (SSE), loss and mAP curves, result, verdict, artifacts, cancel."""
    user = page_user(request, session, settings)
    if user is None:
        return to_signin(request)
    job = job_store.get_owned(session=session, job_id=job_id, user=user)
    if job is None:
        return render(request, "error.html", {
            **base_context(request, user, "jobs"), "title": "Job not found",
            "message": f"There is no job {job_id} among your jobs."}, status_code=404)
    ctx = summary_context(request, session, user, job)
    return render(request, "job.html", {**base_context(request, user, "jobs"), **ctx,
                                        "terminal": job.status in TERMINAL})


@router.get("/web/jobs/{job_id}/summary", response_class=HTMLResponse)
def job_summary(job: OwnedJob, user: CurrentUser, request: Request, session: SessionDep
                ) -> Response:
    """The job page's summary panel (status, result, verdict, error, artifacts) as HTML.

    Raises:
        401: not signed in. 404: no such job, or another user's (:data:`OwnedJob`).
    """
    response = render(request, "_job_summary.html",
                      summary_context(request, session, user, job))
    response.headers["X-Job-Status"] = job.status
    return response


@router.get("/datasets", response_class=HTMLResponse)
def datasets_page(request: Request, session: SessionDep, settings: SettingsDep) -> Response:
    """Your datasets with their scan reports (images, boxes, classes, each defect kind)."""
    user = page_user(request, session, settings)
    if user is None:
        return to_signin(request)
    datasets = [dataset_public(d, settings) for d in _datasets(session, user)]
    return render(request, "datasets.html", {**base_context(request, user, "datasets"),
                                             "datasets": datasets})


def _datasets(session: SessionDep, user: User) -> list[Dataset]:
    """The user's datasets (an admin's: everyone's), newest first."""
    return list(session.scalars(visible_to(select(Dataset).order_by(Dataset.id.desc()),
                                           Dataset.owner_id, user)))


@router.post("/web/params")
async def parse_params(request: Request, session: SessionDep, settings: SettingsDep
                       ) -> JSONResponse:
    """Parse the submit form's advanced parameters (YAML, ``safe_load``) into JSON.

    Body: ``{"yaml": "<text>"}``. Returns ``{"params": {...}}``; the page then submits the
    job to ``POST /v1/jobs``, which validates every key.

    Raises:
        422: the text is not YAML, or not a mapping of ``key: value`` (``field: params``).
    """
    current_user(request, session, settings)
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        raise Problem(422, "body: not JSON", field="body") from None
    text = body.get("yaml", "") if isinstance(body, dict) else ""
    if not isinstance(text, str):
        raise Problem(422, "yaml: must be a string", field="params")
    try:
        value = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise Problem(422, f"params: not valid YAML{where}: {problem}", field="params") from None
    if value is None:
        value = {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise Problem(422, "params: write one 'key: value' per line (a YAML mapping)",
                      field="params")
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        raise Problem(422, "params: values must be numbers, strings, booleans or lists",
                      field="params") from None
    return JSONResponse({"params": value})
