"""FastAPI dependencies as named types: ``SessionDep``, ``CurrentUser``, ``OwnedJob``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

import anyio
from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.api.problems import Problem, error_responses
from service.db.models import Job, User
from service.job_store import get_owned
from service.settings import Settings
from service.storage import ArtifactStore

__all__ = ["SessionDep", "CurrentUser", "OwnedJob", "SettingsDep", "StoreDep", "TOKEN_COOKIE",
           "authenticated_user", "check_same_origin", "current_user", "owned_job",
           "owned_or_404", "read_in_thread", "OWNED_JOB_ERRORS"]

LOCAL_ADMIN = "local"
_Row = TypeVar("_Row")
_T = TypeVar("_T")


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


async def read_in_thread(request: Request, fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` in a worker thread, at most ``READ_THREADS`` at once per process
    (``app.state.read_limiter``): the one thread-pool hop of a hot read (the ownership
    check and every statement in one function, on a session of its own)."""
    return await anyio.to_thread.run_sync(fn, *args, limiter=request.app.state.read_limiter)


def _request_token(request: Request, settings: Settings) -> tuple[str, str] | None:
    """``(token, message if unknown)`` of the request's ``Authorization`` header or sign-in
    cookie; None when it sends neither.

    Raises:
        Problem 401: an ``Authorization`` header that is not ``Bearer <token>``.
        Problem 403: a cookie-authenticated unsafe request from another origin.
    """
    authorization = request.headers.get("authorization")
    if authorization:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Problem(401, "Authorization header must be 'Bearer <token>'",
                          headers=_UNAUTHORIZED)
        return token.strip(), "unknown or revoked token"
    cookie = request.cookies.get(TOKEN_COOKIE)
    if cookie:
        if request.method not in SAFE_METHODS:
            check_same_origin(request, settings)
        return cookie, "unknown or revoked token: sign in again"
    return None


def current_user(request: Request, session: Session, settings: Settings) -> User:
    """The user of the bearer token, or of the sign-in cookie of the web pages (the
    pages call it; API routes take :data:`CurrentUser`, which runs it in the thread pool
    only when the token is not in the process's :class:`~service.users.TokenCache`).

    The ``Authorization`` header wins when both are sent. A cookie-authenticated unsafe
    request must pass :func:`check_same_origin` (CSRF). A token is trusted for up to
    :data:`~service.users.TOKEN_CACHE_S` seconds after it was looked up, so a revoked
    token is refused within that.

    Raises:
        Problem 401: no ``Authorization: Bearer <token>`` header nor sign-in cookie, or an
            unknown token.
        Problem 403: a cookie-authenticated POST from another origin.
    """
    sent = _request_token(request, settings)
    if sent is not None:
        user = request.app.state.tokens.lookup(session, sent[0])
        if user is None:
            raise Problem(401, sent[1], headers=_UNAUTHORIZED)
        return _released(session, user)
    if not settings.require_token:
        user = session.scalar(select(User).where(User.name == LOCAL_ADMIN))
        if user is None:
            user = User(name=LOCAL_ADMIN, is_admin=True)
            session.add(user)
            session.commit()
        return user
    raise Problem(401, "missing bearer token: send 'Authorization: Bearer <token>' "
                  "(create one with `libreyolo-service token create --name NAME`)", headers=_UNAUTHORIZED)


def _current_user_in_own_session(request: Request, settings: Settings) -> User:
    with request.app.state.sessions() as session:
        return current_user(request, session, settings)


async def authenticated_user(request: Request, settings: SettingsDep,
                             _scheme: Annotated[HTTPAuthorizationCredentials | None,
                                                Depends(bearer_scheme)] = None) -> User:
    """:func:`current_user` as the dependency of the API routes (:data:`CurrentUser`).

    A token in the process's :class:`~service.users.TokenCache` costs no statement and no
    thread-pool hop; otherwise :func:`current_user` runs in the thread pool on a session
    of its own, closed before the route reads (one pooled connection at a time).

    Raises:
        Problem 401, 403: as :func:`current_user`.
    """
    sent = _request_token(request, settings)
    if sent is not None:
        user = request.app.state.tokens.get(sent[0])
        if user is not None:
            return user
    return await run_in_threadpool(_current_user_in_own_session, request, settings)


def _released(session: Session, row: _Row) -> _Row:
    """End the dependency's read (the row stays loaded) so the request holds no pooled
    connection while it waits for its next thread-pool hop: with hundreds of requests at
    once (SSE clients reconnecting), requests holding every connection while waiting for a
    thread, and threads waiting for a connection, deadlocked until the pool timed out."""
    session.commit()
    return row


CurrentUser = Annotated[User, Depends(authenticated_user)]


def owned_or_404(session: Session, job_id: str, user: User) -> Job:
    """The job ``job_id`` if ``user`` owns it (or is an admin): the one ownership check of
    every ``/v1/jobs/{job_id}...`` route and of the job page's fragments
    (:func:`service.job_store.get_owned`).

    Raises:
        Problem 404: no such job, or another user's job (the two are indistinguishable).
    """
    job = get_owned(session=session, job_id=job_id, user=user)
    if job is None:
        raise Problem(404, f"job {job_id!r} not found")
    return job


def owned_job(job_id: str, user: CurrentUser, session: SessionDep) -> Job:
    """:func:`owned_or_404` as a dependency (:data:`OwnedJob`); the hot reads call
    :func:`owned_or_404` inside their one thread-pool hop instead.

    Raises:
        Problem 401: as :func:`current_user`.
        Problem 404: no such job, or another user's job.
    """
    return _released(session, owned_or_404(session, job_id, user))


OwnedJob = Annotated[Job, Depends(owned_job)]
#: the OpenAPI ``responses`` of a route taking an :data:`OwnedJob`.
OWNED_JOB_ERRORS = error_responses({404: "no such job (or another user's job)"})
