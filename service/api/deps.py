"""FastAPI dependencies as named types: ``SessionDep``, ``CurrentUser``, ``OwnedJob``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Header, Request
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.api.problems import Problem
from service.db.models import Job, User
from service.ops import user_for_token
from service.settings import Settings
from service.storage import ArtifactStore

__all__ = ["SessionDep", "CurrentUser", "OwnedJob", "SettingsDep", "StoreDep"]

LOCAL_ADMIN = "local"


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_store(request: Request) -> ArtifactStore:
    return request.app.state.store


def get_session(request: Request) -> Iterator[Session]:
    """One session per request; routes commit their own unit of work."""
    with request.app.state.sessions() as session:
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[ArtifactStore, Depends(get_store)]
SessionDep = Annotated[Session, Depends(get_session)]

_UNAUTHORIZED = {"WWW-Authenticate": 'Bearer realm="libreyolo"'}


def current_user(session: SessionDep, settings: SettingsDep,
                 authorization: Annotated[str | None, Header()] = None) -> User:
    """The user of the bearer token.

    Raises:
        Problem 401: no ``Authorization: Bearer <token>`` header, or an unknown token.
    """
    if authorization:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Problem(401, "Authorization header must be 'Bearer <token>'",
                          headers=_UNAUTHORIZED)
        user = user_for_token(session, token.strip())
        if user is None:
            raise Problem(401, "unknown or revoked token", headers=_UNAUTHORIZED)
        return user
    if not settings.require_token:
        user = session.scalar(select(User).where(User.name == LOCAL_ADMIN))
        if user is None:
            user = User(name=LOCAL_ADMIN, is_admin=True)
            session.add(user)
            session.commit()
        return user
    raise Problem(401, "missing bearer token: send 'Authorization: Bearer <token>' "
                  "(create one with `libreyolo-service token create`)", headers=_UNAUTHORIZED)


CurrentUser = Annotated[User, Depends(current_user)]


def owned_job(job_id: str, user: CurrentUser, session: SessionDep) -> Job:
    """The job ``job_id`` if the user owns it (or is an admin).

    Raises:
        Problem 404: no such job, or another user's job (the two are indistinguishable).
    """
    job = session.get(Job, job_id)
    if job is None or (job.owner_id != user.id and not user.is_admin):
        raise Problem(404, f"job {job_id!r} not found")
    return job


OwnedJob = Annotated[Job, Depends(owned_job)]
