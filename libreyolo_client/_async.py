"""``AsyncClient`` and ``AsyncJob``: the asyncio twin of :mod:`libreyolo_client._client`.

Same arguments, same errors, same retry rules; request building and reply parsing come
from the shared :class:`~libreyolo_client._client._Base`. Dataset upload and log following
are sync-only (use :class:`~libreyolo_client.Client` for those).
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

from libreyolo_client import _follow
from libreyolo_client._client import (
    CHUNK,
    DEFAULT_TIMEOUT,
    JOB_OPTIONS,
    RETRY_STATUSES,
    TUNE_OPTIONS,
    _Base,
    _download_target,
    _final,
    _final_deadline,
    _request_of,
    _sha256,
)
from libreyolo_client._errors import (
    ChecksumError,
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
    Event,
    JobInfo,
    Model,
    Preflight,
    TuneReport,
    boxes_from,
    exported,
    published,
)
from libreyolo_client._sse import SSEvent, aparse_sse

__all__ = ["AsyncClient", "AsyncJob"]


class AsyncClient(_Base):
    """Asyncio client; arguments as :class:`~libreyolo_client.Client`.

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

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _request(self, method: str, path: str, *, idempotent: bool = True,
                       **kw: Any) -> httpx.Response:
        attempt = 0
        while True:
            r: httpx.Response | None = None
            try:
                r = await self._http.request(method, path, **kw)
            except ValueError as exc:  # httpx encodes json= strictly: no NaN or infinity
                raise unsendable(exc, kw.get("json")) from exc
            except httpx.TransportError as exc:
                if not idempotent or attempt >= self.retries:
                    raise no_answer(exc, _request_of(exc)) from exc
            else:
                if r.status_code not in RETRY_STATUSES or not idempotent \
                        or attempt >= self.retries:
                    return self._check(r)
            await asyncio.sleep(self._delay(attempt, r))
            attempt += 1

    async def _json(self, method: str, path: str, **kw: Any) -> Any:
        return (await self._request(method, path, **kw)).json()

    async def _drive(self, follower: Follower) -> AsyncIterator[Event]:
        """Async twin of ``Client._drive``: performs a follower's operations
        (:mod:`libreyolo_client._follow`), awaiting; yields the events it delivers."""
        with contextlib.closing(follower):
            async with contextlib.AsyncExitStack() as stream:
                lines: AsyncIterator[SSEvent] | None = None
                while (op := follower.next_op()) is not None:
                    try:
                        if isinstance(op, _follow.Deliver):
                            yield op.event
                        elif isinstance(op, _follow.Sleep):
                            await asyncio.sleep(op.seconds)
                        elif isinstance(op, _follow.GetPage):
                            follower.answer(await self._json("GET", op.path, params=op.params))
                        elif isinstance(op, _follow.OpenStream):
                            r = await stream.enter_async_context(self._http.stream(
                                "GET", op.path, headers=op.headers, timeout=op.timeout))
                            if r.status_code >= 400:
                                await r.aread()
                                raise error_from_response(r)
                            lines = aparse_sse(r.aiter_lines())
                            follower.answer(r.headers.get("content-type", ""))
                        elif isinstance(op, _follow.NextSSE):
                            follower.answer(await anext(lines, None) if lines is not None
                                            else None)
                        elif isinstance(op, _follow.CloseStream):
                            await stream.aclose()
                    except Exception as exc:
                        await stream.aclose()
                        follower.fail(exc)

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
                    gpus: int | None = None, **kw: Any) -> AsyncJob:
        """See :meth:`Client.train` (``procs``, ``nodes``, ``priority``, ``time_budget_s`` and
        ``idempotency_key`` are options; every other keyword is a training key)."""
        opts = {k: kw.pop(k) for k in JOB_OPTIONS if k in kw}
        return await self.submit("train", model, data, gpus=gpus, params=kw, **opts)

    async def profile(self, model: str = "yolo9-t", data: str | os.PathLike[str] = "",
                      gpus: int | None = None, **kw: Any) -> AsyncJob:
        """See :meth:`Client.profile`."""
        opts = {k: kw.pop(k) for k in JOB_OPTIONS if k in kw}
        return await self.submit("profile", model, data, gpus=gpus, params=kw, **opts)

    async def tune(self, model: str = "yolo9-t", data: str | os.PathLike[str] = "",
                   gpus: int | None = None, **kw: Any) -> AsyncJob:
        """See :meth:`Client.tune` (``repeat``, ``warmup``, ``steps``, ``max_candidates``,
        ``budget_s``, ``min_gain`` are the tune's options; ``procs``, ``nodes``, ``priority``,
        ``time_budget_s``, ``idempotency_key`` the job's; every other keyword a training key)."""
        opts = {k: kw.pop(k) for k in JOB_OPTIONS if k in kw}
        tune = {k: kw.pop(k) for k in TUNE_OPTIONS if k in kw}
        return await self.submit("tune", model, data, gpus=gpus, params=kw,
                                 tune={k: v for k, v in tune.items() if v is not None}, **opts)

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
                   limit: int = 50) -> list[AsyncJob]:
        """Your newest ``limit`` (at most 200) jobs; see :meth:`Client.jobs`."""
        q: dict[str, Any] = {"limit": max(1, min(200, limit))}
        if status:
            q["status"] = status.split(",") if isinstance(status, str) else list(status)
        if kind:
            q["kind"] = kind
        page = await self._json("GET", "/v1/jobs", params=q)
        return [AsyncJob(self, JobInfo.model_validate(j)) for j in page["data"]]

    async def cancel(self, job_id: str) -> JobInfo:
        """See :meth:`Client.cancel`."""
        try:
            return JobInfo.model_validate(await self._json("POST", f"/v1/jobs/{job_id}/cancel"))
        except Conflict as exc:
            if exc.problem.get("status_now") == "cancelled":
                return (await self.job(job_id)).info
            raise


    async def upload_model(self, path: str | os.PathLike[str], name: str | None = None
                           ) -> Model:
        """See :meth:`Client.upload_model` (no progress callback)."""
        src = Path(path).expanduser()
        if not src.is_file():
            raise FileNotFoundError(f"weights file {src} does not exist")

        async def body() -> AsyncIterator[bytes]:
            with open(src, "rb") as f:
                while chunk := await asyncio.to_thread(f.read, CHUNK):
                    yield chunk

        r = await self._request("POST", "/v1/models", params={"name": name or src.stem},
                                content=body(), idempotent=False,
                                headers={"Content-Type": "application/octet-stream",
                                         "Content-Length": str(src.stat().st_size)},
                                timeout=httpx.Timeout(600.0, connect=10.0))
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
        deadline = time.monotonic() + timeout
        delay = 0.2
        while wait and not exported(model):
            if time.monotonic() > deadline:
                raise WaitTimeout(f"model {model_id}: the ONNX export is still "
                                  f"{model.onnx.state} after {timeout:g} s")
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 1.5)
            model = await self.model(model_id)
        return model

    async def download_model(self, model_id: str, dest: str | os.PathLike[str] | None = None,
                             *, format: str = "pt") -> Path:
        """See :meth:`Client.download_model`."""
        info = await self.model(model_id)
        target, expected = _download_target(self, info, dest, format)
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(target.name + ".part")
        async with self._http.stream("GET", f"/v1/models/{model_id}/file",
                                     params={"format": format},
                                     timeout=httpx.Timeout(30.0, connect=10.0)) as r:
            if r.status_code >= 400:
                await r.aread()
                raise error_from_response(r)
            with open(part, "wb") as f:
                async for chunk in r.aiter_bytes():
                    await asyncio.to_thread(f.write, chunk)
        if await asyncio.to_thread(_sha256, part) != expected:
            part.unlink(missing_ok=True)
            raise ChecksumError(f"model {model_id}: the downloaded bytes differ from sha256 "
                                f"{expected}")
        os.replace(part, target)
        return target

    async def delete_model(self, model_id: str) -> None:
        """See :meth:`Client.delete_model`."""
        await self._request("DELETE", f"/v1/models/{model_id}")


class AsyncJob:
    """Async twin of :class:`~libreyolo_client.Job`."""

    def __init__(self, client: AsyncClient, info: JobInfo):
        self._client, self.id, self.info = client, info.id, info

    def __repr__(self) -> str:
        return f"<AsyncJob {self.id} {self.info.kind} {self.info.model} {self.info.status}>"

    @property
    def status(self) -> str:
        return self.info.status

    @property
    def page_url(self) -> str:
        return self._client.page_url(self.id)

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
        self.info = JobInfo.model_validate(await self._client._json("GET", f"/v1/jobs/{self.id}"))
        return self.info

    async def cancel(self) -> JobInfo:
        """Cancel the job."""
        self.info = await self._client.cancel(self.id)
        return self.info

    async def publish(self, name: str, *, wait: bool = True, timeout: float = 300.0) -> Model:
        """See :meth:`Job.publish`."""
        model = Model.model_validate(await self._client._json(
            "POST", f"/v1/jobs/{self.id}/publish", json={"name": name}, idempotent=False,
            timeout=httpx.Timeout(60.0, connect=10.0))).bind(self._client)
        deadline = time.monotonic() + timeout
        delay = 0.2
        while wait and not published(model):
            if time.monotonic() > deadline:
                raise WaitTimeout(f"model {model.id} is still {model.state} after {timeout:g} s")
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 1.5)
            model = await self._client.model(model.id)
        return model

    async def artifacts(self) -> list[ArtifactInfo]:
        """See :meth:`Job.artifacts`."""
        page = await self._client._json("GET", f"/v1/jobs/{self.id}/artifacts")
        return [ArtifactInfo.model_validate(a) for a in page["data"]]

    async def boxes(self) -> list[Box]:
        """See :meth:`Job.boxes`."""
        if not (self.info.result or {}).get("predict"):
            await self.refresh()
        names = ((self.info.result or {}).get("predict") or {}).get("names") or {}
        r = await self._client._request("GET", f"/v1/jobs/{self.id}/artifacts/predictions.json")
        return boxes_from(r.json(), names)

    def events(self, after: int = 0, *, follow: bool = True, timeout: float | None = None
               ) -> AsyncIterator[Event]:
        """The job's events in order, each once; see :meth:`Job.events`."""
        return self._client._drive(Follower(self, after, follow=follow, timeout=timeout,
                                            delay=self._client._delay))

    async def wait(self, timeout: float | None = None, *, raise_on_failure: bool = True
                   ) -> JobInfo:
        """See :meth:`Job.wait`."""
        async for _ in self.events(timeout=timeout):
            pass
        info = await self.refresh()
        deadline = _final_deadline(timeout)
        while not info.done:  # `end` came before the row was re-read (replica lag): poll
            if deadline is not None and time.monotonic() > deadline:
                raise WaitTimeout(f"job {self.id} still {info.status}")
            await asyncio.sleep(0.5)
            info = await self.refresh()
        return _final(info, raise_on_failure)

    async def download(self, path: str = "weights/best.pt",
                       dest: str | os.PathLike[str] | None = None) -> Path:
        """Download one artifact with Range resume and a sha256 check; see
        :meth:`Job.download`."""
        c = self._client
        target = c._dest(path, dest)
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(target.name + ".part")
        url = f"/v1/jobs/{self.id}/artifacts/{path}"
        fresh, attempt = 0, 0
        while True:
            offset = part.stat().st_size if part.exists() else 0
            try:
                async with c._http.stream("GET", url, headers={"Range": f"bytes={offset}-"}
                                          if offset else {}) as r:
                    if r.status_code == 416:
                        await r.aread()
                        part.unlink(missing_ok=True)
                        continue
                    if r.status_code >= 400:
                        await r.aread()
                        raise error_from_response(r)
                    expected = r.headers.get("x-content-sha256")
                    with open(part, "ab" if r.status_code == 206 else "wb") as f:
                        async for chunk in r.aiter_bytes():
                            f.write(chunk)
            except (httpx.TransportError, ServiceUnavailable) as exc:
                if attempt >= c.retries:
                    raise no_answer(exc, None) from exc
                await asyncio.sleep(c._delay(attempt))
                attempt += 1
                continue
            if expected is None or _sha256(part) == expected:
                os.replace(part, target)
                return target
            part.unlink(missing_ok=True)
            if fresh:
                raise ChecksumError(f"{path} of job {self.id}: sha256 differs from {expected}")
            fresh += 1
