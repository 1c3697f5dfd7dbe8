"""A worker exports a registered model to ONNX (the ``export_model`` task).

The API recorded the request (``models.onnx_state`` ``exporting``, :mod:`service.api.
model_export`); :func:`export_model` claims it (``onnx_started_at``; a duplicate message
finds it claimed and does nothing), runs ``libreyolo export model=<id>.pt format=onnx
json=true`` in a child process with ``export_timeout_s`` as its time limit (the engine
checks the file in onnxruntime before it keeps it, docs/export.md), moves the file to
``<model_root>/<id>.onnx``, writes ``<id>.onnx.json`` beside it and records ``ready`` with
the export's facts, or ``failed`` with the engine's reason.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
from pathlib import Path
from typing import Any, cast

from sqlalchemy import CursorResult, update
from sqlalchemy.orm import Session, sessionmaker

from service.db.models import Model, utcnow
from service.model_export import EXPORT_FAILED, EXPORT_READY, EXPORTING
from service.settings import Settings
from service.storage.models import ModelStore

__all__ = ["export_model", "run_export"]

log = logging.getLogger(__name__)

#: characters of the engine's reason kept in ``onnx_error``
_ERROR_CHARS = 600


def export_model(model_id: str, *, settings: Settings, sessions: sessionmaker[Session]) -> str:
    """Run the export model ``model_id`` is waiting for.

    Returns:
        ``ready`` or ``failed`` (recorded on the model), or ``skipped``: no export waits
        (a duplicate message, a model deleted meanwhile, an export another worker runs).
    """
    started = utcnow()
    with sessions() as s:
        model = s.get(Model, model_id)
        if model is None or model.onnx_state != EXPORTING or model.onnx_started_at is not None:
            return "skipped"
        requested, source = model.onnx_requested_at, Path(model.path)
        claimed = cast(CursorResult, s.execute(
            update(Model).where(Model.id == model_id, Model.onnx_state == EXPORTING,
                                Model.onnx_started_at.is_(None),
                                Model.onnx_requested_at == requested)
            .values(onnx_started_at=started))).rowcount
        s.commit()
    if not claimed:
        return "skipped"
    store = ModelStore(settings.model_root)
    final = store.onnx_path(model_id)
    part = store.incoming(model_id).with_suffix(".onnx")
    values: dict[str, Any]
    try:
        info = run_export(source, part, python=settings.engine_python,
                          timeout_s=settings.export_timeout_s)
        os.replace(part, final)
        info["finished_at"] = utcnow().isoformat()  # after the file: its ETag's recorded time
        final.with_name(final.name + ".json").write_text(json.dumps(info), encoding="utf-8")
        values = {"onnx_state": EXPORT_READY, "onnx_error": None, "onnx_info": info}
    except Exception as exc:  # noqa: BLE001 - said on the model, not lost in a log
        if not isinstance(exc, ExportFailed):
            log.exception("model %s: the ONNX export failed", model_id)
        values = {"onnx_state": EXPORT_FAILED, "onnx_info": None,
                  "onnx_error": str(exc) if isinstance(exc, ExportFailed)
                  else f"the export failed: {type(exc).__name__}: {exc}"[:_ERROR_CHARS]}
    finally:
        part.unlink(missing_ok=True)
    with sessions() as s:
        done = cast(CursorResult, s.execute(
            update(Model).where(Model.id == model_id, Model.onnx_state == EXPORTING,
                                Model.onnx_requested_at == requested)
            .values(**values))).rowcount
        s.commit()
    if not done and values["onnx_state"] == EXPORT_READY:  # deleted (or asked again) meanwhile
        with sessions() as s:
            gone = s.get(Model, model_id) is None
        if gone:
            final.unlink(missing_ok=True)
            final.with_name(final.name + ".json").unlink(missing_ok=True)
    log.info("model %s: ONNX export %s%s", model_id, values["onnx_state"],
             f" ({values['onnx_error']})" if values.get("onnx_error") else "")
    return str(values["onnx_state"])


class ExportFailed(RuntimeError):
    """The engine refused or failed the export; ``str(exc)`` is its reason, for people."""


def run_export(weights: Path, target: Path, *, python: str, timeout_s: float) -> dict[str, Any]:
    """``python -m libreyolo_core.cli export model=<weights> format=onnx file=<target>
    json=true`` in a child process on the CPU (``CUDA_VISIBLE_DEVICES`` empty: the export
    is checked by onnxruntime on the CPU anyway, and leaves the worker's GPUs alone).

    Returns:
        The engine's ``ExportResult`` as a dict without its ``path`` (a server path), plus
        the file's ``sha256`` and ``bytes``.

    Raises:
        ExportFailed: the child failed (the engine's ``error:`` line: a failed onnxruntime
            check, the exporter's error, onnx not installed on the worker), ran past
            ``timeout_s`` seconds (killed), or wrote no file.
    """
    import libreyolo_core

    if not weights.is_file():
        raise ExportFailed("the model's weights file is missing on the server")
    target.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    root = str(Path(libreyolo_core.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    cmd = [python, "-m", "libreyolo_core.cli", "export", f"model={weights}", "format=onnx",
           f"file={target}", "json=true"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env,
                              cwd=target.parent)
    except subprocess.TimeoutExpired:
        raise ExportFailed(f"the export took longer than {timeout_s:g} s (export_timeout_s)") \
            from None
    except OSError as exc:
        raise ExportFailed(f"the exporter could not start: {exc}") from None
    lines = proc.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except ValueError:
        result = None
    if proc.returncode != 0 or not isinstance(result, dict) or not target.is_file():
        said = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        why = next((ln.split("error:", 1)[1].strip() for ln in reversed(said)
                    if "error:" in ln), said[-1].strip() if said else "no output")
        why = why.replace(str(target), "the file").replace(str(weights), "the model's file")
        raise ExportFailed(f"the export failed (exit {proc.returncode}): {why}"[:_ERROR_CHARS])
    result.pop("path", None)
    digest = hashlib.sha256()
    with target.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return result | {"sha256": digest.hexdigest(), "bytes": target.stat().st_size}
