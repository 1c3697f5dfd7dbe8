"""The rules of a job submit that the request schema cannot say: the device count, the
training parameters (the engine's ``TrainConfig``), the model reference and the dataset.

Each rule raises a :class:`~service.api.problems.Problem` 422 naming the offending field;
``POST /v1/jobs`` (:mod:`service.api.jobs`) applies them before anything is written.
"""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from libreyolo_core.config import ConfigError, TrainConfig, resolve_config
from libreyolo_core.data.config import DataConfigError, load_data_config
from libreyolo_core.distributed.batch import nearest_valid_batches, per_rank_batch
from libreyolo_core.models.registry import list_models
from service.api.model_refs import (
    MODEL_ID_LIKE,
    OTHER_MODEL_FORMS,
    family_of_path,
    resolve_model_id,
)
from service.api.problems import Problem
from service.api.schemas import JobCreate
from service.db.models import Dataset, Job, User
from service.job_store import get_owned
from service.storage.roots import PathRefused, ReadRule, check_dataset
from service.users import owns

__all__ = ["GPU_COUNTS", "RESERVED_PARAMS", "resolve_gpus", "validate_params", "resolve_model",
           "resolve_data", "batch_warning"]

#: the GPU counts a job may ask for (each has its queue, :func:`service.queue.queue_for`).
GPU_COUNTS = (0, 1, 2, 4, 8)
#: params the service sets itself (run directory, resume, devices).
RESERVED_PARAMS = ("project", "name", "exist_ok", "resume", "device", "data", "model",
                   "cache_dir")


def resolve_gpus(body: JobCreate, default_gpus: int, max_nodes: int) -> int:
    """The job's GPU count (per node): ``body.gpus``, else ``default_gpus`` (the setting).

    Raises:
        Problem 422: a count not in :data:`GPU_COUNTS` (``gpus``), ``procs`` on a GPU job,
            more ``nodes`` than ``max_nodes`` (the setting), or ``tune`` options on a job
            of another kind.
    """
    if body.nodes > max_nodes:
        raise Problem(422, f"nodes: {body.nodes} is more than this service allows "
                      f"(max_nodes={max_nodes})", field="nodes", value=body.nodes,
                      allowed=list(range(1, max_nodes + 1)) if max_nodes <= 16 else None)
    gpus = default_gpus if body.gpus is None else body.gpus
    if gpus not in GPU_COUNTS:
        raise Problem(422, f"gpus: {gpus} is not one of {', '.join(map(str, GPU_COUNTS))}",
                      field="gpus")
    if gpus and body.procs != 1:
        raise Problem(422, "procs: only a CPU job (gpus=0) sets procs", field="procs")
    if body.tune is not None and body.kind != "tune":
        raise Problem(422, f"tune: tune options go with kind tune, not {body.kind}", field="tune")
    return gpus


def validate_params(body: JobCreate, gpus: int, family: str | None = None) -> dict[str, Any]:
    """Validate ``params`` with the engine's TrainConfig; returns the canonical user keys.

    ``family`` (``<family>-<size>``) stands in for ``body.model`` when the model is a
    checkpoint of an earlier job (its family decides the defaults and the stride rules).

    Raises:
        Problem 422: naming ``params.<key>`` (or ``model``) and what is allowed.
    """
    for key in body.params:
        if key.replace("-", "_") in RESERVED_PARAMS:
            where = key if key in ("data", "model") else None
            detail = (f"params.{key}: set '{key}' at the top level of the request"
                      if where else f"params.{key}: set by the service, not by the request")
            raise Problem(422, detail, field=f"params.{key}")
    try:
        cfg = resolve_config({**body.params, "model": family or body.model})
    except ConfigError as exc:
        field = "model" if exc.key == "model" else f"params.{exc.key}"
        more = f". {OTHER_MODEL_FORMS}" if field == "model" and family is None else ""
        raise Problem(422, f"{field}: {exc}{more}", field=field, value=_jsonable(exc.value),
                      allowed=_allowed_values(exc.key)) from None
    _check_ranks(body, gpus, cfg)
    keys = set(cfg.model_fields_set) - {"model"}
    return cfg.model_dump(mode="json", include=keys)


def _check_ranks(body: JobCreate, gpus: int, cfg: Any) -> None:
    """The rules of :func:`validate_params` between the job's devices and its resolved
    config ``cfg``: a profile, tune or preflight runs on one device of one host; ``batch``
    divides by the rank count.

    Raises:
        Problem 422: naming ``nodes``, ``gpus``/``procs``, ``params.preflight`` or
            ``params.batch``, with the allowed values.
    """
    per_node = gpus or body.procs
    world = per_node * body.nodes
    if body.nodes > 1 and (body.kind in ("profile", "tune") or cfg.profile or cfg.preflight):
        what = "a preflight" if cfg.preflight and body.kind == "train" else \
            f"a {body.kind if body.kind != 'train' else 'profile'} job"
        raise Problem(422, f"nodes: {what} runs on one device of one host; use nodes=1",
                      field="nodes", value=body.nodes, allowed=[1])
    if (body.kind in ("profile", "tune") or cfg.profile) and world > 1:
        raise Problem(422, f"{'gpus' if gpus else 'procs'}: a {body.kind if body.kind != 'train' else 'profile'} "
                      "job runs on one device (the training profiler does not run under DDP); use 1",
                      field="gpus" if gpus else "procs", value=world, allowed=[1])
    if cfg.preflight and body.kind != "train":
        raise Problem(422, f"params.preflight: a preflight estimates a training run; a {body.kind} "
                      "job has none (submit kind train with params.preflight)",
                      field="params.preflight", value=True, allowed=[False])
    if cfg.preflight and world > 1:
        raise Problem(422, f"params.preflight: the preflight profiles one device; this job has "
                      f"{world} ranks ({'gpus' if gpus else 'procs'}={world})",
                      field="params.preflight", value=True, allowed=[False])
    if cfg.batch > 0:
        try:
            per_rank_batch(cfg.batch, world)
        except ValueError as exc:
            ranks = f"gpus={gpus}" if gpus else f"procs={body.procs}"
            if body.nodes > 1:
                ranks += f" on each of nodes={body.nodes}"
            raise Problem(422, f"params.batch: {exc} ({ranks})", field="params.batch", value=cfg.batch,
                          allowed=nearest_valid_batches(cfg.batch, world)) from None


def _allowed_values(key: str) -> list[Any] | None:
    """The valid values of a training key when they are a short list (the model names, a
    Literal's choices); None for ranges and free values (the detail says those)."""
    if key == "model":
        return list_models()
    info = TrainConfig.model_fields.get(key)
    if info is None:
        return None
    choices = [a for a in typing.get_args(info.annotation) if a is not type(None)]
    if typing.get_origin(info.annotation) is typing.Literal:
        return choices
    literals = [typing.get_args(a) for a in choices if typing.get_origin(a) is typing.Literal]
    return [v for group in literals for v in group] if literals and \
        len(literals) == len(choices) else None


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


#: ``job:<job id>/<artifact path>``: a checkpoint artifact of an earlier job.
_JOB_MODEL = re.compile(r"job:(?P<job>j[0-9a-f]{24})/(?P<path>.+)")
_MAX_CHAIN = 32


def _family_of(session: Session, store: Any, model: str) -> str | None:
    """``<family>-<size>`` of a stored job model: a name, or a checkpoint path inside the
    artifact store (followed back through the jobs that produced it). None if unknown."""
    for _ in range(_MAX_CHAIN):
        if not model.startswith("/"):
            return model
        if (registered := family_of_path(session, model)) is not None:
            return registered
        try:
            rel = Path(model).relative_to(store.root)
        except ValueError:
            return None
        parent = session.get(Job, rel.parts[0]) if rel.parts else None
        if parent is None:
            return None
        model = parent.model
    return None


def resolve_model(session: Session, user: User, store: Any,
                  model: str) -> tuple[str, str | None]:
    """Resolve ``job:<id>/<path>`` (or a model id, ``m...``) to the checkpoint's absolute path.

    Returns:
        ``(model, family)``: for a reference, the absolute ``.pt`` path and the
        ``<family>-<size>`` it was trained as; for a name, ``(name, None)``.

    Raises:
        Problem 422 naming ``model``: a malformed reference, another user's or an unknown
        job, a path that leaves the job's run directory, or a missing / non-``.pt`` file.
    """
    if MODEL_ID_LIKE.fullmatch(model):
        return resolve_model_id(session, user, model)
    if not model.startswith("job:"):
        return model, None
    m = _JOB_MODEL.fullmatch(model)
    if m is None:
        raise Problem(422, f"model: {model!r} is not 'job:<job id>/<artifact path>', e.g. "
                      "'job:j0123456789abcdef01234567/weights/best.pt'", field="model")
    ref_id, rel = m["job"], m["path"]
    ref = get_owned(session=session, job_id=ref_id, user=user)
    if ref is None:
        raise Problem(422, f"model: job {ref_id!r} not found", field="model")
    if not rel.endswith(".pt"):
        raise Problem(422, f"model: {rel!r} is not a checkpoint (.pt)", field="model")
    path = store.resolve(ref_id, rel)
    if path is None:
        raise Problem(422, f"model: job {ref_id} has no artifact {rel!r}", field="model")
    family = _family_of(session, store, ref.model)
    if family is None:
        raise Problem(422, f"model: cannot tell the model family of job {ref_id}",
                      field="model")
    return str(path), family


def resolve_data(session: Session, user: User, data: str, check: bool, settings: Any) -> str:
    """Dataset id -> its yaml path; a path must be absolute. Either way the dataset must
    pass the service's containment rule (:func:`~service.storage.roots.check_dataset`:
    dataset roots; never the service's own folders: uploads are used by id; a registered
    yaml is checked again, it may have changed since it was registered).

    Raises:
        Problem: 422 naming ``data``: an unknown or another user's dataset id, a dataset
            whose scan failed (``status: invalid``, with the scan's reason), a path that
            is not an absolute yaml, or (``check``) one the engine's torch-free
            :func:`~libreyolo_core.data.config.load_data_config` refuses (missing file,
            no ``names``, a split folder that does not exist...; its message).
    """
    if not data.startswith("/"):
        data = data.removeprefix("dataset:")  # as a job's public ``data`` names an upload
        ds = session.get(Dataset, data)
        if ds is None or not owns(user, ds.owner_id):
            raise Problem(422, f"data: {data!r} is neither a dataset id nor an absolute yaml "
                          "path", field="data")
        if ds.status == "invalid":
            raise Problem(422, f"data: dataset {data} ({ds.name}) failed its scan: "
                          f"{_scan_reason(ds.report)}", field="data")
        _contained(Path(ds.path), ReadRule.for_yaml(settings, ds.path), settings, data)
        return ds.path
    path = Path(data)
    if path.suffix not in (".yaml", ".yml"):
        raise Problem(422, f"data: {data!r} must be a dataset yaml (.yaml/.yml)", field="data")
    rule = ReadRule(settings)
    refusal = rule.refusal(path)
    if refusal is not None:
        raise Problem(422, f"data: {refusal}", field="data")
    if path.is_file():
        _contained(path, rule, settings, data)
    if check:
        try:
            load_data_config(path)
        except DataConfigError as exc:
            raise Problem(422, f"data: {exc}", field="data") from None
    return data


def _contained(path: Path, rule: ReadRule, settings: Any, data: str) -> None:
    try:
        check_dataset(path, rule, max_yaml_bytes=settings.max_yaml_bytes)
    except PathRefused as exc:
        raise Problem(422, f"data: {exc}", field="data") from None
    except OSError as exc:
        raise Problem(422, f"data: cannot read {data!r} ({exc.strerror or exc})",
                      field="data") from None

def batch_warning(session: Session, data: str, params: dict[str, Any]) -> str | None:
    """A warning when ``params.batch`` is larger than the train split of an uploaded or
    registered dataset (its scan counted the images): each epoch would be one partial
    batch. None when it fits, or when the service has no count (a yaml path)."""
    batch = params.get("batch")
    if not isinstance(batch, int) or batch <= 0 or data.startswith("/"):
        return None
    ds = session.get(Dataset, data)
    train = ((ds.report or {}).get("splits") or {}).get("train") if ds is not None else None
    usable = train.get("usable") if isinstance(train, dict) else None
    if not isinstance(usable, int) or batch <= usable:
        return None
    return (f"params.batch: {batch} is more than the {usable} training images of dataset "
            f"{data}: every epoch is one partial batch of {usable} (one optimizer step); "
            f"use batch={usable} or less")


def _scan_reason(report: dict[str, Any] | None) -> str:
    """The error lines a failed dataset scan printed (``[split] error: ...``), else its
    last line, or its exit code."""
    report = report or {}
    lines = [ln.strip() for ln in str(report.get("error") or report.get("output") or "")
             .splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error:" in ln and not ln.startswith("warning:")]
    if errors:
        return "; ".join(errors)
    return lines[-1] if lines else f"the scan exited with {report.get('exit_code')}"

