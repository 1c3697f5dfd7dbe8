"""``/v1/datasets``: register a dataset path the workers can see; list and read them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Query, Request
from sqlalchemy import select

from service.api.deps import CurrentUser, SessionDep, SettingsDep
from service.api.problems import Problem
from service.api.schemas import DatasetPublic, DatasetRegister, DatasetsPage
from service.db.models import Dataset, new_id
from service.settings import Settings
from service.storage.roots import path_refusal
from service.storage.zipsafe import UnsafeZipError, check_dataset_yaml, extract_zip

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
             f"data={yaml_path}", "json=true"],
            capture_output=True, text=True, timeout=600, env=env, cwd=yaml_path.parent)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"ok": False, "exit_code": None, "error": str(exc), "splits": {}}
    splits = {}
    for line in proc.stdout.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and "split" in item:
            splits[item.pop("split")] = item
    return {"ok": proc.returncode == 0, "exit_code": proc.returncode, "splits": splits,
            "output": (proc.stdout + proc.stderr)[-4000:]}


@router.post("/register", status_code=201, response_model=DatasetPublic,
             operation_id="datasets-register",
             responses={422: {"description": "path not absolute, not a yaml, or missing"}})
def register_dataset(body: DatasetRegister, user: CurrentUser, session: SessionDep,
                     settings: SettingsDep) -> DatasetPublic:
    """Register a dataset yaml at a path visible to the workers (shared storage).

    Raises:
        422: ``path`` is not an absolute ``.yaml``/``.yml`` file that exists here.
    """
    path = Path(body.path)
    if not path.is_absolute() or path.suffix not in (".yaml", ".yml"):
        raise Problem(422, f"path: {body.path!r} must be an absolute dataset yaml path",
                      field="path")
    if not path.is_file():
        raise Problem(422, f"path: {body.path!r} does not exist", field="path")
    refusal = path_refusal(path, settings)
    if refusal is not None:
        raise Problem(422, f"path: {refusal}", field="path")
    ds = Dataset(owner_id=user.id, name=body.name, path=str(path), source="register",
                 status="ready", report=None)
    session.add(ds)
    session.commit()
    return DatasetPublic.model_validate(ds)


@router.get("", response_model=DatasetsPage, operation_id="datasets-list")
def list_datasets(user: CurrentUser, session: SessionDep) -> DatasetsPage:
    """Your datasets, newest first (admins see all)."""
    stmt = select(Dataset).order_by(Dataset.id.desc())
    if not user.is_admin:
        stmt = stmt.where(Dataset.owner_id == user.id)
    return DatasetsPage(data=[DatasetPublic.model_validate(d) for d in session.scalars(stmt)])


@router.get("/{dataset_id}", response_model=DatasetPublic, operation_id="datasets-get",
            responses={404: {"description": "no such dataset (or another user's)"}})
def get_dataset(dataset_id: str, user: CurrentUser, session: SessionDep) -> DatasetPublic:
    """One dataset with its scan report."""
    ds = session.get(Dataset, dataset_id)
    if ds is None or (ds.owner_id != user.id and not user.is_admin):
        raise Problem(404, f"dataset {dataset_id!r} not found")
    return DatasetPublic.model_validate(ds)


@router.post(
    "", status_code=201, response_model=DatasetPublic, operation_id="datasets-upload",
    openapi_extra={"requestBody": {"content": {"application/zip": {
        "schema": {"type": "string", "format": "binary"}}}, "required": True}},
    responses={413: {"description": "zip larger than the upload cap"},
               422: {"description": "unsafe zip (.., absolute path, symlink, bomb), no yaml, "
                     "or the dataset scan failed"}},
)
async def upload_dataset(
    request: Request, user: CurrentUser, session: SessionDep, settings: SettingsDep,
    name: Annotated[str, Query(min_length=1, max_length=200, description="dataset name")],
) -> DatasetPublic:
    """Upload a dataset as a zip (request body ``application/zip``), streamed to disk.

    The zip is refused (nothing extracted) when larger than ``max_upload_bytes`` (413), or
    when a member has an absolute path, ``..``, is a symlink, or the archive inflates past
    ``max_uncompressed_bytes`` or ``max_compression_ratio`` (422 naming the member). Then
    the engine's dataset scan runs; its report is stored and returned. A failed scan keeps
    the dataset with ``status: invalid``.
    """
    ds_id = new_id("d")
    root = settings.upload_root
    root.mkdir(parents=True, exist_ok=True)
    part = root / f"{ds_id}.zip.part"
    size = 0
    try:
        async with await anyio.open_file(part, "wb") as f:
            async for chunk in request.stream():
                size += len(chunk)
                if size > settings.max_upload_bytes:
                    raise Problem(413, f"upload exceeds {settings.max_upload_bytes} bytes")
                await f.write(chunk)
        dest = root / ds_id
        try:
            await anyio.to_thread.run_sync(_extract, part, dest, settings)
        except UnsafeZipError as exc:
            raise Problem(422, f"body: {exc}", field="body") from None
        except zipfile.BadZipFile:
            raise Problem(422, "body: not a zip file", field="body") from None
    finally:
        part.unlink(missing_ok=True)
    yaml_path = _find_yaml(dest)
    if yaml_path is None:
        shutil.rmtree(dest, ignore_errors=True)
        raise Problem(422, "body: the zip holds no dataset yaml (e.g. data.yaml)", field="body")
    try:
        check_dataset_yaml(yaml_path, dest, settings.zip_limits())
    except UnsafeZipError as exc:
        shutil.rmtree(dest, ignore_errors=True)
        raise Problem(422, f"body: {exc}", field="body") from None
    report = await anyio.to_thread.run_sync(_scan, yaml_path, settings)
    ds = Dataset(id=ds_id, owner_id=user.id, name=name, path=str(yaml_path), source="upload",
                 status="ready" if report["ok"] else "invalid", report=report)
    session.add(ds)
    session.commit()
    return DatasetPublic.model_validate(ds)


def _extract(part: Path, dest: Path, settings: Settings) -> None:
    with zipfile.ZipFile(part) as zf:
        extract_zip(zf, dest, limits=settings.zip_limits())
