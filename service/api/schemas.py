"""Request and response schemas, one per role (create / public / page)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "JobStatusName", "JobKind", "TuneOptionsIn", "JobCreate", "JobPublic", "JobsPage", "EventPublic", "EventsPage", "ArtifactPublic",
    "ArtifactsList", "DatasetRegister", "DatasetPublic", "DatasetsPage",
]


#: A job's status as the API says it: the values of :class:`service.lifecycle.JobStatus`
#: (a Literal, so the OpenAPI document lists them inline).
JobStatusName = Literal["queued", "running", "cancelling", "succeeded", "failed", "cancelled"]
#: A name or path: no NUL, newline, ESC or other control character.
NO_CONTROL = r"^[^\x00-\x1f\x7f]*$"
#: The longest dataset path (or id) a request may send.
MAX_PATH_CHARS = 4096

#: What a job does.
JobKind = Literal["train", "profile", "tune", "predict"]


class TuneOptionsIn(BaseModel):
    """How hard a ``tune`` job looks (libreyolo_core.profiler.tune.TuneOptions; the same
    defaults and bounds)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    repeat: int = Field(3, ge=2, le=10, description="trials per configuration (significance "
                        "needs 2)")
    warmup: int = Field(3, ge=0, le=1000, description="discarded steps of each trial")
    steps: int = Field(10, ge=2, le=1000, description="measured steps of each trial (the "
                       "window is fitted into one epoch)")
    max_candidates: int = Field(6, ge=1, le=12, description="configurations profiled besides "
                                "the baseline")
    budget_s: float | None = Field(1800.0, gt=0, le=366 * 86400, description="time budget in seconds: no "
                                   "trial starts that would end past it; null: none")
    min_gain: float = Field(0.05, ge=0, lt=10, description="smallest img/s gain recommended, "
                            "a fraction (0.05 = 5%)")


class JobCreate(BaseModel):
    """What a client may send to ``POST /v1/jobs``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, json_schema_extra={"examples": [{
        "kind": "train", "model": "yolo9-t", "data": "/data/coco8/data.yaml",
        "params": {"epochs": 10, "batch": 16, "imgsz": 320}, "gpus": 1,
    }]})

    kind: JobKind = Field("train", description="train, profile, tune (profile the "
                          "configuration, try the levers its verdict names, recommend only "
                          "gains beyond noise), or predict (run the model on the dataset's "
                          "params.split: annotated images and predictions.json)")
    model: str = Field(..., max_length=500, pattern=NO_CONTROL, description="model name <family>-<size>, e.g. "
                       "yolo9-t, a registered model id (m...), or a checkpoint of an "
                       "earlier job: job:<id>/weights/best.pt")
    data: str = Field(..., min_length=1, max_length=MAX_PATH_CHARS, pattern=NO_CONTROL,
                      description="dataset id (d...) or a dataset yaml path the "
                      "workers can read")
    params: dict[str, Any] = Field(default_factory=dict,
                                   description="training keys (see libreyolo_core TrainConfig); "
                                   "a predict job's: conf, iou, imgsz, max_det, split")
    gpus: int | None = Field(None, strict=True, description="GPUs: 0 (CPU job), 1, 2, 4 or 8; default from "
                             "the server settings")
    procs: int = Field(1, ge=1, le=64, strict=True, description="CPU ranks (Gloo) of a gpus=0 job")
    nodes: int = Field(1, ge=1, le=256, strict=True, description="hosts of one torchrun world (a "
                       "multi-node job): each runs `gpus` ranks (or `procs` for a CPU job) "
                       "on a worker of its own; the job starts when that many workers are "
                       "free (at most the setting max_nodes)")
    priority: int = Field(0, ge=0, le=9, strict=True, description="0 (default) .. 9 (first)")
    time_budget_s: float | None = Field(None, gt=0, le=366 * 86400, description="wall-clock limit in seconds; "
                                        "the run is stopped (SIGTERM) and failed after it")
    tune: TuneOptionsIn | None = Field(None, description="a tune job's options (defaults when "
                                       "omitted); only with kind tune")


class JobPublic(BaseModel):
    """A job as the API shows it (no lease or offset bookkeeping)."""

    model_config = ConfigDict(from_attributes=True)

    id: str
    kind: str
    model: str
    data: str
    params: dict[str, Any]
    gpus: int = Field(description="GPUs per node (0: a CPU job)")
    procs: int = Field(description="ranks per node")
    nodes: int = Field(description="hosts of the job's torchrun world (1: one worker)")
    world_size: int = Field(0, description="ranks of the job in all: nodes x procs")
    node_workers: list[dict[str, Any]] | None = Field(
        None, description="a multi-node job that runs or ran: its nodes of the latest attempt "
        "(node_rank, worker, host, addr, exit_code, stop); while it gathers, the nodes "
        "claimed so far; null for a one-node job")
    priority: int
    queue: str
    status: JobStatusName = Field(description="queued, running, cancelling, succeeded, "
                                  "failed or cancelled; a job a cluster launcher submitted "
                                  "that waits in the cluster's queue (Slurm: PENDING) is "
                                  "queued, and `waiting` says Slurm's reason")
    cluster: dict[str, Any] | None = Field(
        None, description="a job run by a cluster launcher (the worker setting launcher "
        "'slurm'): launcher, job_id (Slurm's job id), nodes (the nodes it runs on, Slurm's "
        "list, e.g. 'n[1-2]'), state (PENDING, RUNNING, COMPLETED, ...), reason (why it "
        "waits: Resources, Priority, QOSMaxJobsPerUser, ...), restarts; null otherwise")
    attempt: int = Field(description="runs started so far (1 on the first run)")
    max_attempts: int
    end_class: str | None = Field(
        None, description="how the last attempt ended: 'infrastructure' (worker or node "
        "lost, database or broker outage, host OOM kill, disk full, hang: re-queued on its "
        "own budget, no attempt used), 'job' (config, data or code error, non-finite loss: "
        "failed at once) or 'user' (cancel); null while the first attempt runs and after a "
        "success")
    end_reason: str | None = Field(None, description="why the last attempt ended so")
    infra_retries: int = Field(0, description="re-queues after infrastructure ends so far "
                               "(the service's max_infra_retries bounds them)")
    cancel_requested: bool
    time_budget_s: float | None
    progress: dict[str, Any] | None = Field(
        None, description="latest progress: epoch, epochs, step, steps, eta_s, metrics; a "
        "profile job: phase 'profiling', step of steps (warmup + measured); a tune job: "
        "phase 'tuning', candidate, candidate_index, candidates, trial, trials, trials_done, "
        "trials_planned; a train job with preflight: preflight (the estimate)")
    tune: dict[str, Any] | None = Field(
        None, description="a tune job's options (repeat, warmup, steps, max_candidates, "
        "budget_s, min_gain)")
    result: dict[str, Any] | None = Field(
        None, description="on success: final status, best_epoch, metrics, verdict (profile); "
        "a train job with params.preflight: preflight (the estimate, and the actual times "
        "once it ends); a tune job: tune (the table, recommended, recommended_params, "
        "answer, expected_epoch_s), also when cancelled (what was measured); a predict "
        "job: predict (images, detections, names, files: the annotated images)")
    error: dict[str, Any] | None = Field(
        None, description="on failure: reason, exit_code, log_tail")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    duration_s: float | None = Field(None, description="finished_at - started_at, seconds")
    started_from: str | None = Field(
        None, description="`model` as people say it: the family name, the registered model's "
        "id, job:<job id> for an earlier job's checkpoint, or the file")
    waiting: str | None = Field(
        None, description="why a queued job cannot start, e.g. 'waiting for a gpu-1 worker "
        "(none online)'; null when a live worker serves its queue")
    warnings: list[str] = Field(
        default_factory=list, description="submit only: what may keep the job from running "
        "(no live worker serves its queue)")
    queue_position: int | None = Field(
        None, ge=1, description="queued jobs only: 1 + the jobs of its queue (every user's) "
        "that the fair-share scheduler would start before it as things stand (1: next); "
        "null when not queued")
    effective_priority: int | None = Field(
        None, description="queued jobs only: priority plus 1 per `aging_minutes` waited, at "
        "most 9 (what the scheduler sorts by first); null when not queued")
    estimated_start: datetime | None = Field(
        None, description="queued jobs only: when it should start (UTC), from the running "
        "jobs' ETA (progress eta_s) and the queue's recent job durations; null when it "
        "cannot be estimated (no live worker, no duration known yet, or waiting for its "
        "owner's cap on running jobs) or the job is not queued")


class JobsPage(BaseModel):
    data: list[JobPublic]
    next_cursor: str | None = Field(None, description="pass as ?cursor= for the next page")


class EventPublic(BaseModel):
    seq: int = Field(description="1, 2, 3... per job, no gaps")
    time: float = Field(description="unix seconds")
    kind: Literal["log", "metric", "status", "artifact"]
    data: dict[str, Any] = Field(description="the event; engine events keep their 'event' key")


class EventsPage(BaseModel):
    data: list[EventPublic]
    next_after: int = Field(description="pass as ?after= to continue")
    status: str = Field(description="the job's status now")
    done: bool = Field(description="the job is terminal and every event was returned")


class ArtifactPublic(BaseModel):
    path: str = Field(description="relative to the run directory, e.g. weights/best.pt")
    kind: str
    size_bytes: int
    sha256: str | None = Field(None, description="None while the job runs")
    url: str


class ArtifactsList(BaseModel):
    data: list[ArtifactPublic]


class DatasetRegister(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "examples": [{"name": "coco8", "path": "/data/coco8/data.yaml"}]})

    name: str = Field(..., min_length=1, max_length=200, pattern=NO_CONTROL)
    path: str = Field(..., min_length=1, max_length=MAX_PATH_CHARS, pattern=NO_CONTROL,
                      description="absolute dataset yaml path visible to the workers")


class DatasetPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str = Field(description="pass it as a job's data")
    name: str
    path: str = Field(description="the dataset yaml: as registered, or for an upload its "
                      "path inside the zip")
    source: Literal["upload", "register"]
    status: Literal["ready", "invalid"] = Field(description="invalid: the scan failed")
    report: dict[str, Any] | None = Field(
        None, description="an upload's scan: ok, exit_code, splits (images, boxes, "
        "defects...), zip_sha256, and the scan's output when it failed")
    created_at: datetime


class DatasetsPage(BaseModel):
    data: list[DatasetPublic]
