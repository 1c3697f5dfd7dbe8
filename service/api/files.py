"""Serving a stored file whose headers describe the bytes sent: ``serve_file``.

Used for job artifacts (``/v1/jobs/{id}/artifacts/{path}``) and meant for every other
download of a stored file (model files), so all of them answer ``GET`` and ``HEAD`` with
the same rules:

- ``ETag`` is ``"<sha256>"`` of the file as it is now, with ``X-Content-SHA256`` and
  ``Repr-Digest``. The caller passes the digest it recorded (:class:`RecordedDigest`);
  when the file's size differs or it was modified after the digest was recorded (a resume
  rewrote ``last.pt``), the sha256 is **recomputed** from the file and returned, so the
  caller can store the new one. Recompute-on-change was chosen over immutable artifacts
  because resuming a job legitimately rewrites its checkpoints.
- ``If-None-Match`` answers 304 only for the current ETag (``*`` matches any file).
- ``Range`` gives 206 (Starlette's ``FileResponse``); ``If-Range`` with any other
  validator than the current ETag gives the whole file (200).
- Without a recorded digest (a running job's files) no sha256 is computed; Starlette's
  ETag of size and mtime still changes whenever the file does.

The file is stat-ed again after hashing; if it changed meanwhile, it is hashed again (up to
three times), so the headers describe the bytes sent unless a writer replaces the file in
the instant between the last check and the open.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from fastapi import Response
from fastapi.responses import FileResponse

from service.storage.local import sha256_file

__all__ = ["RecordedDigest", "FileDigest", "current_digest", "serve_file"]


@dataclass(frozen=True)
class RecordedDigest:
    """What the database says about a file: ``sha256`` (hex), ``size`` (bytes) and
    ``recorded_at`` (when the digest was taken; naive values are UTC)."""

    sha256: str
    size: int
    recorded_at: datetime


@dataclass(frozen=True)
class FileDigest:
    """The digest of the file as it is now; ``changed`` when it differs from the recorded
    one (the caller should store ``sha256``/``size``)."""

    sha256: str
    size: int
    stat: os.stat_result
    changed: bool


def _stale(st: os.stat_result, known: RecordedDigest) -> bool:
    at = known.recorded_at if known.recorded_at.tzinfo else known.recorded_at.replace(tzinfo=UTC)
    return st.st_size != known.size or st.st_mtime > at.timestamp()


def _key(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def current_digest(file: Path, known: RecordedDigest) -> FileDigest:
    """The sha256 of ``file`` now: ``known`` when the file is unchanged since it was
    recorded, else recomputed (blocking; 1 MiB reads).

    Raises:
        OSError: the file cannot be read.
    """
    st = os.stat(file)
    if not _stale(st, known):
        return FileDigest(known.sha256, known.size, st, changed=False)
    for _ in range(3):
        sha = sha256_file(file)
        after = os.stat(file)
        if _key(after) == _key(st):
            break
        st = after
    return FileDigest(sha, st.st_size, st, changed=sha != known.sha256 or st.st_size != known.size)


def _matches(header: str | None, etag: str) -> bool:
    if not header:
        return False
    tags = [t.strip().removeprefix("W/") for t in header.split(",")]
    return "*" in tags or etag in tags


def serve_file(
    file: Path,
    digest: FileDigest | None,
    if_none_match: str | None,
    *,
    filename: str | None = None,
    media_type: str = "application/octet-stream",
    disposition: str = "attachment",
    headers: dict[str, str] | None = None,
) -> Response:
    """The response for ``GET``/``HEAD`` of ``file`` (see the module docstring).

    Args:
        file: the resolved path (the caller has checked it is allowed).
        digest: from :func:`current_digest`, or None when no digest is recorded.
        if_none_match: the request's ``If-None-Match`` header.
        filename: for ``Content-Disposition`` (default: the file's name).
        media_type, disposition: ``Content-Type`` and ``attachment``/``inline``.
        headers: extra headers (e.g. a Content-Security-Policy).

    Returns:
        304 without a body when ``If-None-Match`` names the current ETag, else a
        ``FileResponse`` (200, or 206 for a ``Range`` whose ``If-Range`` still matches).
    """
    out = {"X-Content-Type-Options": "nosniff", "Cache-Control": "private, no-cache", **(headers or {})}
    stat = None
    if digest is not None:
        etag = f'"{digest.sha256}"'
        out["ETag"] = etag
        out["X-Content-SHA256"] = digest.sha256
        out["Repr-Digest"] = "sha-256=:" + base64.b64encode(bytes.fromhex(digest.sha256)).decode() + ":"
        if _matches(if_none_match, etag):
            return Response(status_code=304, headers=out)
        stat = digest.stat
    return FileResponse(file, media_type=media_type, headers=out, filename=filename or file.name,
                        content_disposition_type=disposition, stat_result=stat)
