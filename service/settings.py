"""Service settings: one object, read from the environment (prefix ``LIBREYOLO_``).

Nothing reads these at import time: build a :class:`Settings` and pass it to
``create_app(settings)``, the Celery app factory and the worker. Every path default lives
under ``home`` (``./.libreyolo`` by default), so the embedded mode needs nothing installed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

__all__ = ["Settings"]


class Settings(BaseSettings):
    """Configuration of the API, the workers and the reaper.

    Environment variables are the field names upper-cased with the ``LIBREYOLO_`` prefix,
    e.g. ``LIBREYOLO_DATABASE_URL``, ``LIBREYOLO_BROKER_URL``, ``LIBREYOLO_LEASE_S``.
    """

    model_config = SettingsConfigDict(env_prefix="LIBREYOLO_", extra="ignore")

    home: Path = Field(Path(".libreyolo"), description="state folder of the embedded mode")
    database_url: str = Field(
        "", description="SQLAlchemy URL; default sqlite:///<home>/libreyolo.db (WAL mode)"
    )
    broker_url: str = Field(
        "", description="Celery broker; default kombu SQLAlchemy transport on <home>/broker.db; "
        "redis://host:6379/0 in production"
    )
    broker_transport_options: dict = Field(
        default_factory=dict, description="extra kombu transport options (JSON)"
    )
    broker_poll_s: float = Field(
        0.1, gt=0, description="poll interval of polling brokers (the embedded kombu "
        "SQLAlchemy transport; kombu's default is 1 s, which is the submit->running latency)"
    )
    artifact_root: Path = Field(default_factory=lambda data: Path(data["home"]) / "jobs",
                                description="job folders; default <home>/jobs")
    upload_root: Path = Field(default_factory=lambda data: Path(data["home"]) / "datasets",
                              description="dataset uploads; default <home>/datasets")
    model_root: Path = Field(default_factory=lambda data: Path(data["home"]) / "models",
                             description="registered weights files; default <home>/models")
    cache_root: Path = Field(default_factory=lambda data: Path(data["home"]) / "cache",
                             description="label-scan and image caches of jobs, by content (a job "
                             "never writes into a dataset folder); default <home>/cache")
    credentials_path: Path = Field(
        Path("~/.config/libreyolo/credentials"),
        description="where `up` saves the admin token for the SDK (JSON, mode 600)",
    )
    require_token: bool = Field(
        True, description="bearer token on every API route but health/ready/metrics; when "
        "false, anonymous requests act as the built-in admin 'local'"
    )
    default_gpus: int = Field(0, ge=0, le=8, description="gpus of a job that does not say")
    lease_s: float = Field(60.0, gt=0, description="job lease length; a silent worker loses it")
    heartbeat_s: float = Field(10.0, gt=0, description="lease renewal interval of the runner")
    poll_interval_s: float = Field(0.5, gt=0, description="runner: tail / cancel poll interval")
    grace_s: float = Field(30.0, ge=0, description="SIGTERM -> SIGKILL grace period on cancel")
    max_attempts: int = Field(3, ge=1, description="runs of one job (first + resumes)")
    max_infra_retries: int = Field(
        10, ge=0, description="re-queues of one job after infrastructure ends of an attempt "
        "(worker or node lost, database or broker outage past the lease, host OOM kill, disk "
        "full, hang): their own budget, apart from max_attempts; job ends (config, data, code "
        "error) fail at once")
    retry_after_s: int = Field(
        5, ge=1, le=3600, description="Retry-After of the API's 503 while the database or "
        "the broker is unavailable")
    hang_factor: float = Field(
        10.0, gt=1, description="hang watchdog k: a rank with no step finished for "
        "max(k x median step time, hang_min_s) dumps every rank's stacks into the log, its "
        "tree is killed and the attempt ends 'infrastructure: hang' (re-queued, resumes)")
    hang_min_s: float = Field(
        600.0, gt=0, description="hang watchdog T, seconds: the shortest silence called a "
        "hang (also the limit before the first step has finished)")
    min_free_disk_mb: float = Field(
        1024.0, ge=0, description="a worker starts no job while the disk of artifact_root "
        "has less free space than this (MB): the job stays queued with the reason "
        "(its waiting field), and a worker with room may take it; 0 turns the check off")
    disk_recheck_s: float = Field(
        10.0, gt=0, description="a worker below min_free_disk_mb that was woken re-sends the "
        "wake-up (for a worker with room) and waits this long before it takes another")
    worker_heartbeat_s: float = Field(
        10.0, gt=0, description="how often a worker writes its row in the workers table")
    worker_ttl_s: float = Field(
        35.0, gt=0, description="a worker whose last heartbeat is older than this is offline")
    refuse_unserved: bool = Field(
        False, description="submit answers 409 (instead of a warning) when no live worker "
        "serves the job's queue")
    max_running_per_user: int = Field(
        4, ge=0, description="running jobs one user may have at once (all queues together); "
        "0: no cap. An admin sets a user's own cap with `libreyolo-service users cap`")
    aging_minutes: float = Field(
        15.0, gt=0, description="a queued job's effective priority rises by 1 for every "
        "aging_minutes it has waited, up to 9 (the highest priority a job can be given), so "
        "no job waits for ever behind newer higher-priority ones")
    worker_addr: str = Field(
        "127.0.0.1", min_length=1, max_length=200, description="the address other hosts "
        "reach this worker at (LIBREYOLO_WORKER_ADDR): node 0 of a multi-node job hosts the "
        "torchrun rendezvous there and its ranks talk from it. Set it to the host's private "
        "network address on every worker host of a multi-node pool")
    max_nodes: int = Field(16, ge=1, le=256, description="the most nodes one job may ask for")
    gang_wait_s: float = Field(
        120.0, gt=0, description="a worker holding a node slot of a multi-node job that has "
        "not gathered all its nodes after this many seconds releases the slot (the job stays "
        "queued; a log line and a job event say why), so two multi-node jobs never hold "
        "each other's workers for ever")
    reaper_interval_s: float = Field(15.0, gt=0, description="reaper timer in the API process")
    reaper_enabled: bool = Field(True, description="run the reaper in the API process")
    resend_after_s: float = Field(
        600.0, gt=0, description="re-send the message of a job queued this long (lost message)"
    )
    sse_poll_s: float = Field(0.25, gt=0, description="SSE: how often each API process "
                              "checks for new events (one statement, whatever the number of "
                              "open streams; service/streams.py)")
    sse_ping_s: float = Field(15.0, gt=0, description="SSE: keep-alive comment interval")
    max_upload_bytes: int = Field(2 << 30, gt=0, description="dataset zip size cap")
    max_uncompressed_bytes: int = Field(8 << 30, gt=0, description="dataset total inflated size cap")
    max_model_bytes: int = Field(1 << 30, gt=0, description="uploaded weights file size cap")
    max_predict_bytes: int = Field(10 << 20, gt=0, description="'Try it' (POST /v1/predict): "
                                   "the image size cap")
    max_predict_pixels: int = Field(40_000_000, gt=0, description="'Try it': the image's "
                                    "width x height cap (a small file can decode to a huge "
                                    "image)")
    predict_time_budget_s: float = Field(
        120.0, gt=0, description="'Try it' (POST /v1/predict): the time budget of its predict "
        "job, seconds (the run is stopped and failed after it)")
    max_json_bytes: int = Field(1 << 20, gt=0, description="body cap of every other request "
                                "(JSON, forms); checked after authentication, before reading")
    max_header_count: int = Field(100, gt=0, description="headers of one request (431 past it)")
    max_header_bytes: int = Field(64 << 10, gt=0, description="bytes of all headers of a request")
    max_url_chars: int = Field(16 << 10, gt=0, description="characters of a request's path and query")
    inspect_timeout_s: float = Field(
        120.0, gt=0, description="time limit of the child process that reads an uploaded "
        "weights file (`python -m libreyolo_core.weights inspect`)"
    )
    export_timeout_s: float = Field(
        1800.0, gt=0, description="time limit of a registered model's ONNX export on a worker "
        "(`POST /v1/models/{id}/export`: the engine's `libreyolo export` in a child process, "
        "checked by onnxruntime); an export started longer ago than this + 60 s reads as failed"
    )
    max_compression_ratio: float = Field(
        200.0, gt=1, description="inflated/compressed cap per file over 1 MiB and for the whole zip")
    max_zip_members: int = Field(200_000, gt=0, description="files + folders in one dataset zip")
    max_zip_member_bytes: int = Field(1 << 30, gt=0, description="inflated size of one zip member")
    max_zip_path_depth: int = Field(32, gt=0, description="folders in one zip member's path")
    max_zip_path_chars: int = Field(1024, gt=0, description="characters of one zip member's path")
    max_yaml_bytes: int = Field(1 << 20, gt=0, description="size of an uploaded dataset yaml")
    dataset_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=list, description="folders a registered dataset (or a job's data path) "
        "must lie under (comma-separated in env). Empty (the default): any folder; the artifact "
        "and upload roots are always refused (uploads are used by id)")
    check_data_paths: bool = Field(
        True, description="reject a job whose data path does not exist on the API host"
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="allowed browser origins (comma-separated in env)"
    )
    engine_python: str = Field(sys.executable, description="python that runs the engine")
    engine_command: list[str] | None = Field(
        None, description="override the engine command (JSON list); '{spec}' is replaced by the "
        "job.json path, '{nproc}' by the rank count (per node), '{nnodes}' by the job's nodes "
        "and '{node_rank}' by this worker's node. For tests and custom engines."
    )
    launcher: Literal["local", "slurm"] = Field(
        "local", description="how a worker runs a job (worker.launcher): 'local' starts "
        "torchrun on this host (a multi-node job is a gang of workers); 'slurm' submits it "
        "with sbatch from this host (the submit host) and Slurm runs srun torchrun on the "
        "nodes it allocates; the run folder (artifact_root) must be on storage they share")
    slurm_partition: str | None = Field(None, description="sbatch --partition (none: Slurm's "
                                        "default partition)")
    slurm_account: str | None = Field(None, description="sbatch --account")
    slurm_qos: str | None = Field(None, description="sbatch --qos")
    slurm_time_limit: str | None = Field(
        None, description="sbatch --time (Slurm's format, e.g. '04:00:00' or '2-00:00:00'); "
        "none: the partition's limit. The engine checkpoints slurm_signal_s before it")
    slurm_extra_args: list[str] = Field(
        default_factory=list, description="more sbatch arguments (JSON list), e.g. "
        "[\"--constraint=a100\", \"--exclusive\"]")
    slurm_signal_s: int = Field(
        60, ge=1, description="sbatch --signal=B:USR1@<this>: seconds before the time limit "
        "that the engine is told to save last.pt and stop (Slurm sends it only before the "
        "time limit; a preemption sends SIGTERM, which does the same)")
    slurm_port_base: int = Field(
        29500, ge=1024, le=60000, description="the torchrun rendezvous port of a Slurm job is "
        "this + (Slurm job id mod 1000), on its first node")
    slurm_poll_s: float = Field(1.0, gt=0, description="how often the worker asks Slurm "
                                "(squeue/scontrol) about a job it submitted")
    slurm_fair_share: Literal["ours", "slurm"] = Field(
        "ours", description="'ours': our scheduler picks what to submit and when (priority, "
        "aging, the per-user cap, as for local workers); 'slurm': every job is submitted as "
        "soon as a worker takes its message, without our per-user cap, with the job's "
        "priority as sbatch --nice, and Slurm's fair share and QoS decide the order")
    log_tail_lines: int = Field(40, ge=1, description="log lines kept in a failed job's error")
    gpu_hour_price: float | None = Field(
        None, gt=0, description="price of one GPU hour: a train job's preflight estimate "
        "gives its cost (the worker passes it to the engine as LIBREYOLO_GPU_HOUR_PRICE)")
    currency: str = Field("USD", min_length=1, max_length=8,
                          description="currency of gpu_hour_price")
    mlflow_tracking_uri: str | None = Field(
        None, description="MLflow tracking server: every job logs its run there (the worker "
        "passes it to the engine as MLFLOW_TRACKING_URI) and a publish registers a version")

    @model_validator(mode="before")
    @classmethod
    def _split_origins(cls, data):
        if isinstance(data, dict) and isinstance(data.get("cors_origins"), str):
            raw = data["cors_origins"]
            data = {**data, "cors_origins": [o.strip() for o in raw.split(",") if o.strip()]}
        if isinstance(data, dict) and isinstance(data.get("dataset_roots"), str):
            raw = data["dataset_roots"]
            data = {**data, "dataset_roots": [r.strip() for r in raw.split(",") if r.strip()]}
        return data

    def zip_limits(self):
        """The :class:`~service.storage.zipsafe.ZipLimits` of these settings."""
        from service.storage.zipsafe import ZipLimits

        return ZipLimits(max_total_bytes=self.max_uncompressed_bytes, max_ratio=self.max_compression_ratio,
                         max_members=self.max_zip_members, max_member_bytes=self.max_zip_member_bytes,
                         max_depth=self.max_zip_path_depth, max_path_chars=self.max_zip_path_chars,
                         max_yaml_bytes=self.max_yaml_bytes)

    @model_validator(mode="after")
    def _fill_paths(self) -> Settings:
        home = self.home.expanduser()
        if not self.database_url:
            self.database_url = f"sqlite:///{(home / 'libreyolo.db').resolve()}"
        if not self.broker_url:
            self.broker_url = f"sqla+sqlite:///{(home / 'broker.db').resolve()}"
        if self.database_url.startswith("postgres://"):
            self.database_url = "postgresql+psycopg://" + self.database_url[len("postgres://"):]
        elif self.database_url.startswith("postgresql://"):
            self.database_url = "postgresql+psycopg://" + self.database_url[len("postgresql://"):]
        self.artifact_root = self.artifact_root.expanduser().resolve()
        self.upload_root = self.upload_root.expanduser().resolve()
        self.model_root = self.model_root.expanduser().resolve()
        self.cache_root = self.cache_root.expanduser().resolve()
        self.dataset_roots = [r.expanduser().resolve() for r in self.dataset_roots]
        self.credentials_path = self.credentials_path.expanduser()
        if self.heartbeat_s >= self.lease_s:
            raise ValueError(f"heartbeat_s={self.heartbeat_s} must be shorter than "
                             f"lease_s={self.lease_s} (the lease would lapse between beats)")
        if self.worker_heartbeat_s >= self.worker_ttl_s:
            raise ValueError(f"worker_heartbeat_s={self.worker_heartbeat_s} must be shorter than "
                             f"worker_ttl_s={self.worker_ttl_s} (a live worker would look offline)")
        return self

    def ensure_dirs(self) -> None:
        """Create the state folders (home, artifacts, uploads, models, SQLite files' parents)."""
        for url in (self.database_url, self.broker_url):
            if "sqlite:///" in url:
                Path(url.split("sqlite:///", 1)[1]).parent.mkdir(parents=True, exist_ok=True)
        self.artifact_root.mkdir(parents=True, exist_ok=True)
        self.upload_root.mkdir(parents=True, exist_ok=True)
        self.model_root.mkdir(parents=True, exist_ok=True)
