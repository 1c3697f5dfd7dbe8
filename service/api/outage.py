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

__all__ = ["install_outage_handler"]

log = logging.getLogger(__name__)


def install_outage_handler(app: FastAPI, retry_after_s: int) -> None:
    """Answer database and broker errors with 503 and ``Retry-After: retry_after_s``."""

    async def _outage(request: Request, exc: Exception) -> JSONResponse:
        down = what_is_down(exc)
        if down is None:  # an OperationalError that is not a lost connection, e.g.
            raise exc  # a bad statement: a real bug, left to the 500 handler
        log.warning("%s %s: the %s is unavailable (%s: %s)", request.method, request.url.path,
                    down, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        return problem_response(503, f"the {down} is unavailable right now; retry in "
                                f"{retry_after_s} s (nothing was lost)",
                                instance=request.url.path,
                                headers={"Retry-After": str(retry_after_s)})

    for exc_type in (*TRANSIENT_DB, *broker_errors()):
        app.add_exception_handler(exc_type, _outage)
