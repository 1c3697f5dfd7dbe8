"""Typed views of the service's replies (pydantic; unknown fields are kept, not refused)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["ArtifactInfo", "DatasetInfo", "Event", "JobInfo", "Model", "TERMINAL_STATUSES"]

#: statuses a job never leaves.
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


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
    """

    id: str
    kind: str
    model: str
    data: str
    params: dict[str, Any] = {}
    gpus: int = 0
    procs: int = 1
    priority: int = 0
    queue: str = ""
    status: str
    attempt: int = 0
    max_attempts: int = 1
    cancel_requested: bool = False
    time_budget_s: float | None = None
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


class Model(_Model):
    """A registered weights file: pass ``id`` as a job's ``model``.

    ``family``/``size``/``nc``/``names`` (class id as a string -> name)/``params`` are what
    the service read from the file; ``source`` is ``upload`` or ``job:<job id>`` for a
    published checkpoint; ``bytes`` is the file size, ``sha256`` its digest.
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

    @property
    def model_name(self) -> str:
        """``<family>-<size>``, e.g. ``yolo9-t``."""
        return f"{self.family}-{self.size}"
