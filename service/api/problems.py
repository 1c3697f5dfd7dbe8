"""Errors as RFC 9457 ``application/problem+json``.

Every error body has ``type``, ``title``, ``status`` and a ``detail`` that names the
field or thing; validation errors add ``field`` (dotted path) and ``errors`` (all of them).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

__all__ = ["Problem", "problem_response", "install_problem_handlers"]

PROBLEM_JSON = "application/problem+json"
_TITLES = {
    400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 409: "Conflict", 413: "Content Too Large",
    416: "Range Not Satisfiable", 422: "Unprocessable Content", 500: "Internal Server Error",
    503: "Service Unavailable",
}


class Problem(Exception):
    """Raise to answer with a problem+json body.

    Args:
        status: HTTP status code.
        detail: sentence naming the field or thing at fault.
        field: dotted path of the offending request field (422s), if any.
        headers: extra response headers (e.g. ``WWW-Authenticate``).
        **extra: more members of the problem object.
    """

    def __init__(self, status: int, detail: str, *, field: str | None = None,
                 headers: dict[str, str] | None = None, **extra: Any):
        super().__init__(detail)
        self.status, self.detail, self.field = status, detail, field
        self.headers, self.extra = headers or {}, extra


def problem_response(status: int, detail: str, *, instance: str | None = None,
                     headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    """A problem+json response."""
    body = {"type": "about:blank", "title": _TITLES.get(status, "Error"), "status": status,
            "detail": detail}
    if instance:
        body["instance"] = instance
    body.update({k: v for k, v in extra.items() if v is not None})
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM_JSON)


def _loc(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or ".".join(str(p) for p in loc)


def install_problem_handlers(app: FastAPI) -> None:
    """Answer :class:`Problem`, HTTP errors and request validation errors as problem+json."""

    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem) -> JSONResponse:
        return problem_response(exc.status, exc.detail, instance=request.url.path,
                                headers=exc.headers, field=exc.field, **exc.extra)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return problem_response(exc.status_code, detail, instance=request.url.path,
                                headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"field": _loc(tuple(e.get("loc", ()))), "message": e.get("msg", "")}
                  for e in exc.errors()]
        first = errors[0] if errors else {"field": "", "message": "invalid request"}
        detail = f"{first['field']}: {first['message']}" if first["field"] else first["message"]
        return problem_response(422, detail, instance=request.url.path, field=first["field"],
                                errors=errors)
