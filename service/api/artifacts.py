"""``/v1/jobs/{id}/artifacts``: list a job's files and download one (Range, ETag, sha256)."""

from __future__ import annotations

import logging
from datetime import UTC
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Header, Response
from sqlalchemy import select

from service.api.deps import OWNED_JOB_ERRORS, OwnedJob, SessionDep, StoreDep
from service.api.files import FileDigest, RecordedDigest, current_digest, serve_file
from service.api.problems import Problem
from service.api.schemas import ArtifactPublic, ArtifactsList
from service.db.models import Artifact, utcnow

__all__ = ["router", "TIMELINE_CSP", "IMAGE_TYPES"]

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

#: ``timeline.html`` is served inline under this policy: no network access at all.
TIMELINE_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data: blob:; font-src data:; connect-src 'none'; form-action 'none'; "
    "base-uri 'none'; frame-ancestors 'self'; sandbox allow-scripts"
)

#: Raster pictures served inline under their own type (never SVG: it can hold scripts).
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}


@router.get("/{job_id}/artifacts", response_model=ArtifactsList, operation_id="jobs-artifacts",
            responses=OWNED_JOB_ERRORS)
def list_artifacts(job: OwnedJob, session: SessionDep, store: StoreDep) -> ArtifactsList:
    """Files of the job's run directory: path, kind, size and sha256.

    Recorded (with sha256) when the job finishes; while it runs the files on disk are
    listed without sha256.
    """
    rows = session.scalars(select(Artifact).where(Artifact.job_id == job.id)
                           .order_by(Artifact.path)).all()
    url = f"/v1/jobs/{job.id}/artifacts/"
    if rows:
        for a in rows:  # a file rewritten since it was recorded is listed with its new digest
            file = store.resolve(job.id, a.path)
            if file is not None:
                _artifact_digest(session, a, file)
        data = [ArtifactPublic(path=a.path, kind=a.kind, size_bytes=a.size_bytes,
                               sha256=a.sha256, url=url + a.path) for a in rows]
    else:
        from service.storage import artifact_kind

        data = [ArtifactPublic(path=rel, kind=artifact_kind(rel), size_bytes=p.stat().st_size,
                               sha256=None, url=url + rel) for rel, p in store.list_files(job.id)]
    return ArtifactsList(data=data)


@router.api_route(
    "/{job_id}/artifacts/{path:path}", methods=["GET", "HEAD"], operation_id="jobs-artifact-download",
    responses={**OWNED_JOB_ERRORS, 200: {"content": {"application/octet-stream": {}, "image/png": {},
                                                     "image/jpeg": {}, "application/json": {}}},
               206: {"description": "partial content (Range)"}, 304: {"description": "ETag"}},
)
def download_artifact(
    job: OwnedJob, path: str, session: SessionDep, store: StoreDep,
    if_none_match: Annotated[str | None, Header(alias="If-None-Match")] = None,
) -> Response:
    """Download one artifact (path relative to the run dir, e.g. ``weights/best.pt``);
    ``HEAD`` gives the same headers without the body.

    The ``ETag`` (``"<sha256>"``), ``X-Content-SHA256`` and ``Repr-Digest`` describe the
    bytes served: a file changed since its digest was recorded (a resume rewrote
    ``last.pt``) is hashed again and its record updated. ``If-None-Match`` gives 304 only
    for the current ETag; ``Range`` gives 206, unless ``If-Range`` carries another
    validator (then the whole file, 200). ``timeline.html`` is served inline as HTML under
    a Content-Security-Policy that blocks all network access; PNG and JPEG pictures (the
    validation report's) inline with their image type; JSON as ``application/json``
    attachments; every other file is an attachment. See :mod:`service.api.files`.

    Raises:
        404: no such file, or the path leaves the run directory (``..``, absolute, symlink).
    """
    file = store.resolve(job.id, path)
    if file is None:
        raise Problem(404, f"artifact {path!r} not found in job {job.id}")
    rel = file.relative_to(store.run_dir(job.id).resolve()).as_posix()
    row = session.scalar(select(Artifact).where(Artifact.job_id == job.id, Artifact.path == rel))
    digest = _artifact_digest(session, row, file) if row is not None else None
    if file.name == "timeline.html":
        return serve_file(file, digest, if_none_match, media_type="text/html; charset=utf-8",
                          disposition="inline", headers={"Content-Security-Policy": TIMELINE_CSP})
    picture = IMAGE_TYPES.get(file.suffix.lower())
    if picture is not None:  # the report's plots and pictures, shown by the job page
        return serve_file(file, digest, if_none_match, media_type=picture, disposition="inline")
    if file.suffix.lower() == ".json":
        return serve_file(file, digest, if_none_match, media_type="application/json")
    return serve_file(file, digest, if_none_match)


def _artifact_digest(session: SessionDep, row: Artifact, file: Path) -> FileDigest:
    """The artifact's digest now; a changed file's new sha256 and size are stored."""
    digest = current_digest(file, RecordedDigest(row.sha256, row.size_bytes, row.created_at))
    if digest.changed:
        log.info("artifact %s of job %s changed on disk since it was recorded: sha256 %s -> %s",
                 row.path, row.job_id, row.sha256[:12], digest.sha256[:12])
        row.sha256, row.size_bytes, row.created_at = digest.sha256, digest.size, utcnow()
        session.commit()
    elif _stale_record(row, digest):
        row.created_at = utcnow()  # touched, same bytes: skip the hash next time
        session.commit()
    return digest


def _stale_record(row: Artifact, digest: FileDigest) -> bool:
    at = row.created_at if row.created_at.tzinfo else row.created_at.replace(tzinfo=UTC)
    return digest.stat.st_mtime > at.timestamp()
