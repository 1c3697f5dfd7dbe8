"""``Client`` and ``Job``: the synchronous SDK over httpx.

Everything that does no I/O (URLs, headers, request bodies, parsing replies, retry
decisions) lives in :class:`_Base`; following a job's events, reading its log and moving
files are I/O-free procedures (:mod:`libreyolo_client._follow`,
:mod:`libreyolo_client._transfer`) that :class:`Wire`, the client's HTTP layer, performs.
The async twin (``libreyolo_client._async``) has the same pieces and only sends and awaits.

A :class:`Job` talks to the service through its client's :attr:`Client.wire` and public
methods only.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from libreyolo_client import _config, _transfer
from libreyolo_client._errors import (
    Conflict,
    JobCancelled,
    JobFailed,
    ServiceUnavailable,
    SubmitWarning,
    WaitTimeout,
    error_from_response,
    no_answer,
    unsendable,
)
from libreyolo_client._follow import Follower
from libreyolo_client._models import (
    ArtifactInfo,
    Box,
    DatasetInfo,
    Event,
    JobInfo,
    JobStatus,
    Model,
    Preflight,
    TuneReport,
    ValReport,
    boxes_from,
    exported,
    published,
)
from libreyolo_client._progress import EventPrinter
from libreyolo_client._sse import parse_sse
from libreyolo_client._steps import (
    CloseStream,
    Deliver,
    GetPage,
    GetRaw,
    Hash,
    NextSSE,
    OpenFile,
    OpenStream,
    ProgressFn,
    Save,
    Sleep,
    Steps,
)
from libreyolo_client._transfer import CHUNK

__all__ = ["Client", "Job", "DEFAULT_TIMEOUT", "Wire"]

#: seconds per phase; reads are long because a dataset upload waits for the scan.
DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
RETRY_STATUSES = frozenset({429, 502, 503, 504})
#: The longest ``Retry-After`` the SDK waits for (seconds); a longer one is cut to this.
MAX_RETRY_AFTER_S = 60.0

#: image suffix -> the Content-Type ``POST /v1/predict`` takes
PREDICT_TYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png",
                 ".webp": "image/webp", ".bmp": "image/bmp"}
EventFn = Callable[[Event], None]


def retry_after_s(response: httpx.Response) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait (a number, or an HTTP date), or None."""
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    from datetime import datetime as _dt

    return max(0.0, (when - _dt.now(when.tzinfo)).total_seconds())

def retry_delay(attempt: int, response: httpx.Response | None, backoff_s: float) -> float:
    """Seconds before retry ``attempt`` (0, 1, ...): the answer's ``Retry-After`` (seconds
    or an HTTP date, as a 503 or 429 sends it), at most :data:`MAX_RETRY_AFTER_S`; else
    exponential backoff with jitter from ``backoff_s``: 0.5, 1, 2, 4, 8 s (capped), +-25%."""
    after = retry_after_s(response) if response is not None else None
    if after is not None:
        return min(after, MAX_RETRY_AFTER_S)
    return min(8.0, backoff_s * 2 ** attempt) * random.uniform(0.75, 1.25)


def checked(r: httpx.Response) -> httpx.Response:
    """``r``, or its typed :class:`APIError` raised when its status is an error (>= 400)."""
    if r.status_code >= 400:
        raise error_from_response(r)
    return r


class _Base:
    """Configuration and everything without I/O, shared by the sync and async clients."""

    def __init__(self, url: str | None = None, token: str | None = None, *,
                 timeout: float | httpx.Timeout | None = DEFAULT_TIMEOUT, retries: int = 5,
                 backoff_s: float = 0.5, credentials_path: str | os.PathLike[str] | None = None):
        if not (timeout is None or isinstance(timeout, int | float | httpx.Timeout)):
            raise TypeError(f"timeout must be float | httpx.Timeout | None, not "
                            f"{type(timeout).__name__}")
        self.url, self.token = _config.resolve(url, token, credentials_path)
        self.timeout = timeout if isinstance(timeout, httpx.Timeout) or timeout is None \
            else httpx.Timeout(float(timeout))
        self.retries = max(0, int(retries))
        self.backoff_s = float(backoff_s)

    # -- requests ---------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        h = {"User-Agent": "libreyolo-client/0.1", "Accept": "application/json"}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        return h

    def _delay(self, attempt: int, response: httpx.Response | None = None) -> float:
        """:func:`retry_delay` with this client's ``backoff_s``."""
        return retry_delay(attempt, response, self.backoff_s)

    @staticmethod
    def _data_ref(data: str | os.PathLike[str]) -> str:
        """A dataset id as is; a local path that exists made absolute (the API wants an
        absolute yaml path that its workers can read)."""
        s = os.fspath(data)
        if os.path.exists(s):
            return str(Path(s).resolve())
        return s

    def _job_body(self, kind: str, model: str, data: str | os.PathLike[str], gpus: int | None,
                  procs: int, nodes: int, priority: int, time_budget_s: float | None,
                  params: dict[str, Any], tune: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": kind, "model": model, "data": self._data_ref(data),
                                "params": params, "procs": procs, "nodes": nodes,
                                "priority": priority}
        if gpus is not None:
            body["gpus"] = gpus
        if time_budget_s is not None:
            body["time_budget_s"] = time_budget_s
        if tune is not None:
            body["tune"] = tune
        return body

    @staticmethod
    def _tune_options(repeat: int | None, warmup: int | None, steps: int | None,
                      max_candidates: int | None, budget_s: float | None,
                      min_gain: float | None) -> dict[str, Any]:
        """A tune job's ``tune`` body: the options given (None: the service's default)."""
        return {k: v for k, v in (("repeat", repeat), ("warmup", warmup), ("steps", steps),
                                  ("max_candidates", max_candidates), ("budget_s", budget_s),
                                  ("min_gain", min_gain)) if v is not None}

    @staticmethod
    def _jobs_query(status: str | list[str] | None, kind: str | None, limit: int | None,
                    have: int, cursor: str | None) -> dict[str, Any]:
        """The query of one page of ``GET /v1/jobs`` (at most 200 a page) when ``have`` of
        at most ``limit`` jobs were read so far."""
        q: dict[str, Any] = {}
        if status:
            q["status"] = status.split(",") if isinstance(status, str) else list(status)
        if kind:
            q["kind"] = kind
        q["limit"] = 200 if limit is None else max(1, min(200, limit - have))
        if cursor:
            q["cursor"] = cursor
        return q

    @staticmethod
    def _jobs_done(page: dict[str, Any], limit: int | None, have: int) -> str | None:
        """The cursor of the next page of ``GET /v1/jobs``, or None when the listing is
        complete (no further page, or ``limit`` reached with ``have`` jobs)."""
        cursor = page.get("next_cursor")
        if not cursor or (limit is not None and have >= limit):
            return None
        return str(cursor)

    def _register_body(self, path: str | os.PathLike[str], name: str | None) -> dict[str, str]:
        """The body of ``POST /v1/datasets/register``: the yaml's path (made absolute when
        it exists here) and the name (default: the yaml's folder name, else its stem)."""
        p = self._data_ref(path)
        return {"name": name or Path(p).parent.name or Path(p).stem, "path": p}

    @staticmethod
    def _predict_request(model: str, path: str | os.PathLike[str], conf: float, iou: float,
                         imgsz: int | None, max_det: int) -> dict[str, Any]:
        """The keywords of ``POST /v1/predict`` for the image file ``path``.

        Raises:
            FileNotFoundError: no such file. ValueError: not a .jpg/.jpeg/.png/.webp/.bmp.
        """
        src = Path(path).expanduser()
        if not src.is_file():
            raise FileNotFoundError(f"image {src} does not exist")
        kind = PREDICT_TYPES.get(src.suffix.lower())
        if kind is None:
            raise ValueError(f"{src}: the service predicts {', '.join(PREDICT_TYPES)} images")
        params: dict[str, Any] = {"model": model, "name": src.name, "conf": conf, "iou": iou,
                                  "max_det": max_det}
        if imgsz is not None:
            params["imgsz"] = imgsz
        return {"params": params, "content": src.read_bytes(), "idempotent": False,
                "headers": {"Content-Type": kind}}

    def page_url(self, job_id: str) -> str:
        """The job's page in the browser."""
        return f"{self.url}/jobs/{job_id}"


class Wire:
    """A client's HTTP layer: retrying requests, and the driver that performs the
    operations of the I/O-free procedures (:mod:`libreyolo_client._steps`).

    Internal, but named: it is what a :class:`Job` uses to reach the service (with the
    client's public methods), and what :class:`libreyolo_client._async.AsyncWire` mirrors.
    The retry settings are the client's (``retries``, ``backoff_s``), read at each call.
    """

    def __init__(self, http: httpx.Client, config: _Base):
        self.http = http
        self._config = config

    @property
    def retries(self) -> int:
        """Retries of an idempotent call (the client's ``retries``)."""
        return self._config.retries

    def delay(self, attempt: int, response: httpx.Response | None = None) -> float:
        """Seconds before retry ``attempt`` (:func:`retry_delay`, the client's
        ``backoff_s``)."""
        return retry_delay(attempt, response, self._config.backoff_s)

    def request(self, method: str, path: str, *, idempotent: bool = True,
                **kw: Any) -> httpx.Response:
        """Send with retries (idempotent calls only) and raise typed errors.

        Raises:
            ServiceUnavailable: no answer, or 502/503/504, after the retries (a 429 and a
                503 are retried after their Retry-After, bounded).
            APIError: (subclasses) any other error status.
            ValidationError: a JSON body httpx cannot encode (NaN, infinity).
        """
        attempt = 0
        while True:
            r: httpx.Response | None = None
            try:
                r = self.http.request(method, path, **kw)
            except ValueError as exc:  # httpx encodes json= strictly: no NaN or infinity
                raise unsendable(exc, kw.get("json")) from exc
            except httpx.TransportError as exc:
                if not idempotent or attempt >= self.retries:
                    raise no_answer(exc, _request_of(exc)) from exc
            else:
                if r.status_code not in RETRY_STATUSES or not idempotent \
                        or attempt >= self.retries:
                    return checked(r)
            time.sleep(self.delay(attempt, r))
            attempt += 1

    def json(self, method: str, path: str, **kw: Any) -> Any:
        """:meth:`request`'s JSON body."""
        return self.request(method, path, **kw).json()

    def drive(self, steps: Steps) -> Iterator[Any]:
        """Perform a procedure's operations, blocking; yields what it delivers. The open
        stream, if any, is closed before an error is reported to the procedure, and when
        it ends (also when the caller stops iterating)."""
        with contextlib.closing(steps), contextlib.ExitStack() as stack:
            stream = _Open(stack)
            while (op := steps.next_op()) is not None:
                if isinstance(op, Deliver):
                    yield op.event
                    continue
                try:
                    steps.answer(self._perform(op, stream))
                except Exception as exc:
                    stack.close()
                    steps.fail(exc)

    def run(self, steps: Steps) -> Any:
        """Perform a procedure that delivers nothing; returns its result."""
        for _ in self.drive(steps):
            pass
        return steps.result

    def _perform(self, op: Any, stream: _Open) -> Any:
        """One operation's answer (see the operations in :mod:`libreyolo_client._steps`)."""
        if isinstance(op, Sleep):
            time.sleep(op.seconds)
        elif isinstance(op, GetPage):
            return self.json("GET", op.path, params=op.params)
        elif isinstance(op, GetRaw):
            return self.request("GET", op.path, params=op.params)
        elif isinstance(op, OpenStream | OpenFile):
            return self._open(op, stream)
        elif isinstance(op, NextSSE):
            return next(stream.lines, None) if stream.lines is not None else None
        elif isinstance(op, Save):
            return _save(op, stream.response)
        elif isinstance(op, Hash):
            return _sha256(op.file)
        elif isinstance(op, CloseStream):
            stream.stack.close()
        return None

    def _open(self, op: OpenStream | OpenFile, stream: _Open) -> Any:
        """Open ``op``'s stream (an :class:`OpenStream`'s error status is raised)."""
        params = op.params if isinstance(op, OpenFile) else None
        r = stream.stack.enter_context(self.http.stream(
            "GET", op.path, params=params, headers=op.headers, timeout=op.timeout))
        stream.response = r
        if r.status_code >= 400:
            r.read()
            if isinstance(op, OpenStream):
                raise error_from_response(r)
            return r
        if isinstance(op, OpenFile):
            return r
        stream.lines = parse_sse(r.iter_lines())
        return r.headers.get("content-type", "")


class _Open:
    """The stream a driver holds open: its exit stack, response and SSE events."""

    def __init__(self, stack: Any):
        self.stack = stack
        self.response: Any = None
        self.lines: Any = None


def _save(op: Save, r: httpx.Response) -> int:
    """Write ``r``'s body to ``op.file``; the bytes done (see :class:`Save`)."""
    done = op.done
    with open(op.file, op.mode) as f:
        for chunk in r.iter_bytes():
            f.write(chunk)
            done += len(chunk)
            if op.report:
                op.report(done, op.total)
    return done


class Client(_Base):
    """Talks to a LibreYOLO training service.

    Args:
        url: e.g. ``http://127.0.0.1:8000``; default ``LIBREYOLO_URL``, then the
            credentials file written by ``libreyolo-service up``, then that address.
        token: bearer token; default ``LIBREYOLO_TOKEN``, then the credentials file.
        timeout: seconds per phase (float, :class:`httpx.Timeout`, or None for none).
        retries: retries of idempotent calls (reads, cancel, submits with their
            Idempotency-Key) on connection errors and 429/502/503/504, waiting what a
            Retry-After asks (at most MAX_RETRY_AFTER_S), else with exponential backoff.
        backoff_s: first retry delay in seconds (doubles each time, at most 8 s).
        credentials_path: read this credentials file instead of the default.
        transport: an httpx transport (e.g. ``httpx.MockTransport`` in tests).

    Use as a context manager, or call :meth:`close`.

    Example::

        with Client() as c:
            job = c.train(model="yolo9-t", data="/data/coco128.yaml", epochs=10, imgsz=320)
            job.wait(progress=True)
            job.download("weights/best.pt", "models/")
    """

    def __init__(self, url: str | None = None, token: str | None = None, *,
                 timeout: float | httpx.Timeout | None = DEFAULT_TIMEOUT, retries: int = 5,
                 backoff_s: float = 0.5, credentials_path: str | os.PathLike[str] | None = None,
                 transport: httpx.BaseTransport | None = None):
        super().__init__(url, token, timeout=timeout, retries=retries, backoff_s=backoff_s,
                         credentials_path=credentials_path)
        self._http = httpx.Client(base_url=self.url, headers=self._headers(),
                                  timeout=self.timeout, transport=transport)
        #: the HTTP layer this client and its :class:`Job` handles share (internal)
        self.wire = Wire(self._http, self)

    # -- lifecycle --------------------------------------------------------------------
    def close(self) -> None:
        """Close the connection pool. The client cannot be used afterwards."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # -- transport ----------------------------------------------------------------------
    def _request(self, method: str, path: str, *, idempotent: bool = True,
                 **kw: Any) -> httpx.Response:
        """:meth:`Wire.request`."""
        return self.wire.request(method, path, idempotent=idempotent, **kw)

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        """:meth:`Wire.json`."""
        return self.wire.json(method, path, **kw)

    # -- service ----------------------------------------------------------------------
    def health(self) -> bool:
        """True when ``/healthz`` answers 200 (no retries, no token needed)."""
        try:
            return self._http.get("/healthz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until ``/healthz`` answers (e.g. right after ``libreyolo-service up``).

        Raises:
            ServiceUnavailable: it did not answer within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while not self.health():
            if time.monotonic() > deadline:
                raise ServiceUnavailable(0, f"{self.url} did not answer /healthz within "
                                         f"{timeout:g} s")
            time.sleep(0.25)

    # -- jobs -------------------------------------------------------------------------
    def submit(self, kind: str, model: str, data: str | os.PathLike[str], *,
               gpus: int | None = None, procs: int = 1, nodes: int = 1, priority: int = 0,
               time_budget_s: float | None = None, idempotency_key: str | None = None,
               params: dict[str, Any] | None = None, tune: dict[str, Any] | None = None) -> Job:
        """Submit a ``train``, ``profile``, ``tune`` or ``predict`` job; see :meth:`train`,
        :meth:`tune` (``tune``: a tune job's options) and :meth:`predict` (a predict job's
        ``params``: ``conf``, ``iou``, ``imgsz``, ``max_det``, ``split``).

        A fresh ``Idempotency-Key`` (or yours) goes with the request and with every retry of
        it, so a retried submit never makes two jobs. When the service warns (no live worker
        serves the job's queue), each warning is issued as a :class:`SubmitWarning`.
        """
        body = self._job_body(kind, model, data, gpus, procs, nodes, priority, time_budget_s,
                              dict(params or {}), tune)
        key = idempotency_key or uuid.uuid4().hex
        info = JobInfo.model_validate(self._json("POST", "/v1/jobs", json=body,
                                                 headers={"Idempotency-Key": key}))
        for text in info.warnings:
            warnings.warn(text, SubmitWarning, stacklevel=3)
        return Job(self, info)

    def train(self, model: str = "yolo9-t", data: str | os.PathLike[str] = "", gpus: int | None
              = None, *, procs: int = 1, nodes: int = 1, priority: int = 0,
              time_budget_s: float | None = None, idempotency_key: str | None = None,
              **params: Any) -> Job:
        """Submit a training job.

        Args:
            model: ``<family>-<size>`` (``yolo9-t``) or ``job:<id>/weights/best.pt``.
            data: a dataset id (from :meth:`upload_dataset` / :meth:`register_dataset`) or a
                dataset yaml path the service's workers can read (a local path that exists
                is made absolute).
            gpus: 0 (CPU), 1, 2, 4 or 8 (per node); None = the service's default.
            procs: CPU ranks of a ``gpus=0`` job (per node).
            nodes: hosts of one torchrun world: a multi-node job runs ``gpus`` (or
                ``procs``) ranks on each of ``nodes`` workers and starts once that many
                workers are free (at most the service's ``max_nodes``); 1 = one worker.
            priority: 0 (default) to 9 (first).
            time_budget_s: wall-clock limit in seconds; the job fails after it.
            idempotency_key: reuse one to make a submit safe to repeat yourself.
            **params: training keys (``epochs=10, imgsz=320, batch=16, lr0=0.01``...).

        Returns:
            The :class:`Job` (status ``queued``).

        Raises:
            ValidationError: a bad key or value; ``.field`` names it (``params.imgsz``).
            AuthError, ServiceUnavailable: see the module docstring.
        """
        return self.submit("train", model, data, gpus=gpus, procs=procs, nodes=nodes,
                           priority=priority,
                           time_budget_s=time_budget_s, idempotency_key=idempotency_key,
                           params=params)

    def profile(self, model: str = "yolo9-t", data: str | os.PathLike[str] = "", gpus: int |
                None = None, *, procs: int = 1, nodes: int = 1, priority: int = 0,
                time_budget_s: float | None = None, idempotency_key: str | None = None,
                **params: Any) -> Job:
        """Submit a profile job (a short measured run; its result holds the ``verdict`` and
        ``bound_why``, its artifacts ``timeline.html``). Arguments as :meth:`train`; a
        profile runs on one device of one host, so the service refuses ``nodes`` > 1
        (:class:`ValidationError`, ``field`` ``nodes``)."""
        return self.submit("profile", model, data, gpus=gpus, procs=procs, nodes=nodes,
                           priority=priority,
                           time_budget_s=time_budget_s, idempotency_key=idempotency_key,
                           params=params)

    def tune(self, model: str = "yolo9-t", data: str | os.PathLike[str] = "", gpus: int |
             None = None, *, repeat: int | None = None, warmup: int | None = None,
             steps: int | None = None, max_candidates: int | None = None,
             budget_s: float | None = None, min_gain: float | None = None, procs: int = 1,
             nodes: int = 1, priority: int = 0, time_budget_s: float | None = None,
             idempotency_key: str | None = None, **params: Any) -> Job:
        """Submit a tune job: the configuration ``params`` is profiled ``repeat`` times, the
        levers its verdict names (on this device) are profiled the same way and compared
        with it, and a parameter set is recommended only when it is faster beyond noise.

        Args:
            repeat: trials per configuration (2-10; service default 3).
            warmup, steps: each trial's window (fitted into one epoch).
            max_candidates: configurations tried besides the baseline.
            budget_s: the tune's time budget, seconds (it stops between trials).
            min_gain: the smallest gain recommended (0.05 = 5 %).
            **params: the baseline's training keys; the rest as :meth:`train` (a tune runs
                on one host: the service refuses ``nodes`` > 1).

        Returns:
            The :class:`Job`; when it is done, :attr:`Job.tune` is the typed
            :class:`TuneReport` (``recommended_params`` to train with).
        """
        options = self._tune_options(repeat, warmup, steps, max_candidates, budget_s, min_gain)
        return self.submit("tune", model, data, gpus=gpus, procs=procs, nodes=nodes,
                           priority=priority,
                           time_budget_s=time_budget_s, idempotency_key=idempotency_key,
                           params=params, tune=options)

    def submit_predict(self, model: str, path: str | os.PathLike[str], *, conf: float = 0.25,
                       iou: float = 0.45, imgsz: int | None = None, max_det: int = 300) -> Job:
        """Send one image to be predicted on a worker (``POST /v1/predict``, "Try it").

        Args:
            model: a registered model id (``m...``), ``job:<id>`` (its weights/best.pt),
                ``job:<id>/<checkpoint>`` or a model name.
            path: a .jpg, .jpeg, .png, .webp or .bmp file (at most the service's
                ``max_predict_bytes``, 10 MB by default).
            conf, iou, imgsz, max_det: the engine's predict keys.

        Returns:
            The predict :class:`Job` (``queued``); once done, :meth:`Job.boxes` and
            ``job.download("predict/<file name>")`` (the annotated image).

        Raises:
            Conflict: no live worker serves a queue that could run it.
            ValidationError: a bad value, an unknown model, bytes that are no image.
            APIError: 413 (too large), 415 (not an image type).
        """
        r = self._request("POST", "/v1/predict",
                          **self._predict_request(model, path, conf, iou, imgsz, max_det))
        return Job(self, JobInfo.model_validate(r.json()))

    def predict(self, model: str, path: str | os.PathLike[str], *, conf: float = 0.25,
                iou: float = 0.45, imgsz: int | None = None, max_det: int = 300,
                timeout: float | None = 120.0) -> list[Box]:
        """The boxes ``model`` finds in the image ``path``: :meth:`submit_predict`, wait
        (at most ``timeout`` seconds), then :meth:`Job.boxes`.

        Raises:
            as :meth:`submit_predict`; JobFailed: the job failed; WaitTimeout.
        """
        job = self.submit_predict(model, path, conf=conf, iou=iou, imgsz=imgsz, max_det=max_det)
        job.wait(timeout)
        return job.boxes()

    def job(self, job_id: str) -> Job:
        """The job ``job_id``.

        Raises:
            NotFound: no such job, or another user's.
        """
        return Job(self, JobInfo.model_validate(self._json("GET", f"/v1/jobs/{job_id}")))

    def jobs(self, status: str | list[str] | None = None, kind: str | None = None,
             limit: int | None = 50) -> list[Job]:
        """Your jobs, newest first (admins see everyone's).

        Args:
            status: one status or several (``["queued", "running"]``).
            kind: ``train`` or ``profile``.
            limit: at most this many (None = all, page by page).
        """
        out: list[Job] = []
        cursor: str | None = None
        while True:
            page = self._json("GET", "/v1/jobs",
                              params=self._jobs_query(status, kind, limit, len(out), cursor))
            out += [Job(self, JobInfo.model_validate(j)) for j in page["data"]]
            if (cursor := self._jobs_done(page, limit, len(out))) is None:
                return out

    def resume(self, job_id: str) -> Job:
        """Resume a cancelled or failed train job: a new job that continues from its
        ``weights/last.pt`` (``POST /v1/jobs/{id}/resume``).

        Raises:
            Conflict: not a cancelled or failed train job, or it left no last.pt.
        """
        return Job(self, JobInfo.model_validate(self._json("POST", f"/v1/jobs/{job_id}/resume")))

    def cancel(self, job_id: str) -> JobInfo:
        """Cancel a job (queued: at once; running: the engine is stopped, then cancelled).

        Cancelling a cancelled job again returns it.

        Raises:
            Conflict: the job already succeeded or failed.
        """
        try:
            return JobInfo.model_validate(self._json("POST", f"/v1/jobs/{job_id}/cancel"))
        except Conflict as exc:
            if exc.problem.get("status_now") == JobStatus.CANCELLED:
                return self.job(job_id).info
            raise

    # -- datasets ---------------------------------------------------------------------
    def register_dataset(self, path: str | os.PathLike[str], name: str | None = None
                         ) -> DatasetInfo:
        """Register a dataset yaml at a path the service's workers can read (shared storage).

        Raises:
            ValidationError: ``field == "path"`` when it is not an existing yaml there.
        """
        return DatasetInfo.model_validate(self._json(
            "POST", "/v1/datasets/register", json=self._register_body(path, name),
            idempotent=False))

    def upload_dataset(self, path_or_zip: str | os.PathLike[str], name: str | None = None, *,
                       progress: bool | ProgressFn = False) -> DatasetInfo:
        """Upload a dataset: a folder (zipped here first) or a ``.zip`` holding a data yaml.

        The zip is streamed in 1 MiB chunks; the service checks it (no ``..``, no absolute
        paths or symlinks, size caps) and scans the dataset before answering.

        Args:
            path_or_zip: folder or zip file.
            name: dataset name (default: the folder or zip name).
            progress: True prints ``sent/total`` to stderr; or a callable
                ``(sent_bytes, total_bytes)``.

        Returns:
            The dataset; pass ``.id`` as ``data=``. ``status == "invalid"`` when the scan
            failed (see ``.report``).

        The same zip uploaded again returns the dataset already made from it.

        Raises:
            FileNotFoundError: no such folder or file, or a folder without a dataset yaml
                (``*.yaml`` at its top or one folder down), checked before uploading.
            ValidationError: unsafe zip or no yaml in it (``field == "body"``).
            APIError: 413 when larger than the service's upload cap.
        """
        src, name = _transfer.dataset_source(path_or_zip, name)
        zipped = _transfer.zip_folder(src) if src.is_dir() else src
        report = _transfer.progress_fn(progress, f"upload {name}")
        try:
            total = zipped.stat().st_size
            r = self.wire.request(
                **_transfer.upload_request("/v1/datasets", name, total, "application/zip"),
                content=_transfer.file_chunks(zipped, total, report))
            return DatasetInfo.model_validate(r.json())
        finally:
            if zipped is not src:
                zipped.unlink(missing_ok=True)

    def datasets(self) -> list[DatasetInfo]:
        """Your datasets, newest first."""
        return [DatasetInfo.model_validate(d) for d in self._json("GET", "/v1/datasets")["data"]]

    def delete_dataset(self, dataset_id: str) -> None:
        """Delete one of your datasets (an upload's files too; finished jobs keep theirs).

        Raises:
            NotFound: no such dataset.
            Conflict: a queued or running job uses it.
        """
        self._request("DELETE", f"/v1/datasets/{dataset_id}")

    # -- models -----------------------------------------------------------------------
    def upload_model(self, path: str | os.PathLike[str], name: str | None = None, *,
                     progress: bool | ProgressFn = False) -> Model:
        """Register a weights file (``.pt``): streamed to the service, which reads it with
        ``weights_only=True`` and says what it is.

        Args:
            path: the weights file.
            name: model name (default: the file name without ``.pt``).
            progress: True prints ``sent/total`` to stderr; or a callable.

        Returns:
            The model (family, size, classes, parameter count); pass ``.id`` as ``model=``.

        Raises:
            FileNotFoundError: no such file.
            ValidationError: the service cannot use the file; ``.detail`` says why (not a
                torch file, a pickle that needs code, truncated, an unknown family).
            APIError: 413 when larger than the service's cap.
        """
        src, name = _transfer.model_source(path, name)
        report = _transfer.progress_fn(progress, f"upload {name}")
        total = src.stat().st_size
        r = self.wire.request(
            **_transfer.upload_request("/v1/models", name, total, "application/octet-stream"),
            content=_transfer.file_chunks(src, total, report))
        return Model.model_validate(r.json()).bind(self)

    def models(self) -> list[Model]:
        """Your registered models, newest first."""
        return [Model.model_validate(m).bind(self)
                for m in self._json("GET", "/v1/models")["data"]]

    def model(self, model_id: str) -> Model:
        """One model (``.predict(path)``, ``.export()``, ``.download()`` go through this
        client). Raises ``NotFound`` for an unknown id or another user's model."""
        return Model.model_validate(self._json("GET", f"/v1/models/{model_id}")).bind(self)

    def export_model(self, model_id: str, format: str = "onnx", *, wait: bool = True,
                     timeout: float = 1800.0) -> Model:
        """Have the service export a model to ONNX on a worker (checked by onnxruntime
        there); also ``model.export("onnx")``. Idempotent: a model exported already is
        answered at once, one being exported is not exported twice, a failed export is
        retried.

        Args:
            format: ``onnx``.
            wait: poll until the export is ready (False: return the model as the request
                answered; ``model.onnx.state`` says where it stands).
            timeout: seconds to wait.

        Returns:
            The model; ``model.onnx.info`` holds the check figure (``max_diff``,
            ``tolerance``), layout, opset, ``sha256`` and ``bytes`` once ready; download
            the file with ``download_model(model_id, format="onnx")``. A ``warnings``
            entry says when no worker is online to run it.

        Raises:
            NotFound: unknown model. Conflict: the model is not ready (still inspecting).
            ExportFailed: the export failed (its reason). WaitTimeout: not done after
            ``timeout`` seconds (it goes on on the service).
        """
        model = Model.model_validate(self._json(
            "POST", f"/v1/models/{model_id}/export", params={"format": format})).bind(self)
        for text in model.warnings:
            warnings.warn(text, SubmitWarning, stacklevel=2)
        if not wait:
            return model
        return Model.bind(self.wire.run(Steps(_transfer.model_ready(
            model, exported, timeout, lambda m: f"model {model_id}: the ONNX export is "
            f"still {m.onnx.state} after {timeout:g} s"))), self)

    def delete_model(self, model_id: str) -> None:
        """Delete a model and its file. Raises ``Conflict`` while a queued or running job
        starts from it, ``NotFound`` for an unknown id."""
        self._request("DELETE", f"/v1/models/{model_id}")

    def download_model(self, model_id: str, dest: str | os.PathLike[str] | None = None, *,
                       format: str = "pt") -> Path:
        """Download a model's weights file (``format="onnx"``: its ONNX export, see
        :meth:`export_model`) and check its sha256.

        Args:
            dest: a file path or a folder (default: ``<model name>.pt`` / ``.onnx`` in the
                current folder).

        Like :meth:`Job.download`, the bytes go to ``<dest>.part`` (an interrupted
        download resumes with ``Range``; a wrong sha256 is downloaded once more), and a
        ``dest`` already holding the right bytes is kept.

        Raises:
            ValueError: ``format`` is neither ``pt`` nor ``onnx``.
            NotFound: unknown model. Conflict: ``format="onnx"`` and the export is not
            ready (the detail says its state). ChecksumError: the bytes differ from the
            sha256 (also after a fresh download). ServiceUnavailable: no answer.
        """
        return Path(self.wire.run(Steps(_transfer.download_model(
            model_id, dest, format, retries=self.retries, delay=self.wire.delay))))


class Job:
    """A job on the service: a handle holding the id and the last :class:`JobInfo` read.

    Attributes:
        id: the job id (``j`` + 24 hex digits).
        info: the job as last read (:meth:`refresh` reads it again).
    """

    def __init__(self, client: Client, info: JobInfo):
        self._client = client
        self.id = info.id
        self.info = info

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.info.kind} {self.info.model} {self.info.status}>"

    @property
    def _wire(self) -> Wire:
        """The client's HTTP layer (:attr:`Client.wire`)."""
        return self._client.wire

    @property
    def status(self) -> JobStatus | str:
        """Status as last read: a :class:`JobStatus` (a string: ``queued``, ``running``,
        ``cancelling``, ``succeeded``...)."""
        return self.info.status

    @property
    def page_url(self) -> str:
        """The job's page in the browser."""
        return self._client.page_url(self.id)

    @property
    def result(self) -> dict[str, Any] | None:
        """The result of a finished job (``metrics``, ``best_epoch``; for profile jobs
        ``verdict`` and ``bound_why``); re-read from the service unless already final.
        None while the job runs."""
        if not self.info.done:
            self.refresh()
        return self.info.result

    @property
    def metrics(self) -> dict[str, Any]:
        """Final metrics (``mAP50``, ``mAP50-95``, ...), or ``{}``."""
        return dict((self.result or {}).get("metrics") or {})

    @property
    def lever(self) -> dict[str, Any]:
        """A profile job's lever, or ``{}``: ``{"verdict", "params": {training key: value to
        try}, "why", "also": [other advice]}``; e.g. ``c.train(..., **job.lever["params"])``."""
        return dict((self.result or {}).get("lever") or {})

    @property
    def tune(self) -> TuneReport | None:
        """A tune job's result as typed data (also a cancelled one's: what was measured);
        ``None`` for other jobs and before it ends."""
        res = self.result if self.info.done else None
        data = (res or {}).get("tune")
        return TuneReport.model_validate(data) if isinstance(data, dict) else None

    @property
    def preflight(self) -> Preflight | None:
        """A train job's preflight estimate (``params.preflight``), with ``actual`` once it
        ended; while it runs, the figures kept in its progress. ``None`` without one."""
        if not self.info.done:
            self.refresh()
        data = (self.info.result or {}).get("preflight") or (self.info.progress or {}).get("preflight")
        return Preflight.model_validate(data) if isinstance(data, dict) and \
            data.get("total_s") is not None else None

    def refresh(self) -> JobInfo:
        """Read the job again; returns (and keeps) the new :class:`JobInfo`."""
        self.info = JobInfo.model_validate(self._wire.json("GET", f"/v1/jobs/{self.id}"))
        return self.info

    def cancel(self) -> JobInfo:
        """Cancel the job; see :meth:`Client.cancel`."""
        self.info = self._client.cancel(self.id)
        return self.info

    # -- following -------------------------------------------------------------------
    def events(self, after: int = 0, *, follow: bool = True, timeout: float | None = None
               ) -> Iterator[Event]:
        """The job's events in order (``seq`` after ``after``), each once.

        With ``follow`` the iterator follows the Server-Sent Events stream until the job is
        terminal and every event was delivered; a dropped connection is resumed with
        ``Last-Event-ID`` (no gap, no duplicate), and after repeated stream failures it
        falls back to polling ``GET /events``. Without ``follow`` it returns the events
        stored so far.

        Args:
            after: start after this ``seq`` (0 = from the first event).
            follow: keep going until the job ends.
            timeout: seconds; :class:`WaitTimeout` when the job is still running then.

        Raises:
            WaitTimeout: ``timeout`` passed.
            ServiceUnavailable: the service did not answer for ``FOLLOW_GIVE_UP_S`` seconds.
            NotFound, AuthError: the job is gone or the token is refused.
        """
        return self._wire.drive(Follower(self, after, follow=follow, timeout=timeout,
                                         delay=self._wire.delay))

    def wait(self, timeout: float | None = None, *, progress: bool = False,
             on_event: EventFn | None = None, raise_on_failure: bool = True) -> JobInfo:
        """Block until the job is terminal, following its event stream.

        Args:
            timeout: seconds (None = no limit).
            progress: print status changes, epochs and a live step line to stderr.
            on_event: called with every :class:`Event` as it arrives.
            raise_on_failure: raise on ``failed`` / ``cancelled`` (else just return).

        Returns:
            The final :class:`JobInfo` (also kept in :attr:`info`).

        Raises:
            JobFailed: the job failed; ``.reason`` and ``.log_tail`` say why.
            JobCancelled: the job was cancelled.
            WaitTimeout: ``timeout`` passed first (the job keeps running).
            ServiceUnavailable: the service stopped answering for long.
        """
        printer = EventPrinter(self.id) if progress else None
        try:
            for ev in self.events(timeout=timeout):
                if printer:
                    printer(ev)
                if on_event:
                    on_event(ev)
        finally:
            if printer:
                printer.close()
        info = self.refresh()
        deadline = _final_deadline(timeout)
        while not info.done:  # `end` came before the row was re-read (replica lag): poll
            if deadline is not None and time.monotonic() > deadline:
                raise WaitTimeout(f"job {self.id} still {info.status}")
            time.sleep(0.5)
            info = self.refresh()
        return _final(info, raise_on_failure)

    def logs(self, *, follow: bool = False, tail: int | None = None,
             poll_s: float = 1.0) -> Iterator[str]:
        """The engine's log (``train.log``), line by line.

        Args:
            follow: keep reading until the job is terminal (like ``tail -f``).
            tail: start with the last ``tail`` lines only.
            poll_s: seconds between reads while following.

        Yields:
            Lines without their line break.
        """
        return self._wire.drive(Steps(_transfer.log_lines(self, follow=follow, tail=tail,
                                                          poll_s=poll_s)))

    # -- artifacts -------------------------------------------------------------------
    def publish(self, name: str, *, wait: bool = True, timeout: float = 300.0) -> Model:
        """Register this finished job's ``weights/best.pt`` as a model named ``name``.

        The service answers at once with the model ``inspecting`` and reads the checkpoint
        afterwards; with ``wait`` (the default) this polls the model until it is ``ready``.

        Args:
            wait: poll until the model is ready (False: return it as the publish answered).
            timeout: seconds to wait for it.

        Raises:
            Conflict: the job has not succeeded, or has no ``weights/best.pt``.
            ValidationError: the service refused the checkpoint (``field`` ``job``).
            WaitTimeout: still inspecting after ``timeout`` seconds.
        """
        model = Model.model_validate(self._wire.json(
            "POST", f"/v1/jobs/{self.id}/publish", json={"name": name}, idempotent=False,
            timeout=httpx.Timeout(60.0, connect=10.0))).bind(self._client)
        if not wait:
            return model
        return Model.bind(self._wire.run(Steps(_transfer.model_ready(
            model, published, timeout,
            lambda m: f"model {m.id} is still {m.state} after {timeout:g} s"))), self._client)

    def report(self) -> ValReport:
        """The validation report of a training job (``val/report.json``, written when the
        run ends): the per-class table, curves, confusion matrix and the pictures' list.

        Raises:
            NotFound: the job has no report (not finished yet, not a training job, or a run
                without validation).
        """
        r = self._wire.request("GET", f"/v1/jobs/{self.id}/artifacts/val/report.json")
        return ValReport.model_validate(r.json())

    def artifacts(self) -> list[ArtifactInfo]:
        """Files of the run directory (path, kind, size_bytes; sha256 once finished)."""
        page = self._wire.json("GET", f"/v1/jobs/{self.id}/artifacts")
        return [ArtifactInfo.model_validate(a) for a in page["data"]]

    def boxes(self) -> list[Box]:
        """A finished predict job's detections (``predictions.json``) as :class:`Box` es,
        highest score first (every image of the job together; one image for "Try it").

        Raises:
            NotFound: no ``predictions.json`` (not a predict job, or not succeeded).
        """
        if not (self.info.result or {}).get("predict"):
            self.refresh()
        names = ((self.info.result or {}).get("predict") or {}).get("names") or {}
        r = self._wire.request("GET", f"/v1/jobs/{self.id}/artifacts/predictions.json")
        return boxes_from(r.json(), names)

    def download(self, path: str = "weights/best.pt", dest: str | os.PathLike[str] | None = None,
                 *, progress: bool | ProgressFn = False) -> Path:
        """Download one artifact and check its sha256.

        The file is written to ``<dest>.part`` first; an interrupted download (a lost
        connection, or an earlier call that died) resumes from the part's size with a
        ``Range`` request. When the sha256 differs from the one the service recorded, the
        part is discarded and the file downloaded once more from the start. A ``dest``
        that already holds the right bytes is kept without downloading.

        Args:
            path: relative to the run directory, e.g. ``weights/best.pt``, ``timeline.html``.
            dest: a file path or an existing folder (default: the current folder).
            progress: True prints bytes to stderr, or a callable ``(done_bytes, total)``.

        Returns:
            The downloaded file's path.

        Raises:
            NotFound: no such artifact.
            ChecksumError: the sha256 still differs after a fresh download.
            ServiceUnavailable: the service stopped answering (the part is kept to resume).
        """
        return Path(self._wire.run(Steps(_transfer.download_artifact(
            self, path, dest, retries=self._wire.retries, delay=self._wire.delay,
            report=_transfer.progress_fn(progress, f"download {path}")))))


#: seconds ``wait(timeout=...)`` polls a job whose stream has ended but whose row does not
#: say done yet (a replica behind the primary); without a timeout it polls until done
FINAL_POLL_S = 30.0


def _final_deadline(timeout: float | None) -> float | None:
    """The monotonic deadline of ``wait``'s final poll (see :data:`FINAL_POLL_S`)."""
    return None if timeout is None else time.monotonic() + FINAL_POLL_S


def _final(info: JobInfo, raise_on_failure: bool) -> JobInfo:
    """A finished job's ``info``; with ``raise_on_failure``, :class:`JobFailed` or
    :class:`JobCancelled` instead when it did not succeed (``wait`` of both clients)."""
    if raise_on_failure and info.status == JobStatus.FAILED:
        raise JobFailed(info)
    if raise_on_failure and info.status == JobStatus.CANCELLED:
        raise JobCancelled(info)
    return info


def _request_of(exc: httpx.HTTPError) -> httpx.Request | None:
    try:
        return exc.request
    except RuntimeError:
        return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()
