"""``/v1/datasets``: upload a zip or register a path the workers can see; list, read, delete.

An upload is stored once per user and content: the same zip (by sha256) uploaded again
answers with the dataset already made from it (200). Answers never show the service's
own folders: an upload's ``path`` and scan report are relative to the zip's root.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Query, Request, Response
from sqlalchemy import select

from service.api.deps import CurrentUser, SessionDep, SettingsDep
from service.api.problems import Problem, error_responses
from service.api.schemas import DatasetPublic, DatasetRegister, DatasetsPage
from service.api.uploads import receive_upload
from service.db.models import Dataset, Job, new_id
from service.lifecycle import TERMINAL
from service.settings import Settings
from service.storage.roots import PathRefused, ReadRule, check_dataset
from service.storage.zipsafe import UnsafeZipError, extract_zip
from service.users import owns, visible_to

__all__ = ["router"]

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])


def _find_yaml(root: Path) -> Path | None:
    for depth in ("*.yaml", "*/*.yaml", "*.yml", "*/*.yml"):
        found = sorted(root.glob(depth))
        if found:
            named = [p for p in found if p.name == "data.yaml"]
            return (named or found)[0]
    return None


def _scan(yaml_path: Path, settings: Settings) -> dict[str, Any]:
    """The engine's dataset scan (``libreyolo checks data=... json=true``) in a subprocess,
    so the API process never imports the engine's heavy modules."""
    import libreyolo_core

    env = dict(os.environ)
    root = str(Path(libreyolo_core.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    try:
        proc = subprocess.run(
            [settings.engine_python, "-m", "libreyolo_core.cli", "checks",
             f"data={yaml_path}", "json=true", f"cache_dir={settings.cache_root}"],
            capture_output=True, text=True, timeout=600, env=env, cwd=yaml_path.parent)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"ok": False, "exit_code": None, "error": str(exc), "splits": {}}
    splits, other = {}, []
    for line in proc.stdout.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            other.append(line)
            continue
        if isinstance(item, dict) and "split" in item:
            item.pop("cache", None)  # the service's own label cache file
            splits[item.pop("split")] = item
    report = {"ok": proc.returncode == 0, "exit_code": proc.returncode, "splits": splits}
    output = "\n".join([*other, *proc.stderr.splitlines()]).strip()
    if output and proc.returncode != 0:
        report["output"] = output[-4000:]
        errors = [ln for ln in other if "] error: " in ln]  # a split that cannot be used
        if errors:
            report["error"] = "\n".join(errors)[-4000:]
    return report


def _relative(value: Any, root: Path) -> Any:
    """``value`` with every ``<root>/`` prefix removed from its strings (recursively)."""
    if isinstance(value, str):
        return value.replace(f"{root}{os.sep}", "").replace(str(root), ".")
    if isinstance(value, dict):
        return {k: _relative(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [_relative(v, root) for v in value]
    return value


def dataset_public(ds: Dataset, settings: Settings) -> DatasetPublic:
    """Public view of a dataset row: an upload's ``path`` relative to its zip's root."""
    out = DatasetPublic.model_validate(ds)
    if ds.source == "upload":
        out.path = _relative(ds.path, settings.upload_root / ds.id)
    return out


@router.post("/register", status_code=201, response_model=DatasetPublic,
             operation_id="datasets-register",
             responses={422: {"description": "path not absolute, not a yaml, or missing"}})
def register_dataset(body: DatasetRegister, user: CurrentUser, session: SessionDep,
                     settings: SettingsDep) -> DatasetPublic:
    """Register a dataset yaml at a path visible to the workers (shared storage).

    Every path the yaml names or reaches must pass the service's containment rule
    (:func:`service.storage.roots.check_dataset`): never the service's own folders
    (another user's uploads among them), under ``dataset_roots`` when set.

    Raises:
        422: ``path`` is not an absolute ``.yaml``/``.yml`` file that exists here, or the
            dataset reads a path the rule refuses (the detail names the key).
    """
    path = Path(body.path)
    if not path.is_absolute() or path.suffix not in (".yaml", ".yml"):
        raise Problem(422, f"path: {body.path!r} must be an absolute dataset yaml path",
                      field="path")
    refusal = ReadRule(settings).refusal(path)
    if refusal is not None:
        raise Problem(422, f"path: {refusal}", field="path")
    if not path.is_file():
        raise Problem(422, f"path: {body.path!r} does not exist", field="path")
    try:
        check_dataset(path, ReadRule(settings), max_yaml_bytes=settings.max_yaml_bytes)
    except PathRefused as exc:
        raise Problem(422, f"path: {exc}", field="path") from None
    ds = Dataset(owner_id=user.id, name=body.name, path=str(path), source="register",
                 status="ready", report=None)
    session.add(ds)
    session.commit()
    return DatasetPublic.model_validate(ds)


@router.get("", response_model=DatasetsPage, operation_id="datasets-list")
def list_datasets(user: CurrentUser, session: SessionDep, settings: SettingsDep
                  ) -> DatasetsPage:
    """Your datasets, newest first (admins see all)."""
    stmt = visible_to(select(Dataset).order_by(Dataset.id.desc()), Dataset.owner_id, user)
    return DatasetsPage(data=[dataset_public(d, settings) for d in session.scalars(stmt)])


def _owned(session: SessionDep, user: CurrentUser, dataset_id: str) -> Dataset:
    ds = session.get(Dataset, dataset_id)
    if ds is None or not owns(user, ds.owner_id):
        raise Problem(404, f"dataset {dataset_id!r} not found")
    return ds


@router.get("/{dataset_id}", response_model=DatasetPublic, operation_id="datasets-get",
            responses=error_responses({404: "no such dataset (or another user's)"}))
def get_dataset(dataset_id: str, user: CurrentUser, session: SessionDep,
                settings: SettingsDep) -> DatasetPublic:
    """One dataset with its scan report."""
    return dataset_public(_owned(session, user, dataset_id), settings)


@router.delete("/{dataset_id}", status_code=204, operation_id="datasets-delete",
               responses=error_responses({404: "no such dataset (or another user's)",
                                          409: "a queued or running job uses it"}))
def delete_dataset(dataset_id: str, user: CurrentUser, session: SessionDep,
                   settings: SettingsDep) -> Response:
    """Delete a dataset: its row and, for an upload, its files on the service.

    Finished jobs keep their results. A registered dataset's files are the user's and are
    left alone.

    Raises:
        404: no such dataset, or another user's.
        409: a queued, running or cancelling job reads it (cancel the job first).
    """
    ds = _owned(session, user, dataset_id)
    busy = session.scalar(select(Job.id).where(Job.data == ds.path,
                                               Job.status.not_in(TERMINAL)).limit(1))
    if busy is not None:
        raise Problem(409, f"dataset {dataset_id} is in use by job {busy} "
                      f"(cancel it or wait for it first)", job_id=busy)
    session.delete(ds)
    session.commit()
    if ds.source == "upload":
        shutil.rmtree(settings.upload_root / dataset_id, ignore_errors=True)
    return Response(status_code=204)


@router.post(
    "", status_code=201, response_model=DatasetPublic, operation_id="datasets-upload",
    openapi_extra={"requestBody": {"content": {"application/zip": {
        "schema": {"type": "string", "format": "binary"}}}, "required": True}},
    responses={200: {"description": "this zip (same sha256) was uploaded before: that "
                      "dataset", "model": DatasetPublic},
               **error_responses({413: "zip larger than the upload cap",
                                  422: "not a zip, an unsafe zip (.., absolute path, symlink, "
                                       "bomb), or no dataset yaml in it"})},
)
async def upload_dataset(
    request: Request, response: Response, user: CurrentUser, session: SessionDep,
    settings: SettingsDep,
    name: Annotated[str, Query(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$",
                                         description="dataset name")],
) -> DatasetPublic:
    """Upload a dataset as a zip (request body ``application/zip``), streamed to disk.

    The zip is refused (nothing extracted) when larger than ``max_upload_bytes`` (413), or
    when a member has an absolute path, ``..``, is a symlink, or the archive inflates past
    ``max_uncompressed_bytes`` or ``max_compression_ratio`` (422 naming the member). Then
    the engine's dataset scan runs; its report (paths relative to the zip's root) is
    stored and returned. A failed scan keeps the dataset with ``status: invalid``.

    The same bytes uploaded again by the same user answer 200 with the existing dataset
    (its ``report.zip_sha256`` matches), nothing stored twice.
    """
    ds_id = new_id("d")
    root = settings.upload_root
    root.mkdir(parents=True, exist_ok=True)
    part = root / f"{ds_id}.zip.part"
    try:
        got = await receive_upload(request, part, max_bytes=settings.max_upload_bytes,
                                   too_big=f"upload exceeds {settings.max_upload_bytes} bytes")
        same = _same_upload(session, user.id, got.sha256)
        if same is not None:
            response.status_code = 200
            return dataset_public(same, settings)
        dest = root / ds_id
        await _extract_checked(part, dest, settings)
    finally:
        part.unlink(missing_ok=True)
    yaml_path = _dataset_yaml(dest, settings)
    report = _relative(await anyio.to_thread.run_sync(_scan, yaml_path, settings), dest)
    report["zip_sha256"] = got.sha256
    ds = Dataset(id=ds_id, owner_id=user.id, name=name, path=str(yaml_path), source="upload",
                 status="ready" if report["ok"] else "invalid", report=report)
    session.add(ds)
    session.commit()
    return dataset_public(ds, settings)


async def _extract_checked(part: Path, dest: Path, settings: Settings) -> None:
    """Extract the uploaded zip ``part`` into ``dest`` (in a worker thread).

    Raises:
        Problem 422 (``field: body``): an unsafe zip (the member named), or not a zip.
    """
    try:
        await anyio.to_thread.run_sync(_extract, part, dest, settings)
    except UnsafeZipError as exc:
        raise Problem(422, f"body: {exc}", field="body") from None
    except zipfile.BadZipFile:
        raise Problem(422, "body: not a zip file", field="body") from None


def _dataset_yaml(dest: Path, settings: Settings) -> Path:
    """The dataset yaml of the extracted upload ``dest``, checked by the containment rule
    (every path it reaches inside ``dest``).

    Raises:
        Problem 422 (``field: body``): no yaml in the zip, or one reaching a path the rule
            refuses; ``dest`` is deleted first.
    """
    yaml_path = _find_yaml(dest)
    if yaml_path is None:
        shutil.rmtree(dest, ignore_errors=True)
        raise Problem(422, "body: the zip holds no dataset yaml (e.g. data.yaml)", field="body")
    try:
        check_dataset(yaml_path, ReadRule(settings, inside=dest),
                      max_yaml_bytes=settings.max_yaml_bytes)
    except PathRefused as exc:
        shutil.rmtree(dest, ignore_errors=True)
        raise Problem(422, f"body: {exc}", field="body") from None
    return yaml_path


def _same_upload(session: SessionDep, owner_id: str, sha256: str) -> Dataset | None:
    """The user's upload made from a zip with this sha256, if any."""
    uploads = session.scalars(select(Dataset).where(Dataset.owner_id == owner_id,
                                                    Dataset.source == "upload"))
    return next((d for d in uploads if (d.report or {}).get("zip_sha256") == sha256), None)


def _extract(part: Path, dest: Path, settings: Settings) -> None:
    with zipfile.ZipFile(part) as zf:
        extract_zip(zf, dest, limits=settings.zip_limits())
