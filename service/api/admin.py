"""``/v1/admin/tokens``: an admin lists, creates and revokes API tokens (what
``libreyolo-service token list | create | revoke`` does on the database).

A revoked or expired token is refused by every API process within
:data:`~service.users.TOKEN_CACHE_S` (one second), and at once by the process that
revoked it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.api.deps import CurrentUser, SessionDep
from service.api.problems import Problem, error_responses
from service.db.models import Token, User
from service.users import check_user_name, create_user_token, list_tokens, revoke_token

__all__ = ["router"]

router = APIRouter(prefix="/v1/admin", tags=["admin"])

#: a user or token name: printable, no control characters
_NAME = r"^[^\x00-\x1f\x7f]+$"


class TokenPublic(BaseModel):
    """A token as the admin sees it (never the token itself: only its sha256 is kept)."""

    id: str
    user: str
    name: str
    created_at: datetime
    expires_at: datetime | None
    revoked: bool
    revoked_at: datetime | None
    state: Literal["active", "expired", "revoked"]


class TokensPage(BaseModel):
    data: list[TokenPublic]


class TokenCreate(BaseModel):
    """A new token for user ``user`` (created if new)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    user: str = Field(min_length=1, max_length=100, pattern=_NAME)
    admin: bool = Field(False, description="the user sees every job (an existing user is "
                        "made an admin; never demoted here)")
    name: str = Field("", max_length=100, pattern=r"^[^\x00-\x1f\x7f]*$",
                      description="what the token is for")
    expires_in_s: float | None = Field(None, gt=0, le=100 * 365 * 86400,
                                       description="seconds until it expires; null: never")

    _user_not_blank = field_validator("user")(check_user_name)


class TokenCreated(TokenPublic):
    token: str = Field(description="the bearer token, shown once")


def _admin(user: User) -> None:
    if not user.is_admin:
        raise Problem(403, "admin only: your token is not an admin's")


ADMIN_ERRORS = error_responses({403: "not an admin"})


@router.get("/tokens", response_model=TokensPage, operation_id="admin-tokens-list",
            responses={**ADMIN_ERRORS, **error_responses({404: "no such user"})})
def get_tokens(user: CurrentUser, session: SessionDep,
               of: Annotated[str | None, Query(alias="user", max_length=100,
                                               description="only this user's tokens")] = None
               ) -> TokensPage:
    """Every token, oldest first (``?user=`` for one user's), with its state."""
    _admin(user)
    try:
        return TokensPage(data=[TokenPublic(**t) for t in list_tokens(session, of)])
    except LookupError as exc:
        raise Problem(404, str(exc)) from None


@router.post("/tokens", status_code=201, response_model=TokenCreated,
             operation_id="admin-tokens-create", responses=ADMIN_ERRORS)
def post_token(body: TokenCreate, user: CurrentUser, session: SessionDep) -> TokenCreated:
    """Create a token (and the user when new); the token is in the answer, once."""
    _admin(user)
    _, token = create_user_token(session, name=body.user, admin=body.admin,
                                 token_name=body.name, expires_in_s=body.expires_in_s)
    session.commit()
    row: dict[str, Any] = next(t for t in list_tokens(session, body.user)[::-1])
    return TokenCreated(**row, token=token)


@router.post("/tokens/{token_id}/revoke", response_model=TokenPublic,
             operation_id="admin-tokens-revoke",
             responses={**ADMIN_ERRORS, **error_responses({404: "no such token"})})
def post_revoke(token_id: Annotated[str, PathParam(max_length=64)], user: CurrentUser,
                session: SessionDep, request: Request) -> TokenPublic:
    """Revoke a token (revoking it again is a no-op). This process refuses it at once,
    every other API process within a second."""
    _admin(user)
    try:
        revoke_token(session, token_id)
    except LookupError:
        raise Problem(404, f"token {token_id!r} not found") from None
    session.commit()
    row = session.get_one(Token, token_id)
    request.app.state.tokens.drop(row.token_sha256)
    owner = session.get_one(User, row.user_id).name
    return TokenPublic(**next(t for t in list_tokens(session, owner) if t["id"] == token_id))
