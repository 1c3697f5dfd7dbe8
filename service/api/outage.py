"""The API's answer to an infrastructure outage: 503 with ``Retry-After``.

A request that meets a database or broker error (:func:`service.outage.what_is_down`)
is answered ``503 Service Unavailable`` (problem+json naming what is down) with
``Retry-After`` seconds, never a 500: clients (the SDK) retry a 503, and nothing the
caller sent was wrong.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from service.api.problems import problem_response
from service.outage import TRANSIENT_DB, broker_errors, what_is_down

__all__ = ["install_outage_handler", "outage_response"]

log = logging.getLogger(__name__)


def outage_response(exc: BaseException, method: str, path: str,
                    retry_after_s: int) -> JSONResponse | None:
    """The 503 (problem+json, ``Retry-After: retry_after_s``) answering ``exc`` when it is a
    database or broker outage (:func:`service.outage.what_is_down`), else None (a real bug,
    left to the 500 handler). Also used by middleware (:mod:`service.api.guard`), whose
    errors the app's exception handlers never see."""
    down = what_is_down(exc)
    if down is None:
        return None
    log.warning("%s %s: the %s is unavailable (%s: %s)", method, path, down,
                type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
    return problem_response(503, f"the {down} is unavailable right now; retry in "
                            f"{retry_after_s} s (nothing was lost)", instance=path,
                            headers={"Retry-After": str(retry_after_s)})


def install_outage_handler(app: FastAPI, retry_after_s: int) -> None:
    """Answer database and broker errors with 503 and ``Retry-After: retry_after_s``."""

    async def _outage(request: Request, exc: Exception) -> JSONResponse:
        answer = outage_response(exc, request.method, request.url.path, retry_after_s)
        if answer is None:  # an OperationalError that is not a lost connection, e.g.
            raise exc  # a bad statement: a real bug, left to the 500 handler
        return answer

    for exc_type in (*TRANSIENT_DB, *broker_errors()):
        app.add_exception_handler(exc_type, _outage)
