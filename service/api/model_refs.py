"""Model references in jobs: ``model: "<model id>"`` and the page's "started from" line.

Kept apart from the ``/v1/models`` router so the jobs router can use it without a cycle.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeGuard

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.api.problems import Problem
from service.db.models import Model, User, utcnow
from service.settings import Settings
from service.storage.models import ModelStore
from service.users import owns

__all__ = ["MODEL_ID", "MODEL_ID_LIKE", "OTHER_MODEL_FORMS", "READY", "INSPECTING", "FAILED",
           "describe_model_ref", "family_of_path", "model_state", "model_store",
           "resolve_model_id", "visible"]

#: a model's ``state`` (migration 0010p): usable; a publish is reading its checkpoint; the
#: inspection refused it (``error`` says why)
READY, INSPECTING, FAILED = "ready", "inspecting", "failed"
#: seconds past ``inspect_timeout_s`` after which a model still ``inspecting`` has lost
#: its inspection (the API process stopped meanwhile): it reads as failed
STALE_AFTER_S = 60.0


def model_state(model: Model, settings: Settings) -> tuple[str, str | None]:
    """``(state, error)`` of ``model`` as the API and pages show it: the row's, except that
    a model ``inspecting`` for longer than ``inspect_timeout_s`` + :data:`STALE_AFTER_S`
    is ``failed`` (nothing will finish that inspection; publishing again retries)."""
    state = model.state or READY
    if state == INSPECTING and model.created_at is not None and utcnow() - model.created_at \
            > timedelta(seconds=settings.inspect_timeout_s + STALE_AFTER_S):
        return FAILED, "the inspection did not finish (the API stopped meanwhile?); " \
            "publish the job again to retry"
    return state, model.error

#: a model id as jobs accept it in ``model``.
MODEL_ID = re.compile(r"m[0-9a-f]{24}")
#: text that is meant as a model id (``m`` and hex digits), mistyped or not: a job's
#: ``model`` like this is looked up among the user's models, never as a family name.
MODEL_ID_LIKE = re.compile(r"m[0-9a-f]{6,}")
#: the other forms ``model`` takes, for an error about an unknown model name.
OTHER_MODEL_FORMS = ("A registered model's id (m..., see `libreyolo-service models list`) "
                     "or a checkpoint of an earlier job (job:<job id>/weights/best.pt) is "
                     "also accepted.")


def model_store(settings: Settings) -> ModelStore:
    """The weights folder of these settings (``settings.model_root``)."""
    return ModelStore(settings.model_root)


def visible(model: Model | None, user: User) -> TypeGuard[Model]:
    """True when ``model`` exists and ``user`` owns it or is an admin."""
    return model is not None and owns(user, model.owner_id)


def resolve_model_id(session: Session, user: User, model_id: str) -> tuple[str, str]:
    """A job's ``model: "<model id>"`` -> ``(absolute path of the stored file, "<family>-<size>")``.

    ``model_id`` may be any text :data:`MODEL_ID_LIKE` matches (a mistyped id is unknown).

    Raises:
        Problem 422 naming ``model``: an unknown model, another user's, or a model whose
            file is gone.
    """
    model = session.get(Model, model_id)
    if not visible(model, user):
        raise Problem(422, f"model: no model {model_id} among your models (not found; see "
                      "`libreyolo-service models list`)", field="model")
    if model.state != READY:
        why = "is still being inspected (published moments ago): retry in a few seconds" \
            if model.state == INSPECTING else f"failed its inspection: {model.error}"
        raise Problem(422, f"model: model {model_id} {why}", field="model")
    if not Path(model.path).is_file():
        raise Problem(422, f"model: the file of model {model_id} is missing on the server",
                      field="model")
    return model.path, f"{model.family}-{model.size}"


def family_of_path(session: Session, path: str) -> str | None:
    """``<family>-<size>`` of a registered model's file path, or None when not registered."""
    model = session.scalar(select(Model).where(Model.path == path))
    return None if model is None else f"{model.family}-{model.size}"


def describe_model_ref(session: Session, settings: Settings, model: str) -> dict[str, Any]:
    """Which weights a job started from, for people: ``{"kind": "name"|"model"|"job"|"file",
    "label": str, "short": str, "model_id"?: str, "name"?: str, "job_id"?: str}``; ``short``
    is what a table shows (the name, the model id, ``job:<id>``, or the file).

    ``model`` is a job's stored ``model``: a family name, a registered model's file, or a
    checkpoint inside another job's run directory (``<artifact root>/<job>/run/<path>``).
    """
    if not model.startswith("/"):
        return {"kind": "name", "label": model, "short": model}
    row = session.scalar(select(Model).where(Model.path == model))
    if row is not None:
        return {"kind": "model", "label": f"model {row.id} ({row.name})", "short": row.id,
                "model_id": row.id, "name": row.name}
    path = Path(model)
    if model_store(settings).owns(path):
        return {"kind": "model", "label": f"model {path.stem} (deleted)", "short": path.stem}
    try:
        rel = path.relative_to(settings.artifact_root)
    except ValueError:
        return {"kind": "file", "label": model, "short": model}
    if len(rel.parts) > 2 and rel.parts[1] == "run":
        job_id = rel.parts[0]
        return {"kind": "job", "label": f"job:{job_id}/{Path(*rel.parts[2:]).as_posix()}",
                "short": f"job:{job_id}", "job_id": job_id}
    return {"kind": "file", "label": model, "short": model}
