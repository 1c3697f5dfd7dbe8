"""Exceptions of the SDK, catchable at every level::

    LibreYOLOError                  anything this SDK raises on purpose
      APIError(status_code, detail, problem)   the service answered with an error
        AuthError                   401 / 403: missing, unknown or revoked token
        NotFound                    404: no such job, dataset or artifact (or not yours)
        Conflict                    409: e.g. cancelling a finished job, reused Idempotency-Key
        ValidationError(field)      422: the field at fault, e.g. ``params.imgsz``
        ServiceUnavailable          503 / connection refused / timeouts, after the retries
      JobError(job)                 a job ended without success
        JobFailed(error, log_tail)  status ``failed``; carries the engine's last log lines
        JobCancelled                status ``cancelled``
      ChecksumError                 a download's sha256 differs from the recorded one
      WaitTimeout                   ``Job.wait(timeout=...)`` ran out before the job finished

Every :class:`APIError` keeps the problem+json body (``problem``) and the HTTP request it
answered (``request``), when there is one.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from libreyolo_client._models import JobInfo

__all__ = [
    "APIError", "AuthError", "ChecksumError", "Conflict", "JobCancelled",
    "JobError", "JobFailed", "LibreYOLOError", "NotFound", "ServiceUnavailable",
    "SubmitWarning", "ValidationError", "WaitTimeout", "error_from_response",
]


class SubmitWarning(UserWarning):
    """The service accepted a job but says it may not run soon (e.g. no live worker
    serves its queue). Issued by ``submit``; the texts are also in ``JobInfo.warnings``."""


class LibreYOLOError(Exception):
    """Base of every error the SDK raises on purpose."""


class APIError(LibreYOLOError):
    """The service answered with an error status.

    Attributes:
        status_code: HTTP status (0 when no answer came at all).
        detail: the problem's ``detail`` sentence (names the field or thing at fault).
        problem: the whole problem+json body (``{}`` if the body was not JSON).
        request: the :class:`httpx.Request` that failed, if any.
    """

    def __init__(self, status_code: int, detail: str, *, problem: dict[str, Any] | None = None,
                 request: httpx.Request | None = None):
        super().__init__(f"{status_code}: {detail}" if status_code else detail)
        self.status_code = status_code
        self.detail = detail
        self.problem = problem or {}
        self.request = request


class AuthError(APIError):
    """401 or 403: the token is missing, unknown or revoked."""


class NotFound(APIError):
    """404: no such job, dataset or artifact (another user's job looks the same)."""


class Conflict(APIError):
    """409: the request clashes with the current state (e.g. the job already finished)."""


class ValidationError(APIError):
    """422: a request field is invalid.

    Attributes:
        field: dotted path of the field at fault, e.g. ``params.imgsz``, ``model``, ``data``.
        value, allowed: the bad value and what is allowed, when the service says.
        errors: every field error (``[{"field", "message"}]``) for schema errors.
    """

    def __init__(self, status_code: int, detail: str, **kw: Any):
        super().__init__(status_code, detail, **kw)
        self.field: str | None = self.problem.get("field")
        self.value = self.problem.get("value")
        self.allowed = self.problem.get("allowed")
        self.errors: list[dict[str, Any]] = self.problem.get("errors") or []


class ServiceUnavailable(APIError):
    """503, or no answer (connection refused, reset, timeout) after the retries."""


class JobError(LibreYOLOError):
    """A job ended without success. ``job`` is its final :class:`JobInfo`."""

    def __init__(self, message: str, job: JobInfo):
        super().__init__(message)
        self.job = job
        self.job_id = job.id
        self.status = job.status


class JobFailed(JobError):
    """The job failed.

    Attributes:
        reason: why (e.g. ``bad config``, ``data error``, ``time budget of 60 s exceeded``).
        exit_code: the engine's exit code, if it ran.
        log_tail: the engine's last log lines (list of str).
        error: the job's whole ``error`` object.
    """

    def __init__(self, job: JobInfo):
        error = job.error or {}
        self.error = error
        self.reason = str(error.get("reason") or "unknown reason")
        self.exit_code = error.get("exit_code")
        self.log_tail: list[str] = list(error.get("log_tail") or [])
        tail = "\n".join(f"    {ln}" for ln in self.log_tail[-15:])
        msg = f"job {job.id} failed: {self.reason}"
        if self.exit_code is not None:
            msg += f" (exit code {self.exit_code})"
        if error.get("engine_error"):
            msg += f": {error['engine_error']}"
        if tail:
            msg += f"\n  last log lines:\n{tail}"
        super().__init__(msg, job)


class JobCancelled(JobError):
    """The job was cancelled."""

    def __init__(self, job: JobInfo):
        super().__init__(f"job {job.id} was cancelled", job)


class ChecksumError(LibreYOLOError):
    """A downloaded file's sha256 is not the one the service recorded."""


class ExportFailed(LibreYOLOError):
    """A model's export failed on the service (``model.onnx.error`` says why; exporting
    again retries). Attributes: ``model_id``, ``reason``."""

    def __init__(self, model_id: str, reason: str):
        super().__init__(f"model {model_id}: the ONNX export failed: {reason}")
        self.model_id, self.reason = model_id, reason


class WaitTimeout(LibreYOLOError, TimeoutError):
    """``Job.wait(timeout=...)`` ran out of time; the job keeps running on the service."""


_BY_STATUS: dict[int, type[APIError]] = {401: AuthError, 403: AuthError, 404: NotFound,
                                         409: Conflict, 422: ValidationError,
                                         503: ServiceUnavailable}


def error_from_response(r: httpx.Response) -> APIError:
    """The typed :class:`APIError` for an error response (reads its problem+json body)."""
    try:
        body = r.json()
    except ValueError:
        body = None
    problem = body if isinstance(body, dict) else {}
    detail = problem.get("detail")
    if not isinstance(detail, str):
        detail = str(detail) if detail is not None else (r.text[:500] or r.reason_phrase)
    cls = _BY_STATUS.get(r.status_code, APIError)
    if r.status_code in (502, 504):
        cls = ServiceUnavailable
    return cls(r.status_code, detail, problem=problem, request=r.request)


def no_answer(exc: Exception, request: httpx.Request | None) -> ServiceUnavailable:
    """The :class:`ServiceUnavailable` for a request that got no answer (``exc``: the
    transport error or the last 503), naming ``request`` when known."""
    where = f" ({request.method} {request.url})" if request is not None else ""
    return ServiceUnavailable(0, f"no answer from the service{where}: "
                              f"{type(exc).__name__}: {exc}", request=request)


def _non_finite_path(value: Any, path: str = "") -> str | None:
    """Dotted path of the first NaN or infinite float inside ``value`` (None: there is none)."""
    if isinstance(value, float) and not math.isfinite(value):
        return path or None
    items = value.items() if isinstance(value, dict) else (
        enumerate(value) if isinstance(value, list | tuple) else ())
    for key, item in items:
        found = _non_finite_path(item, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None


def unsendable(exc: ValueError, body: Any) -> ValidationError:
    """The error for a request body httpx cannot encode (JSON carries no NaN or infinity),
    naming the field, e.g. ``params.lr0``, when the body shows which one it is."""
    field = _non_finite_path(body)
    where = f"{field}: " if field else ""
    return ValidationError(0, f"the request cannot be sent: {where}{exc} (NaN and infinity are "
                              "not numbers JSON can carry)",
                           problem={"field": field} if field else None)
