"""FastAPI dependencies as named types: ``SessionDep``, ``CurrentUser``, ``OwnedJob``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, TypeVar
from urllib.parse import urlsplit

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.api.problems import Problem, error_responses
from service.db.models import Job, User
from service.job_store import get_owned
from service.settings import Settings
from service.storage import ArtifactStore
from service.users import user_for_token

__all__ = ["SessionDep", "CurrentUser", "OwnedJob", "SettingsDep", "StoreDep", "TOKEN_COOKIE",
           "check_same_origin", "current_user", "owned_job", "OWNED_JOB_ERRORS"]

LOCAL_ADMIN = "local"
_Row = TypeVar("_Row")


# async: FastAPI runs a plain ``def`` dependency in the thread pool, a hop that costs more
# than these do (docs/architecture.md, "Hot reads")
async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_store(request: Request) -> ArtifactStore:
    return request.app.state.store


async def get_session(request: Request) -> AsyncIterator[Session]:
    """One session per request; routes commit their own unit of work. Opening one does no
    I/O; closing it hands its connection back to the pool."""
    with request.app.state.sessions() as session:
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[ArtifactStore, Depends(get_store)]
SessionDep = Annotated[Session, Depends(get_session)]

_UNAUTHORIZED = {"WWW-Authenticate": 'Bearer realm="libreyolo"'}
#: Cookie the sign-in page sets (HttpOnly, SameSite=Strict): the same token as the bearer one.
TOKEN_COOKIE = "libreyolo_token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Declares the bearer scheme in the OpenAPI document (Swagger UI's "Authorize" button);
#: :func:`current_user` reads the header itself, so its errors stay problem+json.
bearer_scheme = HTTPBearer(auto_error=False, scheme_name="bearer",
                           description="a token from `libreyolo-service token create`")


def check_same_origin(request: Request, settings: Settings) -> None:
    """CSRF guard of cookie-authenticated unsafe requests (POST, PUT, PATCH, DELETE).

    The cookie is ``SameSite=Strict`` already; on top of that the request must come from
    a page of this service: ``Sec-Fetch-Site`` (when the browser sends it) is
    ``same-origin``, and the ``Origin`` header (or, without it, the ``Referer``) names this
    host or one of ``settings.cors_origins``.

    Raises:
        Problem 403: cross-site request, or neither ``Origin`` nor ``Referer`` was sent.
    """
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        raise Problem(403, f"cross-site request refused (Sec-Fetch-Site: {site}); "
                      "cookie sign-in only works from this service's pages")
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin or origin == "null":
        raise Problem(403, "a cookie-authenticated POST needs an Origin or Referer header "
                      "(send 'Authorization: Bearer <token>' from scripts)")
    parts = urlsplit(origin)
    allowed = {o.rstrip("/") for o in settings.cors_origins}
    if parts.netloc != request.headers.get("host", "") and \
            f"{parts.scheme}://{parts.netloc}" not in allowed:
        raise Problem(403, f"cross-origin request from {parts.scheme}://{parts.netloc} refused")


def current_user(request: Request, session: SessionDep, settings: SettingsDep,
                 _scheme: Annotated[HTTPAuthorizationCredentials | None,
                                    Depends(bearer_scheme)] = None) -> User:
    """The user of the bearer token, or of the sign-in cookie of the web pages.

    The ``Authorization`` header wins when both are sent. A cookie-authenticated unsafe
    request must pass :func:`check_same_origin` (CSRF).

    Raises:
        Problem 401: no ``Authorization: Bearer <token>`` header nor sign-in cookie, or an
            unknown token.
        Problem 403: a cookie-authenticated POST from another origin.
    """
    authorization = request.headers.get("authorization")
    if authorization:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Problem(401, "Authorization header must be 'Bearer <token>'",
                          headers=_UNAUTHORIZED)
        user = user_for_token(session, token.strip())
        if user is None:
            raise Problem(401, "unknown or revoked token", headers=_UNAUTHORIZED)
        return _released(session, user)
    cookie = request.cookies.get(TOKEN_COOKIE)
    if cookie:
        if request.method not in SAFE_METHODS:
            check_same_origin(request, settings)
        user = user_for_token(session, cookie)
        if user is None:
            raise Problem(401, "unknown or revoked token: sign in again", headers=_UNAUTHORIZED)
        return _released(session, user)
    if not settings.require_token:
        user = session.scalar(select(User).where(User.name == LOCAL_ADMIN))
        if user is None:
            user = User(name=LOCAL_ADMIN, is_admin=True)
            session.add(user)
            session.commit()
        return user
    raise Problem(401, "missing bearer token: send 'Authorization: Bearer <token>' "
                  "(create one with `libreyolo-service token create`)", headers=_UNAUTHORIZED)


def _released(session: Session, row: _Row) -> _Row:
    """End the dependency's read (the row stays loaded) so the request holds no pooled
    connection while it waits for its next thread-pool hop: with hundreds of requests at
    once (SSE clients reconnecting), requests holding every connection while waiting for a
    thread, and threads waiting for a connection, deadlocked until the pool timed out."""
    session.commit()
    return row


CurrentUser = Annotated[User, Depends(current_user)]


def owned_job(job_id: str, user: CurrentUser, session: SessionDep) -> Job:
    """The job ``job_id`` if the user owns it (or is an admin): the one ownership check of
    every ``/v1/jobs/{job_id}...`` route and of the job page's fragments
    (:func:`service.job_store.get_owned`).

    Raises:
        Problem 401: as :func:`current_user`.
        Problem 404: no such job, or another user's job (the two are indistinguishable).
    """
    job = get_owned(session=session, job_id=job_id, user=user)
    if job is None:
        raise Problem(404, f"job {job_id!r} not found")
    return _released(session, job)


OwnedJob = Annotated[Job, Depends(owned_job)]
#: the OpenAPI ``responses`` of a route taking an :data:`OwnedJob`.
OWNED_JOB_ERRORS = error_responses({404: "no such job (or another user's job)"})
