"""Typed views of the service's replies (pydantic; unknown fields are kept, not refused)."""

from __future__ import annotations

import os
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

__all__ = ["ArtifactInfo", "Box", "DatasetInfo", "Event", "JobInfo", "JobStatus", "Model",
           "NodeWorker",
           "OnnxExport", "Preflight", "boxes_from", "exported", "published",
           "PreflightActual", "ReportImage", "ReportRow", "TuneReport", "TuneRow", "ValReport",
           "TERMINAL_STATUSES", "boxes_from"]



class JobStatus(StrEnum):
    """A job's ``status``. Its members are strings, so ``job.status == "queued"`` and
    ``job.status == JobStatus.QUEUED`` are both true of a queued job."""

    #: waiting for a worker (``JobInfo.waiting`` says why it cannot start yet)
    QUEUED = "queued"
    #: a worker runs it
    RUNNING = "running"
    #: cancel requested; the worker is stopping the engine
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def done(self) -> bool:
        """True for the statuses a job never leaves (succeeded, failed, cancelled)."""
        return self in TERMINAL_STATUSES


#: statuses a job never leaves.
TERMINAL_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class NodeWorker(_Model):
    """One node of a multi-node job: its ``node_rank`` (0 hosts the rendezvous), the
    ``worker`` that claimed it, that worker's ``host`` name and ``addr`` (the address the
    other nodes reach it at), and once its engine exited the ``exit_code`` and ``stop``
    (why its worker stopped it, e.g. ``worker shutdown``; None when it ended by itself)."""

    node_rank: int
    worker: str
    host: str = ""
    addr: str = ""
    exit_code: int | None = None
    stop: str | None = None


class JobInfo(_Model):
    """A job as ``GET /v1/jobs/{id}`` returns it.

    ``progress`` holds the latest epoch, epochs, step, steps, eta_s, losses and metrics (a
    profile job: ``phase="profiling"``, ``step`` of ``steps`` = ``warmup`` + ``measured``);
    ``result`` (on success) the final ``metrics``, ``best_epoch`` and, for profile jobs,
    ``verdict`` and ``bound_why``; ``error`` (on failure) ``reason``, ``exit_code`` and
    ``log_tail``. Times are UTC; ``duration_s`` is in seconds. ``waiting`` says why a
    queued job cannot start (``"waiting for a gpu-1 worker (none online)"``);
    ``warnings`` (submit only) what may keep it from running. A queued job has its
    ``queue_position`` (1: next to start), ``effective_priority`` (priority plus aging)
    and ``estimated_start`` (None when the service cannot tell).

    ``gpus`` and ``procs`` are per node: a multi-node job (``nodes`` > 1) runs
    ``world_size`` = ``nodes`` x ``gpus`` (or ``procs``) ranks, and ``node_workers`` lists
    its nodes of the latest attempt (while it waits for its workers, the nodes claimed so
    far); ``node_workers`` is None for a one-node job. A job run on Slurm has ``cluster``
    (Slurm's job id, nodes, state and reason); while Slurm keeps it pending it is
    ``queued`` and ``waiting`` says Slurm's reason (``"Slurm: Resources (job 12)"``).
    """

    id: str
    kind: str
    model: str
    data: str
    params: dict[str, Any] = {}
    gpus: int = 0
    procs: int = 1
    nodes: int = 1
    #: ranks of the job in all (0: not reported by the service)
    world_size: int = 0
    node_workers: list[NodeWorker] | None = None
    priority: int = 0
    queue: str = ""
    #: a :class:`JobStatus` (a status this SDK does not know is kept as a string)
    status: Annotated[JobStatus | str, Field(union_mode="left_to_right")]
    attempt: int = 0
    max_attempts: int = 1
    #: how the last attempt ended: "infrastructure" (re-queued, no attempt used), "job"
    #: (failed at once) or "user" (cancel); None while the first runs and after a success
    end_class: str | None = None
    #: why it ended so
    end_reason: str | None = None
    #: re-queues after infrastructure ends so far
    infra_retries: int = 0
    cancel_requested: bool = False
    time_budget_s: float | None = None
    #: a tune job's options (repeat, warmup, steps, max_candidates, budget_s, min_gain)
    tune: dict[str, Any] | None = None
    progress: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    duration_s: float | None = None
    #: ``model`` as people say it: the name, the registered model's id, ``job:<id>``.
    started_from: str | None = None
    waiting: str | None = None
    warnings: list[str] = []
    queue_position: int | None = None
    effective_priority: int | None = None
    estimated_start: datetime | None = None
    #: a job the service ran on a cluster (its worker's launcher ``slurm``): ``launcher``,
    #: ``job_id`` (Slurm's), ``nodes`` (Slurm's node list), ``state``, ``reason`` (why it
    #: waits in Slurm's queue: ``Resources``, ``Priority``, ...), ``restarts``
    cluster: dict[str, Any] | None = None
    @property
    def done(self) -> bool:
        """True once the status is terminal (succeeded, failed or cancelled)."""
        return self.status in TERMINAL_STATUSES


class Event(_Model):
    """One job event: ``seq`` (1, 2, 3... per job), ``time`` (unix seconds), ``kind``
    (``status``, ``metric``, ``artifact`` or ``log``) and the event's ``data``."""

    seq: int
    time: float
    kind: str
    data: dict[str, Any] = {}

    @property
    def name(self) -> str:
        """The engine or service event name (``progress``, ``epoch_end``, ``status``...)."""
        return str(self.data.get("event", self.kind))


class ArtifactInfo(_Model):
    """A file of a job's run directory. ``sha256`` is None while the job runs."""

    path: str
    kind: str = "other"
    size_bytes: int = 0
    sha256: str | None = None
    url: str = ""


class DatasetInfo(_Model):
    """A registered or uploaded dataset: ``id`` (pass it as ``data=``), its yaml ``path``
    on the service, ``status`` (``ready`` or ``invalid``) and the scan ``report``."""

    id: str
    name: str
    path: str
    source: str = ""
    status: str = ""
    report: dict[str, Any] | None = None
    created_at: datetime | None = None


class OnnxExport(_Model):
    """A model's ONNX export on the service: ``state`` ``none`` (never asked),
    ``exporting``, ``ready`` or ``failed`` (``error`` says why). ``info`` (ready): the
    engine's export record: ``max_diff`` (the onnxruntime check's worst
    ``|ort - torch| / (1 + |torch|)``), ``tolerance``, ``layout``, ``opset``, ``imgsz``,
    ``check_shape``, and the file's ``sha256`` and ``bytes``."""

    state: str = "none"
    error: str | None = None
    info: dict[str, Any] | None = None
    requested_at: datetime | None = None


class Model(_Model):
    """A registered weights file: pass ``id`` as a job's ``model``.

    ``family``/``size``/``nc``/``names`` (class id as a string -> name)/``params`` are what
    the service read from the file; ``source`` is ``upload`` or ``job:<job id>`` for a
    published checkpoint; ``bytes`` is the file size, ``sha256`` its digest. ``state``:
    ``ready``; ``inspecting`` right after a publish (the facts are placeholders until the
    service has read the checkpoint); ``failed`` (``error`` says why).
    """

    id: str
    name: str
    family: str
    size: str
    nc: int
    names: dict[str, str] = {}
    params: int = 0
    sha256: str = ""
    bytes: int = 0
    format: str = ""
    imgsz: int | None = None
    source: str = ""
    created_at: datetime | None = None
    state: str = "ready"
    error: str | None = None
    #: its ONNX export (:meth:`export`)
    onnx: OnnxExport = Field(default_factory=OnnxExport)
    #: export only: what may keep the export from running (no live worker)
    warnings: list[str] = []
    #: the client that read it (``Client`` or ``AsyncClient``), for :meth:`export`,
    #: :meth:`download` and :meth:`predict`
    _client: Any = PrivateAttr(None)

    @property
    def model_name(self) -> str:
        """``<family>-<size>``, e.g. ``yolo9-t``."""
        return f"{self.family}-{self.size}"

    def predict(self, path: Any, **kw: Any) -> Any:
        """The boxes this model finds in the image ``path``, run on a worker:
        ``Client.predict(self.id, path, **kw)`` (a ``list[Box]``; with an ``AsyncClient``
        a coroutine of it).

        Raises:
            RuntimeError: a model made by hand, not read through a client.
        """
        return self._bound().predict(self.id, path, **kw)

    def export(self, format: str = "onnx", *, wait: bool = True, timeout: float = 1800.0
               ) -> Any:
        """Have the service export this model (``Client.export_model``): returns the model
        with ``onnx`` ``ready`` (``wait``), or as the request answered. From an
        ``AsyncClient`` this returns an awaitable.

        Raises:
            RuntimeError: the model was not read through a client.
            ExportFailed, WaitTimeout, Conflict: as ``Client.export_model``.
        """
        return self._bound().export_model(self.id, format, wait=wait, timeout=timeout)

    def download(self, dest: str | os.PathLike[str] | None = None, format: str = "pt") -> Any:
        """Download this model's ``.pt`` (or, ``format="onnx"``, its ONNX export) with
        ``Client.download_model``; from an ``AsyncClient`` an awaitable."""
        return self._bound().download_model(self.id, dest, format=format)

    def _bound(self) -> Any:
        if self._client is None:
            raise RuntimeError("this Model was not read through a Client: use "
                               "client.export_model(model_id) / client.download_model(model_id) "
                               "/ client.predict(model_id, path)")
        return self._client

    def bind(self, client: Any) -> Model:
        """This model, remembering ``client`` (what :meth:`export`, :meth:`download` and
        :meth:`predict` use)."""
        self._client = client
        return self


class Box(_Model):
    """One detection: ``xyxy`` (x1, y1, x2, y2, pixels of the original image), ``conf``
    (score, 0..1), ``cls`` (class id) and its ``name``."""

    xyxy: tuple[float, float, float, float]
    conf: float
    cls: int
    name: str


def boxes_from(predictions: list[dict[str, Any]], names: dict[str, str]) -> list[Box]:
    """``predictions.json`` (COCO results: ``bbox`` ``[x, y, w, h]``, ``score``,
    ``category_id``) as :class:`Box` es, highest score first; ``names``: class id (a
    string) -> name (a predict job's ``result.predict.names``)."""
    out = []
    for p in predictions:
        x, y, w, h = (float(v) for v in p["bbox"])
        cls = int(p["category_id"])
        out.append(Box(xyxy=(x, y, x + w, y + h), conf=float(p["score"]), cls=cls,
                       name=names.get(str(cls), str(cls))))
    return sorted(out, key=lambda b: -b.conf)


def published(model: Model) -> bool:
    """True when ``model`` is ready, False while the service still inspects it.

    Raises:
        ValidationError: the service refused the checkpoint (``field`` ``job``, the
            reason in ``detail``).
    """
    if model.state == "failed":
        from libreyolo_client._errors import ValidationError

        raise ValidationError(422, f"model {model.id}: {model.error or 'inspection failed'}",
                              problem={"field": "job", "model_id": model.id})
    return model.state != "inspecting"


def exported(model: Model) -> bool:
    """True when ``model``'s ONNX export is ready, False while it is still being made.

    Raises:
        ExportFailed: the export failed (the reason the service recorded).
    """
    if model.onnx.state == "failed":
        from libreyolo_client._errors import ExportFailed

        raise ExportFailed(model.id, model.onnx.error or "no reason recorded")
    return model.onnx.state == "ready"


class TuneRow(_Model):
    """One configuration a tune job profiled (the baseline or a candidate).

    ``params``: the training keys it changes; ``img_per_s`` (mean), ``img_per_s_std``
    (population std) and ``n`` over its trials; ``step_ms``; ``verdict``; ``significant``
    (``profile compare``: beyond 2 x the combined standard error; ``None`` for the
    baseline); ``gain`` (relative img/s gain, 0.5 = +50 %); ``recommendable`` (significant,
    at least ``min_gain``, every trial faster, not explained by the machine's load);
    ``note`` (why, in words); ``side_effect`` (what it changes besides speed);
    ``epoch_s`` (expected epoch time, seconds).
    """

    name: str
    label: str = ""
    params: dict[str, Any] = {}
    img_per_s: float | None = None
    img_per_s_std: float | None = None
    n: int | None = None
    step_ms: float | None = None
    verdict: str | None = None
    significant: bool | None = None
    gain: float | None = None
    recommendable: bool = False
    note: str | None = None
    side_effect: str | None = None
    epoch_s: float | None = None


class TuneReport(_Model):
    """A tune job's result (``result["tune"]``, the job's ``tune.json``).

    ``status``: ``complete``, ``budget`` (the time budget stopped it) or ``cancelled``;
    ``answer``: the recommendation or ``"no significant lever on this device: ..."``;
    ``recommended``: the row recommended, or ``None``; ``recommended_params``: the whole
    parameter set to train with (the baseline's keys with the recommended changes), e.g.
    ``c.train(model, data, **report.recommended_params)``; ``expected_epoch_s`` with it and
    ``baseline_epoch_s``; ``also``: faster levers that change the training.
    """

    status: str
    answer: str = ""
    device: str | None = None
    verdict: str | None = None
    baseline: TuneRow | None = None
    candidates: list[TuneRow] = []
    recommended: TuneRow | None = None
    recommended_params: dict[str, Any] = {}
    expected_epoch_s: float | None = None
    baseline_epoch_s: float | None = None
    also: list[str] = []
    notes: list[str] = []
    trials_run: int = 0
    elapsed_s: float | None = None

    @property
    def rows(self) -> list[TuneRow]:
        """The baseline, then every candidate."""
        return ([self.baseline] if self.baseline else []) + list(self.candidates)


class PreflightActual(_Model):
    """What the run took, beside the estimate (seconds): completed ``epochs``, mean
    ``epoch_time_s``, ``first_epoch_s``, ``train_s`` and ``val_s`` sums, mean
    ``val_time_s``, the engine's ``wall_s``."""

    epochs: int = 0
    epoch_time_s: float | None = None
    first_epoch_s: float | None = None
    train_s: float | None = None
    val_s: float | None = None
    val_time_s: float | None = None
    wall_s: float | None = None


class Preflight(_Model):
    """A train job's preflight estimate (``result["preflight"]``; seconds, MiB).

    ``img_per_s``, ``step_ms``, ``epoch_s`` (one epoch's training), ``val_s`` (one
    validation), ``total_s`` (the whole run: the ETA at its start), ``peak_memory_mb`` with
    ``memory_kind``, ``cost`` in ``currency`` when the service has a GPU-hour price (a GPU
    job), ``phases`` (with and without mosaic), ``notes``; ``actual`` once the run ended.
    """

    img_per_s: float
    step_ms: float | None = None
    epoch_s: float
    val_s: float | None = None
    total_s: float
    epochs: int = 0
    validations: int = 0
    steps_per_epoch: int | None = None
    peak_memory_mb: float | None = None
    memory_kind: str | None = None
    device: str | None = None
    gpu_hours: float | None = None
    cost: float | None = None
    currency: str | None = None
    phases: list[dict[str, Any]] = []
    notes: list[str] = []
    actual: PreflightActual | None = None


class ReportRow(_Model):
    """One row of the validation report's per-class table: ``class`` (``"all"`` for the
    first row, whose ``id`` is None), ``images`` and ``instances`` of the class in the
    split, ``precision``, ``recall`` (at the confidence of best mean F1), ``mAP50`` and
    ``mAP50-95``; a class without instances has ``no_instances`` True and None metrics."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: str = Field(alias="class")
    id: int | None = None
    images: int = 0
    instances: int = 0
    precision: float | None = None
    recall: float | None = None
    mAP50: float | None = None
    mAP50_95: float | None = Field(None, alias="mAP50-95")
    no_instances: bool = False


class ReportImage(_Model):
    """A picture of the report's detections (``file`` under ``val/``; ground truth beside
    the predictions): counts of ``tp``, ``fp``, ``fn`` and the classes seen, falsely
    predicted and missed."""

    file: str
    source: str = ""
    classes: list[str] = []
    tp: int = 0
    fp: int = 0
    fn: int = 0
    fp_classes: list[str] = []
    fn_classes: list[str] = []


class ValReport(_Model):
    """A training job's validation report (its ``val/report.json``).

    ``table``: the per-class rows (:class:`ReportRow`, ``"all"`` first); ``metrics`` the
    "all" figures; ``pr_curve`` ``{"recall": [101], "precision": {class: [101]}, "mean",
    "mAP50"}``; ``confidence_curves`` P, R and F1 against the score threshold and
    ``best_conf``; ``confusion_matrix`` ``{"labels", "counts", "normalized", "conf",
    "iou"}`` (rows true, columns predicted, the last one background); ``images`` the
    pictures (:class:`ReportImage`); ``files`` the plots and COCO files under ``val/``
    (download them with ``job.download("val/" + name)``).
    """

    version: int = 1
    epoch: int | None = None
    metrics: dict[str, float] = {}
    table: list[ReportRow] = []
    pr_curve: dict[str, Any] = {}
    confidence_curves: dict[str, Any] = {}
    confusion_matrix: dict[str, Any] = {}
    images: list[ReportImage] = []
    files: dict[str, str] = {}

    def row(self, name: str) -> ReportRow:
        """The table row of class ``name`` (``"all"`` for the totals).

        Raises:
            KeyError: no such class.
        """
        for r in self.table:
            if r.name == name:
                return r
        raise KeyError(f"no class {name!r} in the report (classes: {', '.join(r.name for r in self.table)})")
