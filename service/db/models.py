"""Tables: users, tokens, jobs, job_nodes, job_events, artifacts, datasets, models, workers.

Times are UTC-aware datetimes (``*_at``); event times are unix seconds as the engine
writes them. Tokens are stored as the sha256 hex of the token, never the token.
"""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from service.lifecycle import JobStatus


def utcnow() -> datetime:
    """Current time, UTC-aware."""
    return datetime.now(UTC)


def new_id(prefix: str) -> str:
    """Time-ordered id: ``<prefix><12 hex ms since epoch><12 random hex>`` (sorts by creation)."""
    return f"{prefix}{int(time.time() * 1000):012x}{secrets.token_hex(6)}"


class UTCDateTime(TypeDecorator):
    """DateTime stored as naive UTC, returned UTC-aware (SQLite keeps no zone)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    """Declarative base of every table."""

    type_annotation_map = {dict[str, Any]: JSON, datetime: UTCDateTime}


class User(Base):
    __tablename__ = "users"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("u"))
    name: Mapped[str] = mapped_column(String(100), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    #: running jobs this user may have at once; None: the setting ``max_running_per_user``;
    #: 0: no cap (migration 0004; ``libreyolo-service users cap``)
    max_running: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Token(Base):
    __tablename__ = "tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("t"))
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100), default="")
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    #: None: never expires (migration 0008t)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)


class Job(Base):
    """A job. ``enqueued_at`` is when it last entered ``queued`` (submit or re-queue: the
    scheduler's age); ``sent_at`` when its ``run_job`` message was last sent (the reaper's
    re-send clock; migration 0004)."""

    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("owner_id", "idempotency_key", name="uq_jobs_idem"),
                      Index("ix_jobs_queue_status", "queue", "status"))

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("j"))
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    model: Mapped[str] = mapped_column(String(200))
    data: Mapped[str] = mapped_column(Text)
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    #: what the kind takes besides training keys: a tune job's TuneOptions (migration 0005)
    options: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    procs: Mapped[int] = mapped_column(Integer, default=1)
    #: hosts of one torchrun world (a multi-node job; migration 0006): ``gpus`` (or
    #: ``procs``) ranks on each
    nodes: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    priority: Mapped[int] = mapped_column(Integer, default=0)
    queue: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), index=True, default=JobStatus.QUEUED)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    #: how the last attempt ended (migration 0007e): ``infrastructure``, ``job`` or
    #: ``user`` (:mod:`service.ends`), and why; None while the first attempt runs or after
    #: a success
    end_class: Mapped[str | None] = mapped_column(String(16), nullable=True)
    end_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: re-queues after infrastructure ends (their own budget, ``max_infra_retries``)
    infra_retries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: the cluster manager's view of the attempt (migration 0009s; :mod:`worker.slurm`):
    #: ``launcher``, ``job_id`` (Slurm's), ``nodes`` (its node list), ``state`` (PENDING,
    #: RUNNING, ...), ``reason`` (Slurm's waiting reason), ``restarts``; None for the
    #: local launcher
    cluster: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    #: why no worker started this queued job although one was woken (migration 0010p),
    #: e.g. the worker's disk below ``min_free_disk_mb``; cleared by the claim
    waiting_note: Mapped[str | None] = mapped_column(Text, nullable=True)
    time_budget_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    request_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    lease_owner: Mapped[str | None] = mapped_column(String(200), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(nullable=True, index=True)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    host: Mapped[str | None] = mapped_column(String(200), nullable=True)
    event_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    events_offset: Mapped[int] = mapped_column(BigInteger, default=0)
    log_offset: Mapped[int] = mapped_column(BigInteger, default=0)
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    enqueued_at: Mapped[datetime | None] = mapped_column(nullable=True)
    sent_at: Mapped[datetime | None] = mapped_column(nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(nullable=True)


class JobNode(Base):
    """One node slot of a multi-node job's attempt (``job_nodes``, migration 0006).

    A worker takes a slot while the job is still ``queued`` (the gang gathers); the claim
    that takes the last of the job's ``nodes`` slots starts the job. ``attempt`` is the
    attempt the slot serves (the job's ``attempt`` once it runs). Node 0's worker hosts the
    torchrun rendezvous at ``addr:port`` and holds the job's own lease; every slot has its own
    lease, renewed by its worker. ``exit_code`` / ``stop`` / ``detail`` are written when the
    node's engine exits (``stop``: why its worker stopped it, e.g. ``worker shutdown``;
    ``detail``: the last lines of its log).
    """

    __tablename__ = "job_nodes"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"),
                                        primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    worker_id: Mapped[str] = mapped_column(String(200))
    host: Mapped[str] = mapped_column(String(200))
    addr: Mapped[str] = mapped_column(String(200))
    port: Mapped[int | None] = mapped_column(Integer, nullable=True)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    claimed_at: Mapped[datetime] = mapped_column(default=utcnow)
    lease_expires_at: Mapped[datetime] = mapped_column(index=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    stop: Mapped[str | None] = mapped_column(String(64), nullable=True)
    detail: Mapped[str | None] = mapped_column(Text, nullable=True)
    exited_at: Mapped[datetime | None] = mapped_column(nullable=True)


class JobEvent(Base):
    __tablename__ = "job_events"
    __table_args__ = (UniqueConstraint("job_id", "seq", name="uq_job_events_seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(BigInteger)
    time: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(16))  # log | metric | status | artifact
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)


class Artifact(Base):
    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("job_id", "path", name="uq_artifacts_path"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    path: Mapped[str] = mapped_column(String(1000))
    kind: Mapped[str] = mapped_column(String(32))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Dataset(Base):
    __tablename__ = "datasets"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("d"))
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    path: Mapped[str] = mapped_column(Text)  # the dataset yaml, absolute
    source: Mapped[str] = mapped_column(String(16))  # upload | register
    status: Mapped[str] = mapped_column(String(16), default="ready")
    report: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WorkerRow(Base):
    """A live worker process: what it serves, written by its heartbeat thread.

    ``queues`` is the list of queue names it consumes (``cpu`` or ``gpu-1``, ``gpu-2``...);
    ``last_seen_at`` is renewed every ``worker_heartbeat_s``; a row older than
    ``worker_ttl_s`` is an offline worker (the row of a clean shutdown is deleted).
    """

    __tablename__ = "workers"
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    host: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    queues: Mapped[list[str]] = mapped_column(JSON)
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
class Model(Base):
    """A registered weights file (``models`` table): an upload or a published job checkpoint.

    ``family``/``size``/``nc``/``names``/``params`` are what the engine's weights inspector
    read from the file (``names`` keys are class ids as strings); ``path`` is the stored
    file, absolute; ``source`` is ``upload`` or ``job:<job id>``.
    """

    __tablename__ = "models"
    #: one model per published job (``job:<id>``), so concurrent publishes make one
    #: (migration 0010p); uploads (``upload``) may repeat
    __table_args__ = (Index("uq_models_published_source", "source", unique=True,
                            sqlite_where=text("source <> 'upload'"),
                            postgresql_where=text("source <> 'upload'")),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("m"))
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    family: Mapped[str] = mapped_column(String(32))
    size: Mapped[str] = mapped_column(String(16))
    nc: Mapped[int] = mapped_column(Integer)
    names: Mapped[dict[str, Any]] = mapped_column(JSON)
    params: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    bytes: Mapped[int] = mapped_column(BigInteger)
    format: Mapped[str] = mapped_column(String(32))
    imgsz: Mapped[int | None] = mapped_column(Integer, nullable=True)
    source: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: ``ready``; ``inspecting`` while a published checkpoint is read after the publish
    #: answered (the facts above are placeholders then); ``failed`` (``error`` says why)
    state: Mapped[str] = mapped_column(String(16), default="ready", server_default="ready")
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: the ONNX export (migration 0011e): None (never asked), ``exporting`` (asked at
    #: ``onnx_requested_at``, a worker started it at ``onnx_started_at``), ``ready``
    #: (``<model_root>/<id>.onnx``; ``onnx_info``: the export's facts and check figure),
    #: ``failed`` (``onnx_error`` says why; exporting again retries)
    onnx_state: Mapped[str | None] = mapped_column(String(16), nullable=True)
    onnx_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    onnx_info: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    onnx_requested_at: Mapped[datetime | None] = mapped_column(nullable=True)
    onnx_started_at: Mapped[datetime | None] = mapped_column(nullable=True)
