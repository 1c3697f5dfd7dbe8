"""A service ``predict`` job: ``libreyolo train spec=job.json`` with ``kind: predict``.

The worker writes the spec (:func:`worker.launch.job_spec`); this module runs the model
(``spec.model``: a weights file or a model name) on ``spec.data`` and writes, under the run
directory ``<project>/<name>``:

- ``predict/<image name>``: each image annotated (boxes, class names, scores);
- ``predictions.json``: the COCO results list of :class:`~libreyolo_core.predict.PredictSaver`
  (``image_id``, ``file_name``, ``category_id``, ``bbox`` ``[x, y, w, h]`` in original-image
  pixels, ``score``);
- ``predict.json``: the summary the worker puts in the job's ``result.predict``: ``images``,
  ``detections``, ``names`` (class id -> name), ``files`` (the annotated images, relative to
  the run directory), ``conf``, ``iou``, ``imgsz``, ``max_det``.

``spec.data`` is a dataset yaml (its ``params.split`` is predicted, default ``val``), or an
image, a folder of images, or a list file (what ``libreyolo predict source=`` reads).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from libreyolo_core.records.job import JobSpec

__all__ = ["PREDICT_KEYS", "predict_sources", "run_predict_job"]

#: The params a predict job takes (the service checks them at submit:
#: ``service.api.predict_rules.PredictParams``), besides the worker's ``device`` and
#: ``cache_dir``.
PREDICT_KEYS = ("conf", "iou", "imgsz", "max_det", "split")


def predict_sources(data: str, split: str = "val") -> list[Path] | str:
    """What ``data`` asks to predict: the image files of split ``split`` of a dataset yaml
    (``.yaml`` / ``.yml``), else ``data`` itself (an image, a folder, a list file).

    Raises:
        DataConfigError: a yaml the loader refuses, or one without that split.
    """
    from libreyolo_core.data.config import load_data_config

    if Path(data).suffix.lower() in (".yaml", ".yml"):
        return load_data_config(data).split(split)
    return data


def run_predict_job(spec: JobSpec) -> int:
    """Run a predict job's spec (see the module) and return the exit code (0).

    Raises:
        UsageError: a params key that is not one of :data:`PREDICT_KEYS`; no ``data``.
        FileNotFoundError, DataConfigError, SourceError: a source that cannot be read.
        WeightsError: a model file that cannot be loaded.
    """
    from libreyolo_core.cli_errors import UsageError
    from libreyolo_core.facade import LibreYOLO

    params = dict(spec.params)
    device = str(params.pop("device", "auto"))
    params.pop("cache_dir", None)
    unknown = sorted(set(params) - set(PREDICT_KEYS))
    if unknown:
        raise UsageError(f"a predict job takes {', '.join(PREDICT_KEYS)}; not {', '.join(unknown)}")
    if not spec.data:
        raise UsageError("a predict job needs data (an image, a folder or a dataset yaml)")
    run_dir = Path(spec.project or "runs/predict") / (spec.name or "exp")
    run_dir.mkdir(parents=True, exist_ok=True)
    source = predict_sources(spec.data, str(params.pop("split", "val")))
    model = LibreYOLO(spec.model or "yolo9-t")
    opts: dict[str, Any] = {k: params[k] for k in ("conf", "iou", "imgsz", "max_det") if k in params}
    images = detections = 0
    for p in model.predict(source, **opts, device=device, save=True, save_json=True,
                           project=run_dir, name="predict", exist_ok=True, stream=True):
        images += 1
        detections += len(p)
    out = run_dir / "predict"
    os.replace(out / "predictions.json", run_dir / "predictions.json")
    files = sorted(f"predict/{f.name}" for f in out.iterdir() if f.is_file())
    summary = {"images": images, "detections": detections,
               "names": {str(k): v for k, v in model.names.items()}, "files": files,
               "imgsz": opts.get("imgsz") or model.imgsz, "conf": opts.get("conf", 0.25),
               "iou": opts.get("iou", 0.45), "max_det": opts.get("max_det", 300)}
    tmp = run_dir / "predict.json.tmp"
    tmp.write_text(json.dumps(summary), encoding="utf-8")
    os.replace(tmp, run_dir / "predict.json")
    print(f"done: {images} image(s), {detections} detection(s); annotated images in {out}, "
          f"predictions.json in {run_dir}")
    return 0
