"""Bound a request before it costs anything: :class:`RequestGuard`.

Checked in this order, each before the next is spent on:

1. the headers: at most ``max_header_count`` of them and ``max_header_bytes`` in all
   (431); the path and query at most ``max_url_chars`` (414), with no NUL or other
   control character once percent-decoded (a path: 404, it names nothing; a query: 422);
2. a request with a body is authenticated before one byte of it is read (401; the same
   token rules as :func:`service.api.deps.authenticated_user`, so a route's own lookup
   then hits the token cache); only the sign-in form is exempt. A database outage during
   the token lookup is a 503 with ``Retry-After`` (:func:`service.api.outage.outage_response`;
   the app's exception handlers do not see a middleware's errors);
3. the body is capped per route (413 naming the cap and its setting): a dataset zip
   ``max_upload_bytes``, a weights file ``max_model_bytes``, a "Try it" image
   ``max_predict_bytes``, anything else (JSON, forms)
   ``max_json_bytes``. A ``Content-Length`` over the cap is refused at once; a body sent
   without one is counted as it arrives and cut at the cap.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote_to_bytes

from fastapi.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.outage import outage_response
from service.api.problems import Problem, problem_response

__all__ = ["BodyTooLarge", "RequestGuard", "body_cap"]

#: paths whose body is read before authentication (it carries the token)
UNAUTHENTICATED_BODIES = frozenset({"/signin"})
_CONTROL = bytes(range(32)) + b"\x7f"


class BodyTooLarge(StarletteHTTPException):
    """The body passed its route's cap (an HTTP exception, so FastAPI's body reader
    passes it on and the problem handlers answer 413)."""

    def __init__(self, cap: int, setting: str):
        super().__init__(413, f"body: larger than {cap} bytes ({setting})")


def body_cap(method: str, path: str, settings: Any) -> tuple[int, str]:
    """``(bytes, setting name)``: how large the body of this request may be."""
    if method == "POST" and path.rstrip("/") == "/v1/datasets":
        return settings.max_upload_bytes, "max_upload_bytes"
    if method == "POST" and path.rstrip("/") == "/v1/models":
        return settings.max_model_bytes, "max_model_bytes"
    if method == "POST" and path.rstrip("/") == "/v1/predict":
        return settings.max_predict_bytes, "max_predict_bytes"
    return settings.max_json_bytes, "max_json_bytes"


class RequestGuard:
    """ASGI middleware applying the checks of the module docstring.

    Args:
        app: the wrapped application.
        root: the FastAPI application (its ``state``: settings, sessions, tokens).
    """

    def __init__(self, app: ASGIApp, root: Any):
        self.app, self.root = app, root

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        settings = self.root.state.settings
        refusal = self._head_refusal(scope, settings)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        if not self._has_body(scope):
            await self.app(scope, receive, send)
            return
        cap, setting = body_cap(scope["method"], scope["path"], settings)
        try:
            length = int(dict(scope["headers"]).get(b"content-length", b"-1"))
        except ValueError:
            length = -1
        if scope["path"] not in UNAUTHENTICATED_BODIES:
            denied = await self._denied(scope, settings)
            if denied is not None:
                await denied(scope, receive, send)
                return
        if length > cap:
            await problem_response(413, BodyTooLarge(cap, setting).detail,
                                   instance=scope["path"])(scope, receive, send)
            return
        await self._capped(scope, receive, send, cap, setting)

    @staticmethod
    def _has_body(scope: Scope) -> bool:
        """Whether the request may have a body: not a GET, HEAD or OPTIONS, and a
        ``Content-Length`` other than 0 or a ``Transfer-Encoding``."""
        headers = dict(scope["headers"])
        return scope["method"] not in ("GET", "HEAD", "OPTIONS") and (
            headers.get(b"content-length", b"0") not in (b"0", b"") or
            b"transfer-encoding" in headers)

    async def _denied(self, scope: Scope, settings: Any) -> Any:
        """:meth:`_unauthenticated`; a database outage meanwhile is its 503 (the exception
        handlers never see a middleware's error), any other error is raised."""
        try:
            return await self._unauthenticated(scope, settings)
        except Exception as exc:  # the exception handlers never see a middleware's error
            denied = outage_response(exc, scope["method"], scope["path"],
                                     settings.retry_after_s)
            if denied is None:
                raise
            return denied

    async def _capped(self, scope: Scope, receive: Receive, send: Send, cap: int,
                      setting: str) -> None:
        """Run the app with its body counted: past ``cap`` bytes (the setting ``setting``)
        a 413, unless the answer has started already (then the error is raised)."""
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > cap:
                    raise BodyTooLarge(cap, setting)
            return message

        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BodyTooLarge as exc:
            if started:
                raise
            await problem_response(413, exc.detail, instance=scope["path"])(scope, receive, send)

    @staticmethod
    def _head_refusal(scope: Scope, settings: Any) -> Any:
        """The answer to a request whose headers or URL are out of bounds, or None."""
        headers = scope["headers"]
        size = sum(len(k) + len(v) + 4 for k, v in headers)
        if len(headers) > settings.max_header_count or size > settings.max_header_bytes:
            return problem_response(431, f"{len(headers)} headers of {size} bytes: at most "
                                    f"{settings.max_header_count} headers (max_header_count) "
                                    f"and {settings.max_header_bytes} bytes "
                                    "(max_header_bytes)")
        raw_path = scope.get("raw_path") or scope["path"].encode("utf-8", "surrogateescape")
        query = scope.get("query_string", b"")
        if len(raw_path) + len(query) > settings.max_url_chars:
            return problem_response(414, f"the URL has {len(raw_path) + len(query)} characters, "
                                    f"more than {settings.max_url_chars} (max_url_chars)")
        if any(c in _CONTROL for c in unquote_to_bytes(raw_path)):  # names nothing here
            return problem_response(404, "not found: the path of the URL holds a control "
                                    "character (NUL, newline, ESC...)")
        if any(c in _CONTROL for c in unquote_to_bytes(query.replace(b"+", b" "))):
            return problem_response(422, "query: a parameter holds a control character "
                                    "(NUL, newline, ESC...)", field="query")
        return None

    async def _unauthenticated(self, scope: Scope, settings: Any) -> Any:
        """The 401 (or 403) of a request with a body and no valid credentials, or None."""
        from service.api.deps import _request_token

        request = Request(scope)
        try:
            sent = _request_token(request, settings)
        except Problem as exc:
            return problem_response(exc.status, exc.detail, instance=scope["path"],
                                    headers=exc.headers)
        if sent is None:
            if not settings.require_token:
                return None
            return problem_response(401, "missing bearer token: send 'Authorization: Bearer "
                                    "<token>' (before the body is read)",
                                    instance=scope["path"],
                                    headers={"WWW-Authenticate": 'Bearer realm="libreyolo"'})
        state = self.root.state
        if state.tokens.get(sent[0]) is not None:
            return None

        def lookup() -> Any:
            with state.sessions() as session:
                return state.tokens.lookup(session, sent[0])

        if await run_in_threadpool(lookup) is None:
            return problem_response(401, sent[1], instance=scope["path"],
                                    headers={"WWW-Authenticate": 'Bearer realm="libreyolo"'})
        return None
