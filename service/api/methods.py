"""HTTP methods of a path: the ``Allow`` header of 405s and of ``OPTIONS`` answers.

FastAPI makes one route per method, and Starlette's 405 names only the first matching
route's methods; :func:`allowed_methods` gives the resource's methods, and
:class:`OptionsMiddleware` answers ``OPTIONS`` (RFC 9110 §9.3.7) with them.
"""

from __future__ import annotations

from typing import Any

from starlette.routing import Match, Mount, compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["allowed_methods", "OptionsMiddleware"]

_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(app: Any, scope: Scope) -> list[str]:
    """The methods of the resource at ``scope["path"]``, sorted, with ``OPTIONS``.

    The OpenAPI document decides for API paths: a literal path (``/v1/datasets/register``)
    wins over a template that also matches it (``/v1/datasets/{dataset_id}``). Other
    paths (the web pages) ask every route (``BaseRoute.matches``, which also sees into
    FastAPI's included routers) which methods it takes.

    Args:
        app: the FastAPI application.
        scope: an ASGI HTTP scope (``path`` is read).

    Returns:
        Upper-case method names, e.g. ``["GET", "OPTIONS", "POST"]``; empty when nothing
        has this path (the caller answers 404).
    """
    path = scope["path"]
    documented = app.openapi().get("paths", {})
    if path in documented:
        found = [documented[path]]
    else:
        found = [item for template, item in documented.items()
                 if "{" in template and compile_path(template)[0].fullmatch(path)]
    methods = {m.upper() for item in found for m in item if m.upper() in _METHODS}
    if not found:
        routes = [r for r in app.routes if not isinstance(r, Mount)]
        methods = {m for m in _METHODS
                   if any(r.matches({**scope, "method": m})[0] is Match.FULL for r in routes)}
    return sorted(methods | {"OPTIONS"}) if methods else []


class OptionsMiddleware:
    """Answer ``OPTIONS`` on a known path with ``204`` and ``Allow: <its methods>``.

    CORS preflights (``Access-Control-Request-Method``) are left to the CORS middleware,
    which runs outside this one; an unknown path falls through to the 404.
    """

    def __init__(self, app: ASGIApp, root: Any):
        self.app, self.root = app, root

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "OPTIONS":
            await self.app(scope, receive, send)
            return
        methods = allowed_methods(self.root, scope)
        if not methods:
            await self.app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 204,
                    "headers": [(b"allow", ", ".join(methods).encode())]})
        await send({"type": "http.response.body", "body": b""})
