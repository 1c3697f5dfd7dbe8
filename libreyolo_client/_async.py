"""``AsyncClient`` and ``AsyncJob``: the asyncio twin of :mod:`libreyolo_client._client`.

Same methods, same arguments, same errors, same retry rules (``tests/client/
test_client_twins.py`` compares the signatures); request building and reply parsing come
from the shared :class:`~libreyolo_client._client._Base`, and following, log reading and
file transfers are the I/O-free procedures of :mod:`libreyolo_client._follow` and
:mod:`libreyolo_client._transfer`, performed here by :class:`AsyncWire`. Local file work
that may take long (zipping a dataset folder, reading a file to send, hashing) runs in a
worker thread.

Where the sync :class:`~libreyolo_client.Job` re-reads the job inside a property
(``result``, ``metrics``, ``lever``, ``tune``, ``preflight``), :class:`AsyncJob` cannot
await: its properties read the job as last read (``await job.refresh()``, or
``await job.wait()``, first).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from libreyolo_client import _transfer
from libreyolo_client._client import (
    DEFAULT_TIMEOUT,
    RETRY_STATUSES,
    EventFn,
    _Base,
    _final,
    _final_deadline,
    _request_of,
    _sha256,
    checked,
    retry_delay,
)
from libreyolo_client._errors import (
    Conflict,
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
from libreyolo_client._sse import aparse_sse
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

__all__ = ["AsyncClient", "AsyncJob", "AsyncWire"]


class AsyncWire:
    """Async twin of :class:`~libreyolo_client._client.Wire`: an :class:`AsyncClient`'s
    retrying requests and the driver of the I/O-free procedures (internal, but named: what
    an :class:`AsyncJob` uses to reach the service)."""

    def __init__(self, http: httpx.AsyncClient, config: _Base):
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

    async def request(self, method: str, path: str, *, idempotent: bool = True,
                      **kw: Any) -> httpx.Response:
        """See :meth:`Wire.request <libreyolo_client._client.Wire.request>`."""
        attempt = 0
        while True:
            r: httpx.Response | None = None
            try:
                r = await self.http.request(method, path, **kw)
            except ValueError as exc:  # httpx encodes json= strictly: no NaN or infinity
                raise unsendable(exc, kw.get("json")) from exc
            except httpx.TransportError as exc:
                if not idempotent or attempt >= self.retries:
                    raise no_answer(exc, _request_of(exc)) from exc
            else:
                if r.status_code not in RETRY_STATUSES or not idempotent \
                        or attempt >= self.retries:
                    return checked(r)
            await asyncio.sleep(self.delay(attempt, r))
            attempt += 1

    async def json(self, method: str, path: str, **kw: Any) -> Any:
        """:meth:`request`'s JSON body."""
        return (await self.request(method, path, **kw)).json()

    async def drive(self, steps: Steps) -> AsyncIterator[Any]:
        """Perform a procedure's operations, awaiting; yields what it delivers (see
        :meth:`Wire.drive <libreyolo_client._client.Wire.drive>`)."""
        with contextlib.closing(steps):
            async with contextlib.AsyncExitStack() as stack:
                stream = _AsyncOpen(stack)
                while (op := steps.next_op()) is not None:
                    if isinstance(op, Deliver):
                        yield op.event
                        continue
                    try:
                        steps.answer(await self._perform(op, stream))
                    except Exception as exc:
                        await stack.aclose()
                        steps.fail(exc)

    async def run(self, steps: Steps) -> Any:
        """Perform a procedure that delivers nothing; returns its result."""
        async for _ in self.drive(steps):
            pass
        return steps.result

    async def _perform(self, op: Any, stream: _AsyncOpen) -> Any:
        """One operation's answer (see the operations in :mod:`libreyolo_client._steps`)."""
        if isinstance(op, Sleep):
            await asyncio.sleep(op.seconds)
        elif isinstance(op, GetPage):
            return await self.json("GET", op.path, params=op.params)
        elif isinstance(op, GetRaw):
            return await self.request("GET", op.path, params=op.params)
        elif isinstance(op, OpenStream | OpenFile):
            return await self._open(op, stream)
        elif isinstance(op, NextSSE):
            return await anext(stream.lines, None) if stream.lines is not None else None
        elif isinstance(op, Save):
            return await _save(op, stream.response)
        elif isinstance(op, Hash):
            return await asyncio.to_thread(_sha256, op.file)
        elif isinstance(op, CloseStream):
            await stream.stack.aclose()
        return None

    async def _open(self, op: OpenStream | OpenFile, stream: _AsyncOpen) -> Any:
        """Open ``op``'s stream (an :class:`OpenStream`'s error status is raised)."""
        params = op.params if isinstance(op, OpenFile) else None
        r = await stream.stack.enter_async_context(self.http.stream(
            "GET", op.path, params=params, headers=op.headers, timeout=op.timeout))
        stream.response = r
        if r.status_code >= 400:
            await r.aread()
            if isinstance(op, OpenStream):
                raise error_from_response(r)
            return r
        if isinstance(op, OpenFile):
            return r
        stream.lines = aparse_sse(r.aiter_lines())
        return r.headers.get("content-type", "")


class _AsyncOpen:
    """The stream a driver holds open: its exit stack, response and SSE events."""

    def __init__(self, stack: contextlib.AsyncExitStack):
        self.stack = stack
        self.response: Any = None
        self.lines: Any = None


async def _save(op: Save, r: httpx.Response) -> int:
    """Write ``r``'s body to ``op.file``; the bytes done (see :class:`Save`)."""
    done = op.done
    with open(op.file, op.mode) as f:
        async for chunk in r.aiter_bytes():
            f.write(chunk)
            done += len(chunk)
            if op.report:
                op.report(done, op.total)
    return done


async def _afile_chunks(path: Path, total: int, report: ProgressFn | None
                        ) -> AsyncIterator[bytes]:
    """Async twin of :func:`libreyolo_client._transfer.file_chunks` (reads in a thread)."""
    sent = 0
    with open(path, "rb") as f:
        while chunk := await asyncio.to_thread(f.read, CHUNK):
            sent += len(chunk)
            yield chunk
            if report:
                report(sent, total)


class AsyncClient(_Base):
    """Asyncio client; arguments as :class:`~libreyolo_client.Client`, methods as its
    (awaited).

    Example::

        async with AsyncClient() as c:
            job = await c.train(model="yolo9-t", data="/data/coco128.yaml", epochs=3)
            info = await job.wait()
    """

    def __init__(self, url: str | None = None, token: str | None = None, *,
                 timeout: float | httpx.Timeout | None = DEFAULT_TIMEOUT, retries: int = 5,
                 backoff_s: float = 0.5, credentials_path: str | os.PathLike[str] | None = None,
                 transport: httpx.AsyncBaseTransport | None = None):
        super().__init__(url, token, timeout=timeout, retries=retries, backoff_s=backoff_s,
                         credentials_path=credentials_path)
        self._http = httpx.AsyncClient(base_url=self.url, headers=self._headers(),
                                       timeout=self.timeout, transport=transport)
        #: the HTTP layer this client and its :class:`AsyncJob` handles share (internal)
        self.wire = AsyncWire(self._http, self)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncClient({self.url!r})"

    async def _request(self, method: str, path: str, *, idempotent: bool = True,
                       **kw: Any) -> httpx.Response:
        """:meth:`AsyncWire.request`."""
        return await self.wire.request(method, path, idempotent=idempotent, **kw)

    async def _json(self, method: str, path: str, **kw: Any) -> Any:
        """:meth:`AsyncWire.json`."""
        return await self.wire.json(method, path, **kw)

    # -- service ----------------------------------------------------------------------
    async def health(self) -> bool:
        """See :meth:`Client.health`."""
        try:
            return (await self._http.get("/healthz", timeout=5)).status_code == 200
        except httpx.HTTPError:
            return False

    async def wait_ready(self, timeout: float = 60.0) -> None:
        """See :meth:`Client.wait_ready`."""
        deadline = time.monotonic() + timeout
        while not await self.health():
            if time.monotonic() > deadline:
                raise ServiceUnavailable(0, f"{self.url} did not answer /healthz within "
                                         f"{timeout:g} s")
            await asyncio.sleep(0.25)

    # -- jobs -------------------------------------------------------------------------
    async def submit(self, kind: str, model: str, data: str | os.PathLike[str], *,
                     gpus: int | None = None, procs: int = 1, nodes: int = 1, priority: int = 0,
                     time_budget_s: float | None = None, idempotency_key: str | None = None,
                     params: dict[str, Any] | None = None,
                     tune: dict[str, Any] | None = None) -> AsyncJob:
        """See :meth:`Client.submit`."""
        body = self._job_body(kind, model, data, gpus, procs, nodes, priority, time_budget_s,
                              dict(params or {}), tune)
        key = idempotency_key or uuid.uuid4().hex
        info = JobInfo.model_validate(
            await self._json("POST", "/v1/jobs", json=body, headers={"Idempotency-Key": key}))
        for text in info.warnings:
            warnings.warn(text, SubmitWarning, stacklevel=3)
        return AsyncJob(self, info)

    async def train(self, model: str = "yolo9-t", data: str | os.PathLike[str] = "",
                    gpus: int | None = None, *, procs: int = 1, nodes: int = 1,
                    priority: int = 0, time_budget_s: float | None = None,
                    idempotency_key: str | None = None, **params: Any) -> AsyncJob:
        """See :meth:`Client.train`."""
        return await self.submit("train", model, data, gpus=gpus, procs=procs, nodes=nodes,
                                 priority=priority, time_budget_s=time_budget_s,
                                 idempotency_key=idempotency_key, params=params)

    async def profile(self, model: str = "yolo9-t", data: str | os.PathLike[str] = "",
                      gpus: int | None = None, *, procs: int = 1, nodes: int = 1,
                      priority: int = 0, time_budget_s: float | None = None,
                      idempotency_key: str | None = None, **params: Any) -> AsyncJob:
        """See :meth:`Client.profile`."""
        return await self.submit("profile", model, data, gpus=gpus, procs=procs, nodes=nodes,
                                 priority=priority, time_budget_s=time_budget_s,
                                 idempotency_key=idempotency_key, params=params)

    async def tune(self, model: str = "yolo9-t", data: str | os.PathLike[str] = "",
                   gpus: int | None = None, *, repeat: int | None = None,
                   warmup: int | None = None, steps: int | None = None,
                   max_candidates: int | None = None, budget_s: float | None = None,
                   min_gain: float | None = None, procs: int = 1, nodes: int = 1,
                   priority: int = 0, time_budget_s: float | None = None,
                   idempotency_key: str | None = None, **params: Any) -> AsyncJob:
        """See :meth:`Client.tune`."""
        options = self._tune_options(repeat, warmup, steps, max_candidates, budget_s, min_gain)
        return await self.submit("tune", model, data, gpus=gpus, procs=procs, nodes=nodes,
                                 priority=priority, time_budget_s=time_budget_s,
                                 idempotency_key=idempotency_key, params=params, tune=options)

    async def submit_predict(self, model: str, path: str | os.PathLike[str], *,
                             conf: float = 0.25, iou: float = 0.45, imgsz: int | None = None,
                             max_det: int = 300) -> AsyncJob:
        """See :meth:`Client.submit_predict`."""
        kw = await asyncio.to_thread(self._predict_request, model, path, conf, iou, imgsz, max_det)
        r = await self._request("POST", "/v1/predict", **kw)
        return AsyncJob(self, JobInfo.model_validate(r.json()))

    async def predict(self, model: str, path: str | os.PathLike[str], *, conf: float = 0.25,
                      iou: float = 0.45, imgsz: int | None = None, max_det: int = 300,
                      timeout: float | None = 120.0) -> list[Box]:
        """See :meth:`Client.predict`."""
        job = await self.submit_predict(model, path, conf=conf, iou=iou, imgsz=imgsz,
                                        max_det=max_det)
        await job.wait(timeout)
        return await job.boxes()

    async def job(self, job_id: str) -> AsyncJob:
        """See :meth:`Client.job`."""
        return AsyncJob(self, JobInfo.model_validate(await self._json("GET",
                                                                      f"/v1/jobs/{job_id}")))

    async def jobs(self, status: str | list[str] | None = None, kind: str | None = None,
                   limit: int | None = 50) -> list[AsyncJob]:
        """See :meth:`Client.jobs`."""
        out: list[AsyncJob] = []
        cursor: str | None = None
        while True:
            page = await self._json("GET", "/v1/jobs",
                                    params=self._jobs_query(status, kind, limit, len(out),
                                                            cursor))
            out += [AsyncJob(self, JobInfo.model_validate(j)) for j in page["data"]]
            if (cursor := self._jobs_done(page, limit, len(out))) is None:
                return out

    async def resume(self, job_id: str) -> AsyncJob:
        """See :meth:`Client.resume`."""
        return AsyncJob(self, JobInfo.model_validate(
            await self._json("POST", f"/v1/jobs/{job_id}/resume")))

    async def cancel(self, job_id: str) -> JobInfo:
        """See :meth:`Client.cancel`."""
        try:
            return JobInfo.model_validate(await self._json("POST", f"/v1/jobs/{job_id}/cancel"))
        except Conflict as exc:
            if exc.problem.get("status_now") == JobStatus.CANCELLED:
                return (await self.job(job_id)).info
            raise

    # -- datasets ---------------------------------------------------------------------
    async def register_dataset(self, path: str | os.PathLike[str], name: str | None = None
                               ) -> DatasetInfo:
        """See :meth:`Client.register_dataset`."""
        return DatasetInfo.model_validate(await self._json(
            "POST", "/v1/datasets/register", json=self._register_body(path, name),
            idempotent=False))

    async def upload_dataset(self, path_or_zip: str | os.PathLike[str],
                             name: str | None = None, *,
                             progress: bool | ProgressFn = False) -> DatasetInfo:
        """See :meth:`Client.upload_dataset` (a folder is zipped in a worker thread)."""
        src, name = _transfer.dataset_source(path_or_zip, name)
        zipped = await asyncio.to_thread(_transfer.zip_folder, src) if src.is_dir() else src
        report = _transfer.progress_fn(progress, f"upload {name}")
        try:
            total = zipped.stat().st_size
            r = await self.wire.request(
                **_transfer.upload_request("/v1/datasets", name, total, "application/zip"),
                content=_afile_chunks(zipped, total, report))
            return DatasetInfo.model_validate(r.json())
        finally:
            if zipped is not src:
                zipped.unlink(missing_ok=True)

    async def datasets(self) -> list[DatasetInfo]:
        """See :meth:`Client.datasets`."""
        return [DatasetInfo.model_validate(d)
                for d in (await self._json("GET", "/v1/datasets"))["data"]]

    async def delete_dataset(self, dataset_id: str) -> None:
        """See :meth:`Client.delete_dataset`."""
        await self._request("DELETE", f"/v1/datasets/{dataset_id}")

    # -- models -----------------------------------------------------------------------
    async def upload_model(self, path: str | os.PathLike[str], name: str | None = None, *,
                           progress: bool | ProgressFn = False) -> Model:
        """See :meth:`Client.upload_model`."""
        src, name = _transfer.model_source(path, name)
        report = _transfer.progress_fn(progress, f"upload {name}")
        total = src.stat().st_size
        r = await self.wire.request(
            **_transfer.upload_request("/v1/models", name, total, "application/octet-stream"),
            content=_afile_chunks(src, total, report))
        return Model.model_validate(r.json()).bind(self)

    async def models(self) -> list[Model]:
        """See :meth:`Client.models`."""
        return [Model.model_validate(m).bind(self)
                for m in (await self._json("GET", "/v1/models"))["data"]]

    async def model(self, model_id: str) -> Model:
        """See :meth:`Client.model`."""
        return Model.model_validate(await self._json("GET", f"/v1/models/{model_id}")).bind(self)

    async def export_model(self, model_id: str, format: str = "onnx", *, wait: bool = True,
                           timeout: float = 1800.0) -> Model:
        """See :meth:`Client.export_model` (also ``await model.export("onnx")``)."""
        model = Model.model_validate(await self._json(
            "POST", f"/v1/models/{model_id}/export", params={"format": format})).bind(self)
        for text in model.warnings:
            warnings.warn(text, SubmitWarning, stacklevel=2)
        if not wait:
            return model
        return Model.bind(await self.wire.run(Steps(_transfer.model_ready(
            model, exported, timeout, lambda m: f"model {model_id}: the ONNX export is "
            f"still {m.onnx.state} after {timeout:g} s"))), self)

    async def delete_model(self, model_id: str) -> None:
        """See :meth:`Client.delete_model`."""
        await self._request("DELETE", f"/v1/models/{model_id}")

    async def download_model(self, model_id: str, dest: str | os.PathLike[str] | None = None,
                             *, format: str = "pt") -> Path:
        """See :meth:`Client.download_model`."""
        return Path(await self.wire.run(Steps(_transfer.download_model(
            model_id, dest, format, retries=self.retries, delay=self.wire.delay))))


class AsyncJob:
    """Async twin of :class:`~libreyolo_client.Job`; its properties read the job as last
    read (see the module docstring)."""

    def __init__(self, client: AsyncClient, info: JobInfo):
        self._client = client
        self.id = info.id
        self.info = info

    def __repr__(self) -> str:
        return f"<AsyncJob {self.id} {self.info.kind} {self.info.model} {self.info.status}>"

    @property
    def _wire(self) -> AsyncWire:
        """The client's HTTP layer (:attr:`AsyncClient.wire`)."""
        return self._client.wire

    @property
    def status(self) -> JobStatus | str:
        """See :attr:`Job.status`."""
        return self.info.status

    @property
    def page_url(self) -> str:
        """The job's page in the browser."""
        return self._client.page_url(self.id)

    @property
    def result(self) -> dict[str, Any] | None:
        """The result of the job as last read (see :attr:`Job.result`); None while it
        runs."""
        return self.info.result

    @property
    def metrics(self) -> dict[str, Any]:
        """Final metrics as last read (see :attr:`Job.metrics`), or ``{}``."""
        return dict((self.result or {}).get("metrics") or {})

    @property
    def lever(self) -> dict[str, Any]:
        """A profile job's lever as last read (see :attr:`Job.lever`), or ``{}``."""
        return dict((self.result or {}).get("lever") or {})

    @property
    def tune(self) -> TuneReport | None:
        """A finished tune job's result as typed data (see :attr:`Job.tune`), from the job as
        last read (``await job.refresh()`` first); ``None`` otherwise."""
        data = (self.info.result or {}).get("tune") if self.info.done else None
        return TuneReport.model_validate(data) if isinstance(data, dict) else None

    @property
    def preflight(self) -> Preflight | None:
        """A train job's preflight estimate from the job as last read (see
        :attr:`Job.preflight`)."""
        data = (self.info.result or {}).get("preflight") or (self.info.progress or {}).get("preflight")
        return Preflight.model_validate(data) if isinstance(data, dict) and \
            data.get("total_s") is not None else None

    async def refresh(self) -> JobInfo:
        """Read the job again."""
        self.info = JobInfo.model_validate(await self._wire.json("GET", f"/v1/jobs/{self.id}"))
        return self.info

    async def cancel(self) -> JobInfo:
        """Cancel the job."""
        self.info = await self._client.cancel(self.id)
        return self.info

    # -- following -------------------------------------------------------------------
    def events(self, after: int = 0, *, follow: bool = True, timeout: float | None = None
               ) -> AsyncIterator[Event]:
        """The job's events in order, each once; see :meth:`Job.events`."""
        return self._wire.drive(Follower(self, after, follow=follow, timeout=timeout,
                                         delay=self._wire.delay))

    async def wait(self, timeout: float | None = None, *, progress: bool = False,
                   on_event: EventFn | None = None, raise_on_failure: bool = True) -> JobInfo:
        """See :meth:`Job.wait`."""
        printer = EventPrinter(self.id) if progress else None
        try:
            async for ev in self.events(timeout=timeout):
                if printer:
                    printer(ev)
                if on_event:
                    on_event(ev)
        finally:
            if printer:
                printer.close()
        info = await self.refresh()
        deadline = _final_deadline(timeout)
        while not info.done:  # `end` came before the row was re-read (replica lag): poll
            if deadline is not None and time.monotonic() > deadline:
                raise WaitTimeout(f"job {self.id} still {info.status}")
            await asyncio.sleep(0.5)
            info = await self.refresh()
        return _final(info, raise_on_failure)

    def logs(self, *, follow: bool = False, tail: int | None = None,
             poll_s: float = 1.0) -> AsyncIterator[str]:
        """The engine's log line by line (``async for``); see :meth:`Job.logs`."""
        return self._wire.drive(Steps(_transfer.log_lines(self, follow=follow, tail=tail,
                                                          poll_s=poll_s)))

    # -- artifacts -------------------------------------------------------------------
    async def publish(self, name: str, *, wait: bool = True, timeout: float = 300.0) -> Model:
        """See :meth:`Job.publish`."""
        model = Model.model_validate(await self._wire.json(
            "POST", f"/v1/jobs/{self.id}/publish", json={"name": name}, idempotent=False,
            timeout=httpx.Timeout(60.0, connect=10.0))).bind(self._client)
        if not wait:
            return model
        return Model.bind(await self._wire.run(Steps(_transfer.model_ready(
            model, published, timeout,
            lambda m: f"model {m.id} is still {m.state} after {timeout:g} s"))), self._client)

    async def report(self) -> ValReport:
        """See :meth:`Job.report`."""
        r = await self._wire.request("GET", f"/v1/jobs/{self.id}/artifacts/val/report.json")
        return ValReport.model_validate(r.json())

    async def artifacts(self) -> list[ArtifactInfo]:
        """See :meth:`Job.artifacts`."""
        page = await self._wire.json("GET", f"/v1/jobs/{self.id}/artifacts")
        return [ArtifactInfo.model_validate(a) for a in page["data"]]

    async def boxes(self) -> list[Box]:
        """See :meth:`Job.boxes`."""
        if not (self.info.result or {}).get("predict"):
            await self.refresh()
        names = ((self.info.result or {}).get("predict") or {}).get("names") or {}
        r = await self._wire.request("GET", f"/v1/jobs/{self.id}/artifacts/predictions.json")
        return boxes_from(r.json(), names)

    async def download(self, path: str = "weights/best.pt",
                       dest: str | os.PathLike[str] | None = None, *,
                       progress: bool | ProgressFn = False) -> Path:
        """See :meth:`Job.download`."""
        return Path(await self._wire.run(Steps(_transfer.download_artifact(
            self, path, dest, retries=self._wire.retries, delay=self._wire.delay,
            report=_transfer.progress_fn(progress, f"download {path}")))))
