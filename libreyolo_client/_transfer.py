"""Downloads, uploads and log reading, written once for both clients (no network I/O here).

Each download and the log reader is a :data:`~libreyolo_client._steps.Procedure`: a
generator of operations that ``Client`` and ``AsyncClient`` perform with their one driver
(:mod:`libreyolo_client._steps`). Uploads are one request each: their checks and request
keywords are built here, and the drivers only supply the body (an iterator of chunks,
blocking or async). Local file work (stat, rename, the zip of a dataset folder) is done
here or by the driver's :class:`~libreyolo_client._steps.Hash`.

The download rules, as ``Job.download`` documents them:

- A ``dest`` that already holds the right bytes (size and sha256 known) is kept.
- The bytes go to ``<dest>.part``; a part left by an interrupted download is resumed with
  ``Range: bytes=<size>-`` (a 416 means it is already complete when its size is the known
  size, else it is discarded).
- No answer, a 502/503/504 or a connection cut short is retried with the client's backoff,
  at most ``retries`` times, keeping the part; then :class:`ServiceUnavailable`.
- A sha256 that differs from the one the service recorded discards the part and downloads
  once more from the start; then :class:`ChecksumError`.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import httpx

from libreyolo_client._errors import (
    APIError,
    ChecksumError,
    ServiceUnavailable,
    WaitTimeout,
    error_from_response,
    no_answer,
)
from libreyolo_client._models import ArtifactInfo, JobInfo, Model
from libreyolo_client._steps import (
    CloseStream,
    Deliver,
    GetPage,
    GetRaw,
    Hash,
    OpenFile,
    Procedure,
    ProgressFn,
    Save,
    Sleep,
)

__all__ = ["CHUNK", "UPLOAD_TIMEOUT", "dataset_source", "dest_path", "download_artifact",
           "download_model", "file_chunks", "log_lines", "model_ready", "model_source",
           "progress_fn",
           "upload_request", "zip_folder"]

#: bytes per read of a file sent or hashed.
CHUNK = 1 << 20
#: an upload's timeouts: reads are long because a dataset upload waits for the scan.
UPLOAD_TIMEOUT = httpx.Timeout(600.0, connect=10.0)
#: a download's timeouts, per phase.
DOWNLOAD_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
#: where the service looks for a dataset's yaml in an upload (its top, or one folder down).
YAMLS = ("*.yaml", "*/*.yaml", "*.yml", "*/*.yml")


class _Job(Protocol):
    id: str
    info: JobInfo


# -- local paths ------------------------------------------------------------------------

def dest_path(path: str, dest: str | os.PathLike[str] | None) -> Path:
    """Where a download of ``path`` goes: ``dest`` when it names a file, ``dest/<name>``
    when it is a folder (existing, or written with a trailing slash), else the current
    folder."""
    name = Path(path).name
    if dest is None:
        return Path.cwd() / name
    d = Path(dest).expanduser()
    if d.is_dir() or os.fspath(dest).endswith(("/", os.sep)):
        return d / name
    return d


def progress_fn(progress: bool | ProgressFn | None, label: str) -> ProgressFn | None:
    """The progress callback of a transfer: ``progress`` itself when callable, a printer
    of ``label: done/total MiB (pct%)`` to stderr (at most twice a second) when True,
    else None."""
    if callable(progress):
        return progress
    if not progress:
        return None
    last = [0.0]

    def show(done: int, total: int | None) -> None:
        now = time.monotonic()
        if now - last[0] < 0.5 and done != total:
            return
        last[0] = now
        pct = f" ({100 * done / total:.0f}%)" if total else ""
        sys.stderr.write(f"\r{label}: {done / 2**20:.1f}"
                         f"{f'/{total / 2**20:.1f}' if total else ''} MiB{pct}")
        if total and done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show


# -- uploads ----------------------------------------------------------------------------

def dataset_source(path_or_zip: str | os.PathLike[str], name: str | None) -> tuple[Path, str]:
    """``(the folder or zip to upload, the dataset's name)`` for ``upload_dataset``.

    Raises:
        FileNotFoundError: no such folder or file, or a folder without a dataset yaml
            (:data:`YAMLS`).
        ValueError: a file that is not a zip (a dataset yaml is named: its folder, zipped,
            or ``register_dataset`` for a yaml the service can read).
    """
    src = Path(path_or_zip).expanduser()
    if not src.exists():
        raise FileNotFoundError(f"dataset {src} does not exist")
    if src.is_file() and not zipfile.is_zipfile(src):
        hint = (f"upload its folder ({src.parent}) or a zip of it; register_dataset / "
                "`datasets register` takes a yaml the service's host can read"
                if src.suffix.lower() in (".yaml", ".yml") else "upload a folder or a zip")
        raise ValueError(f"{src} is not a zip: {hint}")
    if src.is_dir() and not any(next(src.glob(pattern), None) for pattern in YAMLS):
        raise FileNotFoundError(
            f"dataset folder {src} holds no dataset yaml (e.g. {src / 'data.yaml'}, or "
            "one folder down): the yaml names the image folders and the classes")
    return src, name or (src.name if src.is_dir() else src.stem)


def model_source(path: str | os.PathLike[str], name: str | None) -> tuple[Path, str]:
    """``(the weights file, the model's name)`` for ``upload_model``.

    Raises:
        FileNotFoundError: no such file.
    """
    src = Path(path).expanduser()
    if not src.is_file():
        raise FileNotFoundError(f"weights file {src} does not exist")
    return src, name or src.stem


def zip_folder(folder: Path) -> Path:
    """Zip a dataset folder to a temporary file (label caches left out). Caller deletes it."""
    fd, name = tempfile.mkstemp(prefix=f"{folder.name}-", suffix=".zip")
    os.close(fd)
    with zipfile.ZipFile(name, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for p in sorted(folder.rglob("*")):
            if p.is_file() and not p.is_symlink() and not p.name.endswith(".cache"):
                zf.write(p, p.relative_to(folder).as_posix())
    return Path(name)


def upload_request(path: str, name: str, total: int, content_type: str) -> dict[str, Any]:
    """The keywords of an upload's ``POST path?name=`` (``/v1/datasets``: a zip,
    ``/v1/models``: a weights file) of ``total`` bytes, less its body; sent once (a
    retried upload could register twice)."""
    return {"method": "POST", "path": path, "params": {"name": name}, "idempotent": False,
            "headers": {"Content-Type": content_type, "Content-Length": str(total)},
            "timeout": UPLOAD_TIMEOUT}


def file_chunks(path: Path, total: int, report: ProgressFn | None) -> Iterator[bytes]:
    """The bytes of ``path`` in :data:`CHUNK`-sized pieces for a streamed upload body,
    calling ``report(sent, total)`` after each."""
    sent = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            sent += len(chunk)
            yield chunk
            if report:
                report(sent, total)


# -- downloads --------------------------------------------------------------------------

def download_artifact(job: _Job, path: str, dest: str | os.PathLike[str] | None, *,
                      retries: int, delay: Callable[[int], float],
                      report: ProgressFn | None) -> Procedure:
    """``Job.download``: the artifact ``path`` of ``job`` to ``dest``; returns its
    :class:`Path`. ``delay(attempt)``: the client's backoff in seconds."""
    target = dest_path(path, dest)
    target.parent.mkdir(parents=True, exist_ok=True)
    page = yield GetPage(f"/v1/jobs/{job.id}/artifacts", {})
    known = {a.path: a for a in (ArtifactInfo.model_validate(x) for x in page["data"])}.get(path)
    return (yield from _download(
        f"/v1/jobs/{job.id}/artifacts/{path}", {}, target, f"{path} of job {job.id}",
        known.sha256 if known else None, known.size_bytes if known else None,
        retries=retries, delay=delay, report=report))


def download_model(model_id: str, dest: str | os.PathLike[str] | None, format: str, *,
                   retries: int, delay: Callable[[int], float]) -> Procedure:
    """``Client.download_model``: the model's weights (``format`` ``pt``) or ONNX export
    (``onnx``) to ``dest`` (default ``<model name>.<format>`` here); returns its
    :class:`Path`.

    Raises:
        ValueError: another format (before anything is sent).
    """
    if format not in ("pt", "onnx"):
        raise ValueError(f"format={format!r}: choose pt or onnx")
    info = Model.model_validate((yield GetPage(f"/v1/models/{model_id}", {})))
    target = dest_path(f"{info.name}.{format}", dest)
    # the export's digest, or "" when it is not ready: the file then answers 409, which is
    # raised before any digest is compared
    expected = str((info.onnx.info or {}).get("sha256", "")) if format == "onnx" \
        else info.sha256
    size = (info.onnx.info or {}).get("bytes") if format == "onnx" else info.bytes
    target.parent.mkdir(parents=True, exist_ok=True)
    return (yield from _download(
        f"/v1/models/{model_id}/file", {"format": format}, target, f"model {model_id}",
        expected, size if isinstance(size, int) else None, retries=retries, delay=delay,
        report=None))


def _download(url: str, params: dict[str, Any], target: Path, what: str,
              known_sha: str | None, known_size: int | None, *, retries: int,
              delay: Callable[[int], float], report: ProgressFn | None) -> Procedure:
    """The download rules of the module docstring; returns ``target``."""
    if known_sha and known_size is not None and target.is_file() \
            and target.stat().st_size == known_size and (yield Hash(target)) == known_sha:
        return target
    part = target.with_name(target.name + ".part")
    fresh_tries, attempt = 0, 0
    while True:
        try:
            expected = yield from _fetch(url, params, part, known_sha, known_size, report)
        except (httpx.TransportError, ServiceUnavailable) as exc:
            yield CloseStream()
            if attempt >= retries:
                raise no_answer(exc, None) from exc
            yield Sleep(delay(attempt))
            attempt += 1
            continue
        if not expected or (yield Hash(part)) == expected:
            os.replace(part, target)
            return target
        part.unlink(missing_ok=True)
        if fresh_tries >= 1:
            raise ChecksumError(f"{what}: sha256 differs from {expected} after a fresh "
                                "download")
        fresh_tries += 1


def _fetch(url: str, params: dict[str, Any], part: Path, known_sha: str | None,
           known_size: int | None, report: ProgressFn | None) -> Procedure:
    """Fill ``part`` from its current size. Returns the expected sha256 (or None)."""
    while True:
        offset = part.stat().st_size if part.exists() else 0
        r = yield OpenFile(url, params, {"Range": f"bytes={offset}-"} if offset else {},
                           DOWNLOAD_TIMEOUT)
        if r.status_code == 416:  # the part is already complete (or longer than the file)
            yield CloseStream()
            if known_size is not None and offset == known_size:
                return known_sha
            part.unlink(missing_ok=True)
            continue
        if r.status_code >= 400:
            raise error_from_response(r)
        expected = r.headers.get("x-content-sha256") or known_sha
        mode, done, total = _resume_point(r, offset)
        done = yield Save(part, mode, done, total, report)
        yield CloseStream()
        if total is not None and done < total:
            raise httpx.RemoteProtocolError(f"connection closed at {done}/{total} bytes")
        return expected


def _resume_point(r: httpx.Response, offset: int) -> tuple[str, int, int | None]:
    """``(file mode, bytes already there, total bytes or None)`` for the answer ``r`` to a
    request from ``offset``: a 206 appends, a 200 starts over.

    Raises:
        APIError: a 206 whose ``Content-Range`` does not start at ``offset``.
    """
    if r.status_code != 206:
        total = int(r.headers["content-length"]) if "content-length" in r.headers else None
        return "wb", 0, total
    content_range = r.headers.get("content-range", "")
    if content_range.removeprefix("bytes ").split("-")[0] != str(offset):
        raise APIError(206, f"unexpected Content-Range {content_range}")
    return "ab", offset, int(content_range.rsplit("/", 1)[-1] or 0) or None


# -- models ---------------------------------------------------------------------------

def model_ready(model: Model, ready: Callable[[Model], bool], timeout: float,
                still: Callable[[Model], str]) -> Procedure:
    """Poll ``GET /v1/models/{id}`` (0.2 s, then 1.5 times longer each time, at most 2 s)
    until ``ready(model)`` (``published`` after a publish, ``exported`` after an export;
    they raise when the model failed); returns the model as last read (not bound).

    Raises:
        WaitTimeout: not ready after ``timeout`` seconds; ``still(model)`` says so.
    """
    deadline = time.monotonic() + timeout
    delay = 0.2
    while not ready(model):
        if time.monotonic() > deadline:
            raise WaitTimeout(still(model))
        yield Sleep(delay)
        delay = min(2.0, delay * 1.5)
        model = Model.model_validate((yield GetPage(f"/v1/models/{model.id}", {})))
    return model


# -- logs -------------------------------------------------------------------------------

def log_lines(job: _Job, *, follow: bool, tail: int | None, poll_s: float) -> Procedure:
    """``Job.logs``: delivers the lines of the job's ``train.log`` (without their line
    breaks); with ``follow`` it reads until the job is terminal (re-reading ``job.info``,
    :data:`Sleep` ``poll_s`` between empty reads); ``tail``: start with the last lines."""
    path = f"/v1/jobs/{job.id}/logs"
    offset, buf = 0, b""
    if tail:
        r = yield GetRaw(path, {"tail": tail})
        for ln in r.text.splitlines():
            yield Deliver(ln)
        offset = int(r.headers.get("x-log-size", "0"))
    while True:
        if follow:
            job.info = JobInfo.model_validate((yield GetPage(f"/v1/jobs/{job.id}", {})))
        done = job.info.done if follow else True
        r = yield GetRaw(path, {"offset": offset})
        data = r.content
        # the answer ends at X-Log-Size, in the file's bytes; the text itself may be shorter
        # or longer (the service rewrites its own paths), so its length is no offset
        size = r.headers.get("x-log-size")
        offset = int(size) if size is not None else offset + len(data)
        buf += data
        *lines, buf = buf.split(b"\n")
        for ln in lines:
            yield Deliver(ln.decode("utf-8", "replace").rstrip("\r"))
        if done:
            if buf:
                yield Deliver(buf.decode("utf-8", "replace"))
            return None
        if not data:
            yield Sleep(poll_s)
