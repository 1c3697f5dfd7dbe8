"""View models of the browser pages: what a template shows of a job (its row in the jobs
table, its progress, the summary panel with result, verdict, tune, preflight and node
cards), read from the database through the job store (:mod:`service.job_store`)."""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlencode

import yaml
from fastapi import Request
from sqlalchemy import select

from libreyolo_core.profiler.verdict import LEVERS
from libreyolo_core.records.events import ProfileEvent
from libreyolo_core.records.notes import learned_nothing
from libreyolo_core.records.result import JobResult, PreflightActual, PreflightResult
from libreyolo_core.records.tune import TUNE_FILE, TuneRecord, TuneRow
from service import job_store
from service.api.deps import SessionDep
from service.api.model_refs import describe_model_ref
from service.api.presenters import queue_outlooks
from service.db.models import Artifact, Dataset, Job, User
from service.gang import nodes_of, world_size
from service.lifecycle import ACTIVE, TERMINAL, JobStatus
from service.scheduler import Outlook
from service.settings import Settings
from service.storage import artifact_kind
from service.storage.roots import public_data, public_text
from service.users import visible_to
from service.web.formatting import (
    PROFILE_FIGURES,
    aware,
    clock,
    confidence_text,
    fmt_age,
    fmt_devices,
    fmt_duration,
    fmt_gain,
    fmt_metric,
    fmt_queue,
    fmt_seconds,
    iso,
    lever_text,
    node_state_text,
    tune_progress_text,
)
from service.workers import live_queues, waiting_reason

__all__ = ["PAGE_SIZE", "job_progress", "job_row", "nodes_view", "rows_context", "prefill",
           "summary_context"]

METRIC_NAMES = ("mAP50", "mAP50-95", "precision", "recall")
PAGE_SIZE = 50


def job_progress(job: Job, live: dict[str, int] | None = None,
                 where: Outlook | None = None, now: datetime | None = None) -> tuple[float, str]:
    """(percent 0-100, text) of a job from its latest progress; a queued job that no live
    worker (``live``, :func:`service.workers.live_queues`) serves says so, else its place
    in the queue (``where``, :func:`service.scheduler.outlook`)."""
    p = job.progress or {}
    if p.get("phase") == "tuning" and p.get("trials_planned"):  # a tune job: its trials
        return _tune_progress(job, p)
    if p.get("phase") == "profiling" and p.get("steps"):  # a profile job: its window
        return _profile_progress(job, p)
    epochs, epoch = p.get("epochs"), p.get("epoch")
    if job.status == JobStatus.SUCCEEDED:
        return 100.0, f"epoch {epoch}/{epochs}" if epochs else "done"
    if job.status == JobStatus.QUEUED:
        return 0.0, (waiting_reason(job.status, job.queue, live, job.nodes) if live is not None
                     else None) or job.waiting_note or fmt_queue(where, now or datetime.now(UTC)) \
            or "waiting"
    if not epochs or not epoch:
        return 0.0, "—" if job.status in TERMINAL else "starting"
    return _training_progress(job, p, epoch, epochs)


def _tune_progress(job: Job, p: dict[str, Any]) -> tuple[float, str]:
    """A tune job's progress: its trials."""
    if job.status in TERMINAL:
        tune = JobResult.of(job.result).tune
        ran = tune.trials_run if tune is not None and "trials_run" in tune.model_fields_set \
            else None
        return (100.0 if job.status == JobStatus.SUCCEEDED else 0.0,
                f"tune {job.status}" + (f": {ran} trials run" if ran is not None else ""))
    return (max(0.0, min(100.0, 100.0 * (p.get("trials_done") or 0) / p["trials_planned"])),
            tune_progress_text(p))


def _profile_progress(job: Job, p: dict[str, Any]) -> tuple[float, str]:
    """A profile job's progress: the step of its window."""
    steps, step = p["steps"], p.get("step") or 0
    text = f"profile window step {step}/{steps}"
    if p.get("warmup") is not None:
        text += f" ({p['warmup']} warm-up + {p.get('measured', steps - p['warmup'])} measured)"
    done = job.status == JobStatus.SUCCEEDED
    return (100.0 if done else max(0.0, min(100.0, 100.0 * step / steps))), text


def _training_progress(job: Job, p: dict[str, Any], epoch: int, epochs: int
                       ) -> tuple[float, str]:
    """A training job's progress: epoch, step or validation batch, ETA."""
    steps, step = p.get("steps") or 0, p.get("step") or 0
    frac = (epoch - 1 + (step / steps if steps else 0.0)) / epochs
    text = f"epoch {epoch}/{epochs}"
    if job.status not in TERMINAL:
        if p.get("phase") == "validating" and p.get("val_batches"):
            text += f" · validating {p.get('val_batch', 0)}/{p['val_batches']}"
        elif steps:
            text += f" · step {step}/{steps}"
        if isinstance(p.get("eta_s"), int | float) and p.get("phase") != "validating":
            text += f" · ETA {fmt_duration(p['eta_s'])}"
    return max(0.0, min(100.0, 100.0 * frac)), text


def _dataset_names(session: SessionDep, user: User) -> dict[str, str]:
    stmt = visible_to(select(Dataset.path, Dataset.name), Dataset.owner_id, user)
    return {path: name for path, name in session.execute(stmt)}


def _dataset_label(data: str, names: dict[str, str]) -> str:
    if data in names:
        return names[data]
    parts = PurePosixPath(data).parts
    return "/".join(parts[-2:]) if len(parts) >= 2 else data


def data_rows(data: Any) -> list[tuple[str, str]]:
    """``[(split, "64 images, 120 boxes, 6 data defects (bad_class 3, ...)")]`` from a
    result's ``data`` (the engine's scan counts); empty when not recorded."""
    rows = []
    for split, d in (data or {}).items() if isinstance(data, dict) else ():
        if not isinstance(d, dict):
            continue
        text = f"{d.get('usable')} images, {d.get('boxes')} boxes"
        n = d.get("n_defects") or 0
        if n:
            kinds = ", ".join(f"{k} {v}" for k, v in (d.get("defects") or {}).items())
            text += f", {n} data defect{'s' if n != 1 else ''} ({kinds}; the log names each)"
        rows.append((str(split), text))
    return rows


def model_cell(ref: dict[str, Any]) -> str:
    """A job's Model cell: a name, ``<model name> (<model id>)`` for a registered model,
    ``job:<id>`` for another job's checkpoint; never the server's file path."""
    if ref.get("kind") == "model" and ref.get("name"):
        return f"{ref['name']} ({ref['model_id']})"
    if ref.get("kind") == "file":
        return PurePosixPath(ref["label"]).name
    return str(ref.get("short") or ref.get("label"))


def job_row(job: Job, names: dict[str, str], now: datetime,
            live: dict[str, int] | None = None,
            outlooks: dict[str, Outlook] | None = None,
            model: str | None = None) -> dict[str, Any]:
    """One row of the jobs table; ``model``: its Model cell (:func:`model_cell`; the stored
    model when not given)."""
    where = (outlooks or {}).get(job.id) if job.status == JobStatus.QUEUED else None
    pct, text = job_progress(job, live, where, now)
    started, finished = aware(job.started_at), aware(job.finished_at)
    if started and finished:
        duration = fmt_duration((finished - started).total_seconds())
    elif started and job.status not in TERMINAL:
        duration = fmt_duration((now - started).total_seconds()) + " so far"
    else:
        duration = "—"
    return {"id": job.id, "status": job.status, "kind": job.kind, "model": model or job.model,
            "data": job.data, "dataset": _dataset_label(job.data, names),
            "pct": round(pct), "progress": text, "attempt": job.attempt,
            "max_attempts": job.max_attempts, "created": iso(job.created_at),
            "age": fmt_age(job.created_at, now), "duration": duration,
            "nodes_text": fmt_devices(job.nodes, job.gpus, job.procs) if job.nodes > 1 else None,
            "queue_text": fmt_queue(where, now),
            "estimated_start": iso(where.estimated_start) if where is not None else "",
            "estimated_start_text": clock(where.estimated_start) if where is not None else ""}


def rows_context(session: SessionDep, user: User, status: str | None, kind: str | None,
                 before: str | None, settings: Settings) -> dict[str, Any]:
    jobs, more = job_store.list_jobs(session=session, user=user, statuses=[status] if status else (),
                                     kind=kind, before=before, limit=PAGE_SIZE)
    older = jobs[-1].id if more else None
    names = _dataset_names(session, user)
    now = datetime.now(UTC)
    query = {k: v for k, v in (("status", status), ("kind", kind)) if v}
    live = live_queues(session, settings.worker_ttl_s)
    outlooks = queue_outlooks(session, settings, jobs, live)
    return {"rows": [job_row(j, names, now, live, outlooks,
                             model_cell(describe_model_ref(session, settings, j.model)))
                     for j in jobs],
            "filtered": bool(query), "status": status or "", "kind": kind or "",
            "older_url": f"/jobs?{urlencode({**query, 'before': older})}" if older else None,
            "rows_url": "/web/jobs/rows" + (f"?{urlencode(query)}" if query else ""),
            "updated": now.strftime("%H:%M:%S")}


def _artifacts(request: Request, session: SessionDep, job: Job) -> list[dict[str, Any]]:
    url = f"/v1/jobs/{job.id}/artifacts/"
    rows = session.scalars(select(Artifact).where(Artifact.job_id == job.id)
                           .order_by(Artifact.path)).all()
    if rows:
        return [{"path": a.path, "kind": a.kind, "size": a.size_bytes, "sha256": a.sha256,
                 "url": url + a.path} for a in rows]
    store = request.app.state.store
    return [{"path": rel, "kind": artifact_kind(rel), "size": p.stat().st_size, "sha256": None,
             "url": url + rel} for rel, p in store.list_files(job.id)]


def _tune_row(r: TuneRow, recommended: TuneRow | None) -> dict[str, Any]:
    """One row of the tune card."""
    base = r.name == "baseline"
    ips = r.img_per_s
    return {
        "label": r.label or r.name, "baseline": base,
        "ips": "—" if ips is None else f"{ips:.1f} ± {r.img_per_s_std or 0:.1f}",
        "n": r.n if ips is not None else "—",
        "step": "—" if r.step_ms is None else f"{r.step_ms:.0f}",
        "verdict": r.verdict or "—",
        "significant": "—" if base or r.significant is None
        else ("yes" if r.significant else "no"),
        "gain": "—" if base else fmt_gain(r.gain),
        "recommendable": r.recommendable,
        "recommended": recommended is not None and r.name == recommended.name,
        "note": "" if base else (r.note or ""),
        "side_effect": r.side_effect}


def _tune_view(job: Job, tune: TuneRecord | None) -> dict[str, Any] | None:
    """The tune card: the answer, one row per configuration, the recommended parameter set
    and the expected epoch time; ``None`` for other jobs and a tune job without result."""
    if job.kind != "tune" or tune is None:
        return None
    rec = tune.recommended
    rows = [_tune_row(r, rec) for r in [tune.baseline or TuneRow(), *tune.candidates]]
    params = tune.recommended_params
    return {"answer": tune.answer if "answer" in tune.model_fields_set else None,
            "status": tune.status if "status" in tune.model_fields_set else None,
            "rows": rows, "recommended": rec.to_dict() if rec is not None else None,
            "changes": " ".join(f"{k}={v}" for k, v in (rec.params if rec else {}).items()),
            "params": " ".join(f"{k}={v}" for k, v in params.items()) or "(the defaults)",
            "expected_epoch": fmt_seconds(tune.expected_epoch_s),
            "baseline_epoch": fmt_seconds(tune.baseline_epoch_s),
            "also": tune.also, "notes": tune.notes,
            "device": tune.device, "train_url": f"/jobs?train_from={job.id}#new-job-title",
            "can_train": job.status in TERMINAL and bool(tune.baseline and tune.baseline.img_per_s)}


def _running_tune(request: Request, job: Job) -> TuneRecord | None:
    """What a running tune job's ``tune.json`` holds so far (``None``: not written yet, or
    being written)."""
    with contextlib.suppress(OSError, ValueError):
        return TuneRecord.read(request.app.state.store.run_dir(job.id) / TUNE_FILE)
    return None


def nodes_view(session: SessionDep, job: Job) -> dict[str, Any] | None:
    """The nodes card of a multi-node job (``None`` for a one-node job): ``world_size``
    (ranks in all), ``attempt`` (the attempt its rows serve), ``gathering`` (the job waits
    for its gang: the rows are the slots claimed so far), ``claimed`` (slots held),
    ``requeued`` (the attempt a re-queued job waits for while its rows are still the
    attempt before, else None) and one row per node rank: ``worker``, ``host``, ``addr``,
    ``state`` (the exit code and why its worker stopped it, or what it does now; an
    unclaimed rank: ``'waiting for a worker'``).

    A queued job shows the slots of its next attempt; while none is claimed, a re-queued
    job still shows those of the attempt before (as ``node_workers`` of the API does).
    """
    if job.nodes <= 1:
        return None
    gathering = job.status == JobStatus.QUEUED
    attempt = job.attempt + 1 if gathering else job.attempt
    slots = nodes_of(session, job.id, attempt)
    requeued = None
    if not slots and gathering and job.attempt:
        gathering, requeued, attempt = False, attempt, job.attempt
        slots = nodes_of(session, job.id, attempt)
    if gathering:
        live = "claimed"
    else:
        live = "running" if job.status in ACTIVE and attempt == job.attempt else "—"
    by_rank = {n.node_rank: n for n in slots}
    rows = []
    for rank in range(job.nodes):
        n = by_rank.get(rank)
        if n is None:
            rows.append({"rank": rank, "worker": "—", "host": "—", "addr": "",
                         "state": "waiting for a worker" if gathering else "—"})
            continue
        rows.append({"rank": rank, "worker": n.worker, "host": n.host,
                     "addr": n.addr if n.addr != n.host else "",
                     "state": node_state_text(n.exit_code, n.stop, live)})
    return {"world_size": world_size(job.nodes, job.gpus, job.procs), "attempt": attempt,
            "gathering": gathering, "claimed": len(slots), "requeued": requeued, "rows": rows}


def _preflight_view(job: Job, pf: PreflightResult | dict[str, Any] | None
                    ) -> dict[str, Any] | None:
    """The preflight card: the estimate, and beside it what the run took once it ended
    (``pf``: a result's preflight; its JSON is parsed)."""
    if isinstance(pf, dict):
        pf = PreflightResult.model_validate(pf)
    if pf is None or pf.total_s is None:
        return None
    actual = pf.actual or PreflightActual()
    ended = job.status in TERMINAL
    started, finished = aware(job.started_at), aware(job.finished_at)
    duration = (finished - started).total_seconds() if started and finished else None
    mem = pf.peak_memory_mb
    return {
        "img_per_s": f"{pf.img_per_s:.1f} img/s" if pf.img_per_s is not None else "—",
        "epoch_est": fmt_seconds(pf.epoch_s),
        "epoch_actual": fmt_seconds(actual.epoch_time_s) if actual.epoch_time_s is not None else None,
        "val_est": fmt_seconds(pf.val_s) if pf.val_s is not None else None,
        "val_actual": fmt_seconds(actual.val_time_s) if actual.val_time_s is not None else None,
        "total_est": fmt_seconds(pf.total_s),
        "total_actual": _total_actual(actual, ended, duration),
        "epochs": pf.epochs, "epochs_done": actual.epochs if pf.actual is not None else None,
        "memory": f"{mem:,.0f} MiB ({pf.memory_kind})" if mem is not None else None,
        "cost": f"{pf.cost:.2f} {pf.currency}" if pf.cost is not None else None,
        "ended": ended, "notes": pf.notes or [], "phases": pf.phases or []}


def _total_actual(actual: PreflightActual, ended: bool, duration: float | None) -> str | None:
    """The estimate's counterpart: the epochs' training and validation (as the CLI says it),
    and beside it the whole job (set-up and the preflight included)."""
    if not ended:
        return None
    if actual.train_s is not None:
        return (fmt_seconds(actual.train_s + (actual.val_s or 0))
                + (f" (training and validation; the whole job {fmt_seconds(duration)})"
                   if duration is not None else ""))
    return f"{fmt_seconds(duration)} (the whole job)" if duration is not None else None


def _preflight(result: JobResult, job: Job) -> PreflightResult | None:
    """The job's preflight: its result's, else (while it runs) what its progress keeps."""
    if result.preflight is not None:
        return result.preflight
    pf = (job.progress or {}).get("preflight")
    if not isinstance(pf, dict):
        return None
    with contextlib.suppress(ValueError):
        return PreflightResult.model_validate(pf)
    return None


def prefill(session: SessionDep, settings: Any, user: User, job_id: str | None
            ) -> dict[str, Any] | None:
    """The submit form's values from a finished tune job (``?train_from=<id>``): kind train,
    its model and dataset (the dataset's id when it is one of the user's), GPUs, and its
    recommended parameter set (epochs, imgsz and batch in their fields, the rest as YAML);
    nodes 1 (a tune job runs on one device)."""
    if not job_id:
        return None
    job = job_store.get_owned(session=session, job_id=job_id, user=user)
    if job is None or job.kind != "tune":
        return None
    tune = JobResult.of(job.result).tune
    if tune is None:
        return None
    params = dict(tune.recommended_params)
    ref = describe_model_ref(session, settings, job.model)
    model = ref.get("model_id") or ref["label"]  # a name, a model id, job:<id>/<path>, a file
    data = session.scalar(select(Dataset.id).where(Dataset.path == job.data,
                                                   Dataset.owner_id == job.owner_id)) or job.data
    basic = {k: params.pop(k) for k in ("epochs", "imgsz", "batch") if k in params}
    return {"job_id": job.id, "model": model, "data": data, "gpus": job.gpus, "nodes": job.nodes,
            "basic": basic,
            "yaml": yaml.safe_dump(params, sort_keys=True).strip() if params else "",
            "recommended": tune.recommended.label if tune.recommended is not None else None}


def _verdict_view(result: JobResult, artifacts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The verdict card of a profile job: the verdict, why, the lever, the headline figures
    of its ``profile`` event, how sure, the timeline's link; ``None`` without a verdict."""
    if not result.verdict:
        return None
    profile = result.profile or ProfileEvent()  # the engine's ``profile`` event
    figures = [(label, fmt(value)) for key, label, fmt in PROFILE_FIGURES
               if isinstance(value := getattr(profile, key), int | float)]
    timeline = next((a for a in artifacts if a["path"] == "timeline.html"), None)
    return {"name": result.verdict, "why": result.bound_why or "",
            "lever": lever_text(result.lever) or LEVERS.get(result.verdict),
            "figures": figures, "confidence": confidence_text(profile.confidence),
            "timeline_url": timeline["url"] if timeline else None}


def summary_context(request: Request, session: SessionDep, user: User, job: Job
                    ) -> dict[str, Any]:
    """What the job page's summary shows of ``job``: its row, artifacts, result, the
    verdict, tune, preflight and nodes cards, the error (public paths only), whether it can
    be cancelled or resumed."""
    now = datetime.now(UTC)
    artifacts = _artifacts(request, session, job)
    result = JobResult.of(job.result)
    tune = result.tune
    if job.kind == "tune" and tune is None:  # running: what tune.json holds so far
        tune = _running_tune(request, job)
    metrics = result.metrics or (job.progress or {}).get("metrics") or {}
    settings = request.app.state.settings
    live = live_queues(session, settings.worker_ttl_s)
    outlooks = queue_outlooks(session, settings, [job], live, request.app.state.outlooks)
    started_from = describe_model_ref(session, settings, job.model)
    row = job_row(job, _dataset_names(session, user), now, live, outlooks,
                  model_cell(started_from))
    succeeded_train = job.kind == "train" and job.status == JobStatus.SUCCEEDED
    return {"job": job, "row": row, "artifacts": artifacts,
            "result": result if job.result is not None else None,
            "metrics": [(k, fmt_metric(metrics[k])) for k in METRIC_NAMES if k in metrics],
            "verdict": _verdict_view(result, artifacts),
            "error": json.loads(public_text(json.dumps(job.error), settings)) if job.error
            else None,
            "cancellable": job.status in (JobStatus.QUEUED, JobStatus.RUNNING),
            "data_rows": data_rows(result.data),
            "learned_note": learned_nothing(result.metrics, result.epochs_completed,
                                            not job.model.startswith("/"))
            if succeeded_train else None,
            "resumable": job.kind == "train"
            and job.status in (JobStatus.CANCELLED, JobStatus.FAILED)
            and request.app.state.store.last_checkpoint(job.id) is not None,
            "tune": _tune_view(job, tune), "preflight": _preflight_view(job, _preflight(result, job)),
            "nodes": nodes_view(session, job),
            "devices": fmt_devices(job.nodes, job.gpus, job.procs),
            "params_json": json.dumps(job.params or {}, indent=1, sort_keys=True),
            "started_from": started_from,
            "data_public": public_data(job.data, settings)}
