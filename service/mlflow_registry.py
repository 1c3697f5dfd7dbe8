"""MLflow's model registry beside ours: publishing a job registers a model version there.

The engine's MLflow tracker (``libreyolo_core/engine/trackers.py``) leaves
``<run_dir>/mlflow.json`` (``{"tracking_uri", "run_id", "experiment_id"}``) and logs
``weights/best.pt`` as an artifact of the run; :func:`register_version` makes that
artifact a version of the registered model of the same name as ours. Torch-free: it
imports ``mlflow``'s client only (the ``mlflow`` extra), when called.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

__all__ = ["register_version", "RegistryError"]

log = logging.getLogger(__name__)


class RegistryError(RuntimeError):
    """No version could be registered (mlflow missing, no MLflow run, server down)."""


def register_version(mlflow_json: Path, name: str, *, tracking_uri: str | None = None,
                     tags: dict[str, str] | None = None) -> dict[str, Any]:
    """Register the run's ``weights/best.pt`` as a new version of model ``name``.

    Args:
        mlflow_json: the run's ``mlflow.json``. name: the registered model's name (created
            when missing). tracking_uri: the server (default: the one in the file).
        tags: version tags (``libreyolo.model_id``...).

    Returns:
        ``{"name", "version", "run_id", "source"}``.

    Raises:
        RegistryError: mlflow not installed, an unreadable ``mlflow.json``, or the server
            refusing or unreachable.
    """
    try:
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise RegistryError("MLflow registry needs mlflow: pip install 'libreyolo-service[mlflow]'") from None
    try:
        info = json.loads(Path(mlflow_json).read_text(encoding="utf-8"))
        run_id = str(info["run_id"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RegistryError(f"{mlflow_json}: no MLflow run recorded ({exc})") from None
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # a down server answers at once
    client = MlflowClient(tracking_uri=tracking_uri or info.get("tracking_uri"))
    source = f"runs:/{run_id}/weights/best.pt"
    try:
        try:
            client.get_registered_model(name)
        except MlflowException:
            client.create_registered_model(name)
        version = client.create_model_version(name, source, run_id=run_id, tags=tags or {})
    except Exception as exc:  # noqa: BLE001 - any client or HTTP failure is the same to the caller
        raise RegistryError(f"MLflow registry: {type(exc).__name__}: {exc}") from None
    return {"name": name, "version": str(version.version), "run_id": run_id, "source": source}
