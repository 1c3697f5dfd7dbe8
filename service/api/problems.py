"""Errors as RFC 9457 ``application/problem+json``.

Every error body has ``type``, ``title``, ``status`` and a ``detail`` that names the
field or thing; validation errors add ``field`` (dotted path) and ``errors`` (all of them).

The OpenAPI document says so too: :func:`error_responses` gives a router's ``responses=``
entries (status -> description) and :func:`document_problems` (run by the app's
``openapi()``) rewrites every 4xx/5xx response of every operation to
``application/problem+json`` with the :class:`ProblemDetails` schema, adds the 401 of
operations that need a token and the 422 of operations that take input. A new router only
lists its own error statuses with :func:`error_responses`.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.api.methods import allowed_methods

__all__ = ["Problem", "ProblemDetails", "problem_response", "install_problem_handlers",
           "error_responses", "document_problems", "PROBLEM_JSON"]

PROBLEM_JSON = "application/problem+json"
_TITLES = {
    400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 409: "Conflict", 413: "Content Too Large",
    416: "Range Not Satisfiable", 422: "Unprocessable Content", 500: "Internal Server Error",
    503: "Service Unavailable",
}


class FieldError(BaseModel):
    field: str = Field(description="dotted path of the request field, e.g. params.epochs")
    message: str


class ProblemDetails(BaseModel):
    """An error (RFC 9457 problem details), sent as ``application/problem+json``."""

    model_config = ConfigDict(extra="allow", title="Problem")

    type: str = Field("about:blank", description="always about:blank: the status says it")
    title: str = Field(description="the status' phrase, e.g. Unprocessable Content")
    status: int = Field(description="the HTTP status code")
    detail: str = Field(description="what is wrong, naming the field or thing")
    instance: str | None = Field(None, description="the request path")
    field: str | None = Field(None, description="dotted path of the offending request field "
                              "(422s), e.g. params.epochs")
    errors: list[FieldError] | None = Field(None, description="every invalid field (request "
                                            "validation 422s)")
    value: Any = Field(None, description="the rejected value, when there is one")
    allowed: list[Any] | None = Field(None, description="the valid values, when they are few")


class Problem(Exception):
    """Raise to answer with a problem+json body.

    Args:
        status: HTTP status code.
        detail: sentence naming the field or thing at fault.
        field: dotted path of the offending request field (422s), if any.
        headers: extra response headers (e.g. ``WWW-Authenticate``).
        **extra: more members of the problem object. ``allowed`` must be a list of the
            valid values (anything else is dropped: the detail says it in words).
    """

    def __init__(self, status: int, detail: str, *, field: str | None = None,
                 headers: dict[str, str] | None = None, **extra: Any):
        super().__init__(detail)
        self.status, self.detail, self.field = status, detail, field
        if not isinstance(extra.get("allowed"), list | tuple):
            extra.pop("allowed", None)
        self.headers, self.extra = headers or {}, extra


def _json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by its text (``"nan"``, ``"inf"``):
    an error that echoes the client's bad number must still be valid JSON (RFC 8259 has no
    NaN or Infinity), or the answer to a 422 would itself fail with a 500."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def problem_response(status: int, detail: str, *, instance: str | None = None,
                     headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    """A problem+json response (non-finite numbers echoed from the request become text)."""
    body = {"type": "about:blank", "title": _TITLES.get(status, "Error"), "status": status,
            "detail": detail}
    if instance:
        body["instance"] = instance
    body.update({k: _json_safe(v) for k, v in extra.items() if v is not None})
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
        headers = dict(getattr(exc, "headers", None) or {})
        methods = allowed_methods(request.app, request.scope) if exc.status_code == 405 else []
        if methods:  # Starlette names only the first matching route's methods
            headers["Allow"] = ", ".join(methods)
            detail = f"{request.method} is not allowed on {request.url.path}; use " \
                     f"{', '.join(m for m in methods if m not in ('HEAD', 'OPTIONS'))}"
        return problem_response(exc.status_code, detail, instance=request.url.path,
                                headers=headers or None)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        raw = exc.errors()
        if raw and raw[0].get("type") == "json_invalid":
            where = raw[0].get("loc", ("body", None))[-1]
            why = (raw[0].get("ctx") or {}).get("error")
            at = f" (at character {where}{': ' + why if why else ''})" \
                if isinstance(where, int) else ""
            return problem_response(422, f"the body is not valid JSON{at}",
                                    instance=request.url.path)
        errors = [{"field": _loc(tuple(e.get("loc", ()))), "message": e.get("msg", "")}
                  for e in raw]
        first = errors[0] if errors else {"field": "", "message": "invalid request"}
        detail = f"{first['field']}: {first['message']}" if first["field"] else first["message"]
        return problem_response(422, detail, instance=request.url.path, field=first["field"],
                                errors=errors)


def error_responses(descriptions: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries of a route's error statuses, documented as problem+json.

    Args:
        descriptions: status -> when it happens, e.g. ``{404: "no such model"}``.

    Returns:
        A dict for ``@router.get(..., responses=error_responses({...}))``; merge it with
        success entries (``{**error_responses(...), 200: {...}}``).
    """
    return {code: {"description": text, "model": ProblemDetails}
            for code, text in descriptions.items()}


_PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
_STANDARD = {
    400: "the body cannot be read (not UTF-8 text)",
    401: "missing, malformed or unknown bearer token",
    422: "a request field is invalid; the problem names it in `field`",
}


def document_problems(openapi: dict[str, Any]) -> dict[str, Any]:
    """Make the OpenAPI document say what errors really look like (in place).

    Every 4xx/5xx response of every operation gets the ``application/problem+json``
    content with the ``Problem`` schema (FastAPI documents them as ``application/json``
    and its own ``HTTPValidationError``). Operations with a security requirement get a
    401; operations with parameters or a request body get a 422; a JSON body, a 400
    (FastAPI's answer to bytes that are not text).

    Returns:
        ``openapi``, changed.
    """
    schemas = openapi.setdefault("components", {}).setdefault("schemas", {})
    problem = ProblemDetails.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, sub in problem.pop("$defs", {}).items():
        schemas.setdefault(name, sub)
    schemas["Problem"] = problem
    for path_item in openapi.get("paths", {}).values():
        for op in path_item.values():
            if isinstance(op, dict) and "responses" in op:
                _document_operation(op)
    for unused in ("HTTPValidationError", "ValidationError", "ProblemDetails"):
        schemas.pop(unused, None)
    return openapi


def _document_operation(op: dict[str, Any]) -> None:
    """:func:`document_problems` for one operation's ``responses`` (in place)."""
    responses = op["responses"]
    if op.get("security"):
        responses.setdefault("401", {"description": _STANDARD[401]})
    if op.get("parameters") or op.get("requestBody"):
        responses.setdefault("422", {"description": _STANDARD[422]})
    if "application/json" in op.get("requestBody", {}).get("content", {}):
        responses.setdefault("400", {"description": _STANDARD[400]})
    for code, resp in responses.items():
        if code[0] in "45":
            if resp.get("description") == "Validation Error":
                resp["description"] = _STANDARD[422]
            resp["content"] = {PROBLEM_JSON: {"schema": _PROBLEM_REF}}
