"""``job.json`` as a typed record: :class:`JobSpec`, the job spec.

The worker writes it (:func:`worker.launch.job_spec`, then :meth:`JobSpec.write`) into the
job directory; the engine reads it (``libreyolo train spec=<job.json>``,
:func:`libreyolo_core.cli.cmd_train`; a tune job's
:func:`~libreyolo_core.profiler.tune.run_tune_job`). In this project "spec" means this
record and nothing else. Torch-free (pydantic only); frozen; unknown keys are kept
(``extra="allow"``) and a spec writes back exactly the keys it was given
(:meth:`JobSpec.to_dict`), so the file keeps its shape.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["JOB_KINDS", "JobSpec"]

#: The kinds of job the engine runs.
JOB_KINDS = ("train", "profile", "tune", "predict")


class JobSpec(BaseModel):
    """What one job asks the engine to do.

    Attributes:
        kind: ``train``, ``profile`` (a window of real steps, then stop) or ``tune``
            (several profile trials in one process) or ``predict`` (the model on ``data``'s
            images: :mod:`libreyolo_core.predict_job`); absent means ``train``.
        model: a model name, a model id or a weights file's path (``None``: the engine's
            default). data: the dataset YAML's path.
        params: training keys (:class:`~libreyolo_core.config.TrainConfig` names); a CPU
            job's has ``device="cpu"``.
        project, name: the run directory is ``<project>/<name>`` (the service: ``<job
            dir>/run``). exist_ok: reuse that directory.
        resume: ``False``, or the path of the ``last.pt`` an earlier attempt left.
        tune: a tune job's options (:class:`~libreyolo_core.profiler.tune.TuneOptions`).
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    kind: str = "train"
    model: str | None = None
    data: str | None = None
    params: dict[str, Any] = {}
    project: str | None = None
    name: str | None = None
    exist_ok: bool | None = None
    resume: bool | str | None = None
    tune: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``job.json`` object: the keys that were set, nothing added."""
        return self.model_dump(mode="json", exclude_unset=True)

    def write(self, path: Path) -> None:
        """Write ``path`` atomically (a temporary file, then a rename), indented JSON."""
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2))
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: Path) -> JobSpec:
        """The spec in ``path``.

        Raises:
            OSError: unreadable. ValueError: not JSON, or a value of the wrong type
                (``pydantic.ValidationError``).
        """
        return cls.model_validate(json.loads(path.read_text(encoding="utf-8")))
