"""Routes of the browser pages and the HTML fragments their scripts refresh.

Pages: ``/signin``, ``/jobs``, ``/jobs/{id}``, ``/datasets``. Fragments (for the page
scripts): ``/web/jobs/rows``, ``/web/jobs/{id}/summary``; ``/web/params`` turns the
submit form's YAML into JSON. The pages read the database directly; what they change
(submit, cancel) goes through the ``/v1`` API, authenticated by the sign-in cookie.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Annotated, Any
from urllib.parse import parse_qs, urlencode

import yaml
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy import select

from libreyolo_core.models.registry import list_models
from libreyolo_core.profiler.verdict import LEVERS
from service.api.datasets import dataset_public
from service.api.deps import (
    TOKEN_COOKIE,
    SessionDep,
    SettingsDep,
    check_same_origin,
    current_user,
)
from service.api.jobs import queue_outlooks
from service.api.model_refs import describe_model_ref
from service.api.problems import Problem
from service.db.models import TERMINAL, Artifact, Dataset, Job, User
from service.ops import user_for_token
from service.scheduler import Outlook
from service.settings import Settings
from service.storage import artifact_kind
from service.workers import live_queues, waiting_reason

__all__ = ["router", "PAGE_CSP"]

router = APIRouter(include_in_schema=False)

#: Sent on every page and fragment: scripts, styles, fetches and SSE from this origin only.
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": PAGE_CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
STATUSES = ("queued", "running", "cancelling", "succeeded", "failed", "cancelled")
KINDS = ("train", "profile", "tune")
GPU_CHOICES = (0, 1, 2, 4, 8)
COOKIE_MAX_AGE_S = 14 * 24 * 3600
PAGE_SIZE = 50
TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
STATIC_DIR = Path(__file__).resolve().parent / "static"
#: Profile figures shown on the verdict card: key, label, formatter.
PROFILE_FIGURES = (
    ("step_ms", "step time", lambda v: f"{v:.1f} ms"),
    ("img_per_s", "throughput", lambda v: f"{v:.1f} img/s"),
    ("dataload_ms", "data wait", lambda v: f"{v:.1f} ms"),
    ("dataload_frac", "data wait share", lambda v: f"{100 * v:.0f}%"),
    ("gpu_util", "GPU utilisation", lambda v: f"{100 * v:.0f}%"),
    ("gpu_busy_ms_per_step", "GPU busy per step", lambda v: f"{v:.1f} ms"),
    ("host_overhead_ms_per_step", "host overhead per step", lambda v: f"{v:.1f} ms"),
    ("kernels_per_step", "kernels per step", lambda v: f"{v:,.0f}"),
    ("ops_per_step", "CPU ops per step", lambda v: f"{v:,.0f}"),
    ("cuda_mallocs_per_step", "cudaMalloc/Free per step", lambda v: f"{v:.1f}"),
    ("peak_vram_mb", "peak VRAM", lambda v: f"{v:,.0f} MB"),
)
METRIC_NAMES = ("mAP50", "mAP50-95", "precision", "recall")


# ---------------------------------------------------------------- formatting helpers


def _aware(dt: datetime | None) -> datetime | None:
    if dt is None:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def fmt_duration(seconds: float | None) -> str:
    """``75.2 -> '1 min 15 s'``; an em dash for None."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def fmt_age(dt: datetime | None, now: datetime | None = None) -> str:
    """How long ago, coarse: ``'12 s ago'``, ``'3 min ago'``, ``'2 h ago'``, ``'4 d ago'``."""
    dt = _aware(dt)
    if dt is None:
        return "—"
    s = max(0, int(((now or datetime.now(UTC)) - dt).total_seconds()))
    if s < 60:
        return f"{s} s ago"
    if s < 3600:
        return f"{s // 60} min ago"
    if s < 86400:
        return f"{s // 3600} h ago"
    return f"{s // 86400} d ago"


def fmt_bytes(n: int | None) -> str:
    """``1536 -> '1.5 KiB'``."""
    if n is None:
        return "—"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def fmt_metric(v: Any) -> str:
    """A 0-1 metric with four decimals; anything else as text."""
    if isinstance(v, int | float) and not isinstance(v, bool):
        return f"{v:.4f}"
    return "—" if v is None else str(v)


def _iso(dt: datetime | None) -> str:
    dt = _aware(dt)
    return dt.isoformat(timespec="seconds") if dt else ""


def _clock(dt: datetime | None, now: datetime | None = None) -> str:
    """``"14:05 UTC"`` (with the date when not today); empty for None."""
    dt = _aware(dt)
    if dt is None:
        return ""
    today = (now or datetime.now(UTC)).date()
    return dt.strftime("%H:%M UTC" if dt.date() == today else "%Y-%m-%d %H:%M UTC")


@functools.lru_cache(maxsize=1)
def _asset_version() -> str:
    digest = hashlib.sha256()
    for path in sorted(STATIC_DIR.iterdir()):
        if path.is_file():
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:10]


def _static_url(name: str) -> str:
    return f"/web/static/{name}?v={_asset_version()}"


@functools.lru_cache(maxsize=1)
def _templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(TEMPLATES_DIR))
    env = templates.env
    env.globals["static"] = _static_url
    env.filters["duration"] = fmt_duration
    env.filters["age"] = fmt_age
    env.filters["bytes"] = fmt_bytes
    env.filters["metric"] = fmt_metric
    env.filters["iso"] = _iso
    return templates


def _render(request: Request, name: str, context: dict[str, Any],
            status_code: int = 200) -> HTMLResponse:
    response = _templates().TemplateResponse(request, name, context, status_code=status_code)
    response.headers.update(SECURITY_HEADERS)
    return response


# ---------------------------------------------------------------- who is asking


def page_user(request: Request, session: SessionDep, settings: SettingsDep) -> User | None:
    """The signed-in user of a page request (cookie or bearer header), None when anonymous.

    Only used by GET routes, so the CSRF guard of :func:`current_user` never triggers.
    """
    try:
        return current_user(request, session, settings, request.headers.get("authorization"))
    except Problem as exc:
        if exc.status == 401:
            return None
        raise


def _to_signin(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse("/signin?" + urlencode({"next": target}), status_code=303)


def _safe_next(value: str | None) -> str:
    """A local path to go to after sign-in (never another host: ``//evil``, ``/\\evil``)."""
    if not value or not value.startswith("/") or value.startswith(("//", "/\\")):
        return "/jobs"
    return value


def _base_context(request: Request, user: User | None, nav: str) -> dict[str, Any]:
    return {"user": user, "nav": nav,
            "cookie_session": bool(request.cookies.get(TOKEN_COOKIE))}


# ---------------------------------------------------------------- view models


def fmt_queue(where: Outlook | None, now: datetime) -> str | None:
    """``"2nd in queue · starts in ~5 min"`` (or without the estimate when it is unknown;
    ``"next in queue"`` for the first) from a queued job's :class:`Outlook`."""
    if where is None:
        return None
    pos = where.position
    text = "next in queue" if pos == 1 else f"{_ordinal(pos)} in queue"
    if where.estimated_start is not None:
        wait = (where.estimated_start - now).total_seconds()
        text += " · starts " + ("now" if wait < 30 else f"in ~{_rough(wait)}")
    return text


def _rough(seconds: float) -> str:
    """A wait as an estimate says it: ``'4 min'``, ``'2 h 10 min'``, ``'3 d 4 h'``."""
    minutes = max(1, round(seconds / 60))
    if minutes < 60:
        return f"{minutes} min"
    return fmt_duration(minutes * 60).replace(" 0 min", "")


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _progress(job: Job, live: dict[str, int] | None = None,
              where: Outlook | None = None, now: datetime | None = None) -> tuple[float, str]:
    """(percent 0-100, text) of a job from its latest progress; a queued job that no live
    worker (``live``, :func:`service.workers.live_queues`) serves says so, else its place
    in the queue (``where``, :func:`service.scheduler.outlook`)."""
    p = job.progress or {}
    epochs, epoch = p.get("epochs"), p.get("epoch")
    if p.get("phase") == "tuning" and p.get("trials_planned"):  # a tune job: its trials
        planned = p["trials_planned"]
        if job.status in TERMINAL:
            ran = ((job.result or {}).get("tune") or {}).get("trials_run")
            return (100.0 if job.status == "succeeded" else 0.0,
                    f"tune {job.status}" + (f": {ran} trials run" if ran is not None else ""))
        return (max(0.0, min(100.0, 100.0 * (p.get("trials_done") or 0) / planned)),
                tune_progress_text(p))
    if p.get("phase") == "profiling" and p.get("steps"):  # a profile job: its window
        steps, step = p["steps"], p.get("step") or 0
        text = f"profile window step {step}/{steps}"
        if p.get("warmup") is not None:
            text += f" ({p['warmup']} warm-up + {p.get('measured', steps - p['warmup'])} measured)"
        done = job.status == "succeeded"
        return (100.0 if done else max(0.0, min(100.0, 100.0 * step / steps))), text
    if job.status == "succeeded":
        return 100.0, f"epoch {epoch}/{epochs}" if epochs else "done"
    if job.status == "queued":
        return 0.0, (waiting_reason(job.status, job.queue, live) if live is not None
                     else None) or fmt_queue(where, now or datetime.now(UTC)) or "waiting"
    if not epochs or not epoch:
        return 0.0, "—" if job.status in TERMINAL else "starting"
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


def tune_progress_text(p: dict[str, Any]) -> str:
    """``tuning: cache=ram (candidate 2 of 4) · trial 1/3 · 7 of 15 trials done``."""
    i, n = p.get("candidate_index") or 0, p.get("candidates") or 0
    where = "baseline" if i == 0 else f"{p.get('candidate')} (candidate {i} of {n})"
    return (f"tuning: {where} · trial {p.get('trial')}/{p.get('trials')} · "
            f"{p.get('trials_done') or 0} of {p.get('trials_planned')} trials done")


def _dataset_names(session: SessionDep, user: User) -> dict[str, str]:
    stmt = select(Dataset.path, Dataset.name)
    if not user.is_admin:
        stmt = stmt.where(Dataset.owner_id == user.id)
    return {path: name for path, name in session.execute(stmt)}


def _dataset_label(data: str, names: dict[str, str]) -> str:
    if data in names:
        return names[data]
    parts = PurePosixPath(data).parts
    return "/".join(parts[-2:]) if len(parts) >= 2 else data


def _job_row(job: Job, names: dict[str, str], now: datetime,
             live: dict[str, int] | None = None,
             outlooks: dict[str, Outlook] | None = None) -> dict[str, Any]:
    where = (outlooks or {}).get(job.id) if job.status == "queued" else None
    pct, text = _progress(job, live, where, now)
    started, finished = _aware(job.started_at), _aware(job.finished_at)
    if started and finished:
        duration = fmt_duration((finished - started).total_seconds())
    elif started and job.status not in TERMINAL:
        duration = fmt_duration((now - started).total_seconds()) + " so far"
    else:
        duration = "—"
    return {"id": job.id, "status": job.status, "kind": job.kind, "model": job.model,
            "data": job.data, "dataset": _dataset_label(job.data, names),
            "pct": round(pct), "progress": text, "attempt": job.attempt,
            "max_attempts": job.max_attempts, "created": _iso(job.created_at),
            "age": fmt_age(job.created_at, now), "duration": duration,
            "queue_text": fmt_queue(where, now),
            "estimated_start": _iso(where.estimated_start) if where is not None else "",
            "estimated_start_text": _clock(where.estimated_start) if where is not None else ""}


def _list_jobs(session: SessionDep, user: User, status: str | None, kind: str | None,
               before: str | None) -> tuple[list[Job], str | None]:
    stmt = select(Job).order_by(Job.id.desc()).limit(PAGE_SIZE + 1)
    if not user.is_admin:
        stmt = stmt.where(Job.owner_id == user.id)
    if status in STATUSES:
        stmt = stmt.where(Job.status == status)
    if kind in KINDS:
        stmt = stmt.where(Job.kind == kind)
    if before:
        stmt = stmt.where(Job.id < before)
    rows = list(session.scalars(stmt))
    older = rows[PAGE_SIZE - 1].id if len(rows) > PAGE_SIZE else None
    return rows[:PAGE_SIZE], older


def _rows_context(session: SessionDep, user: User, status: str | None, kind: str | None,
                  before: str | None, settings: Settings) -> dict[str, Any]:
    jobs, older = _list_jobs(session, user, status, kind, before)
    names = _dataset_names(session, user)
    now = datetime.now(UTC)
    query = {k: v for k, v in (("status", status), ("kind", kind)) if v}
    live = live_queues(session, settings.worker_ttl_s)
    outlooks = queue_outlooks(session, settings, jobs, live)
    return {"rows": [_job_row(j, names, now, live, outlooks) for j in jobs],
            "filtered": bool(query), "status": status or "", "kind": kind or "",
            "older_url": f"/jobs?{urlencode({**query, 'before': older})}" if older else None,
            "rows_url": "/web/jobs/rows" + (f"?{urlencode(query)}" if query else ""),
            "updated": now.strftime("%H:%M:%S")}


def _owned(session: SessionDep, user: User, job_id: str) -> Job | None:
    job = session.get(Job, job_id)
    if job is None or (job.owner_id != user.id and not user.is_admin):
        return None
    return job


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


def _lever_text(lever: dict[str, Any] | None) -> str | None:
    """``try workers=8 cache=ram: <why>; <also>`` from a result's structured lever."""
    if not lever:
        return None
    params = " ".join(f"{k}={v}" for k, v in (lever.get("params") or {}).items())
    text = (f"try {params}: " if params else "") + str(lever.get("why") or "")
    return "; ".join([text, *(lever.get("also") or [])])


def _confidence_text(conf: dict[str, Any] | None) -> tuple[bool, str] | None:
    """``(reliable, sentence)`` from a profile's ``confidence`` (None when not recorded)."""
    if not isinstance(conf, dict) or "reliable" not in conf:
        return None
    if conf["reliable"]:
        return True, "reliable: the measured steps repeated and nothing else loaded the machine"
    text = "unreliable: " + "; ".join(conf.get("reasons") or [])
    return False, text + (f". {conf['advice']}" if conf.get("advice") else "")


def fmt_seconds(seconds: float | None) -> str:
    """``fmt_duration``, with a decimal under 10 s (``1.2 s``): estimates of short epochs."""
    if isinstance(seconds, int | float) and math.isfinite(seconds) and 0 <= seconds < 10:
        return f"{seconds:.1f} s"
    return fmt_duration(seconds)


def _gain(v: Any) -> str:
    return "—" if not isinstance(v, int | float) else f"{100 * v:+.0f}%"


def _tune_view(job: Job, tune: dict[str, Any] | None) -> dict[str, Any] | None:
    """The tune card: the answer, one row per configuration, the recommended parameter set
    and the expected epoch time; ``None`` for other jobs and a tune job without result."""
    if job.kind != "tune" or not isinstance(tune, dict):
        return None
    rows = []
    for r in [tune.get("baseline") or {}, *(tune.get("candidates") or [])]:
        ips = r.get("img_per_s")
        base = r.get("name") == "baseline"
        rows.append({
            "label": r.get("label") or r.get("name"), "baseline": base,
            "ips": "—" if ips is None else f"{ips:.1f} ± {r.get('img_per_s_std') or 0:.1f}",
            "n": r.get("n") if ips is not None else "—",
            "step": "—" if r.get("step_ms") is None else f"{r['step_ms']:.0f}",
            "verdict": r.get("verdict") or "—",
            "significant": "—" if base or r.get("significant") is None
            else ("yes" if r["significant"] else "no"),
            "gain": "—" if base else _gain(r.get("gain")),
            "recommendable": bool(r.get("recommendable")),
            "recommended": bool(tune.get("recommended")) and r.get("name") == (tune.get("recommended") or {}).get("name"),
            "note": "" if base else (r.get("note") or ""),
            "side_effect": r.get("side_effect")})
    rec = tune.get("recommended") or None
    params = tune.get("recommended_params") or {}
    return {"answer": tune.get("answer"), "status": tune.get("status"), "rows": rows,
            "recommended": rec, "changes": " ".join(f"{k}={v}" for k, v in (rec or {}).get("params", {}).items()),
            "params": " ".join(f"{k}={v}" for k, v in params.items()) or "(the defaults)",
            "expected_epoch": fmt_seconds(tune.get("expected_epoch_s")),
            "baseline_epoch": fmt_seconds(tune.get("baseline_epoch_s")),
            "also": tune.get("also") or [], "notes": tune.get("notes") or [],
            "device": tune.get("device"), "train_url": f"/jobs?train_from={job.id}#new-job-title",
            "can_train": job.status in TERMINAL and bool((tune.get("baseline") or {}).get("img_per_s"))}


def _preflight_view(job: Job, pf: dict[str, Any] | None) -> dict[str, Any] | None:
    """The preflight card: the estimate, and beside it what the run took once it ended."""
    if not isinstance(pf, dict) or pf.get("total_s") is None:
        return None
    actual = pf.get("actual") or {}
    ended = job.status in TERMINAL
    started, finished = _aware(job.started_at), _aware(job.finished_at)
    duration = (finished - started).total_seconds() if started and finished else None
    mem = pf.get("peak_memory_mb")
    return {
        "img_per_s": f"{pf['img_per_s']:.1f} img/s" if pf.get("img_per_s") is not None else "—",
        "epoch_est": fmt_seconds(pf.get("epoch_s")),
        "epoch_actual": fmt_seconds(actual.get("epoch_time_s")) if actual.get("epoch_time_s") is not None else None,
        "val_est": fmt_seconds(pf.get("val_s")) if pf.get("val_s") is not None else None,
        "val_actual": fmt_seconds(actual.get("val_time_s")) if actual.get("val_time_s") is not None else None,
        "total_est": fmt_seconds(pf.get("total_s")),
        "total_actual": fmt_seconds(duration) if ended and duration is not None else None,
        "epochs": pf.get("epochs"), "epochs_done": actual.get("epochs"),
        "memory": f"{mem:,.0f} MiB ({pf.get('memory_kind')})" if mem is not None else None,
        "cost": f"{pf['cost']:.2f} {pf.get('currency')}" if pf.get("cost") is not None else None,
        "ended": ended, "notes": pf.get("notes") or [], "phases": pf.get("phases") or []}


def _prefill(session: SessionDep, settings: Any, user: User, job_id: str | None
             ) -> dict[str, Any] | None:
    """The submit form's values from a finished tune job (``?train_from=<id>``): kind train,
    its model and dataset (the dataset's id when it is one of the user's), GPUs, and its
    recommended parameter set (epochs, imgsz and batch in their fields, the rest as YAML)."""
    if not job_id:
        return None
    job = _owned(session, user, job_id)
    tune = (job.result or {}).get("tune") if job is not None and job.kind == "tune" else None
    if not isinstance(tune, dict):
        return None
    params = dict(tune.get("recommended_params") or {})
    ref = describe_model_ref(session, settings, job.model)
    model = ref.get("model_id") or ref["label"]  # a name, a model id, job:<id>/<path>, a file
    data = session.scalar(select(Dataset.id).where(Dataset.path == job.data,
                                                   Dataset.owner_id == job.owner_id)) or job.data
    basic = {k: params.pop(k) for k in ("epochs", "imgsz", "batch") if k in params}
    return {"job_id": job.id, "model": model, "data": data, "gpus": job.gpus, "basic": basic,
            "yaml": yaml.safe_dump(params, sort_keys=True).strip() if params else "",
            "recommended": (tune.get("recommended") or {}).get("label")}


def _summary_context(request: Request, session: SessionDep, user: User, job: Job
                     ) -> dict[str, Any]:
    now = datetime.now(UTC)
    names = _dataset_names(session, user)
    artifacts = _artifacts(request, session, job)
    result = job.result or {}
    profile = result.get("profile") or {}
    verdict = None
    if result.get("verdict"):
        figures = [(label, fmt(profile[key])) for key, label, fmt in PROFILE_FIGURES
                   if isinstance(profile.get(key), int | float)]
        timeline = next((a for a in artifacts if a["path"] == "timeline.html"), None)
        verdict = {"name": result["verdict"], "why": result.get("bound_why") or "",
                   "lever": _lever_text(result.get("lever")) or LEVERS.get(str(result["verdict"])),
                   "figures": figures, "confidence": _confidence_text(profile.get("confidence")),
                   "timeline_url": timeline["url"] if timeline else None}
    tune_data = result.get("tune")
    if job.kind == "tune" and tune_data is None:  # running: what tune.json holds so far
        with contextlib.suppress(OSError, ValueError):
            tune_data = json.loads((request.app.state.store.run_dir(job.id) / "tune.json")
                                   .read_text(encoding="utf-8"))
    tune = _tune_view(job, tune_data)
    preflight = _preflight_view(job, result.get("preflight") or (job.progress or {}).get("preflight"))
    metrics = result.get("metrics") or (job.progress or {}).get("metrics") or {}
    shown = [(k, fmt_metric(metrics[k])) for k in METRIC_NAMES if k in metrics]
    error = job.error or None
    settings = request.app.state.settings
    live = live_queues(session, settings.worker_ttl_s)
    outlooks = queue_outlooks(session, settings, [job], live, request.app.state.outlooks)
    return {"job": job, "row": _job_row(job, names, now, live, outlooks), "artifacts": artifacts,
            "result": result if job.result is not None else None, "metrics": shown,
            "verdict": verdict, "error": error, "cancellable": job.status in ("queued",
                                                                               "running"),
            "tune": tune, "preflight": preflight,
            "params_json": json.dumps(job.params or {}, indent=1, sort_keys=True),
            "started_from": describe_model_ref(session, request.app.state.settings, job.model)}


# ---------------------------------------------------------------- pages


@router.get("/")
def home() -> RedirectResponse:
    """The jobs page."""
    return RedirectResponse("/jobs", status_code=303)


@router.get("/signin", response_class=HTMLResponse)
def signin_page(request: Request, session: SessionDep, settings: SettingsDep,
                next: Annotated[str | None, Query()] = None) -> Response:
    """Sign-in form: paste an API token (``libreyolo-service token create``)."""
    user = page_user(request, session, settings)
    if user is not None and request.cookies.get(TOKEN_COOKIE):
        return RedirectResponse(_safe_next(next), status_code=303)
    return _render(request, "signin.html", {**_base_context(request, None, "signin"),
                                            "next": _safe_next(next), "error": None})


@router.post("/signin", response_class=HTMLResponse)
async def signin(request: Request, session: SessionDep, settings: SettingsDep) -> Response:
    """Check the pasted token and keep it in an HttpOnly, SameSite=Strict cookie.

    Form fields: ``token``, ``next`` (a local path to go to). A bad token re-renders the
    form with the error next to the field (401). Cross-origin posts are refused (403).
    """
    check_same_origin(request, settings)
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    token = (form.get("token") or [""])[0].strip()
    target = _safe_next((form.get("next") or [""])[0])
    user = user_for_token(session, token) if token else None
    if user is None:
        error = "unknown or revoked token" if token else "paste your API token"
        return _render(request, "signin.html", {**_base_context(request, None, "signin"),
                                                "next": target, "error": error},
                       status_code=401)
    response = RedirectResponse(target, status_code=303)
    secure = request.url.scheme == "https" or \
        request.headers.get("x-forwarded-proto", "").split(",")[0].strip() == "https"
    response.set_cookie(TOKEN_COOKIE, token, max_age=COOKIE_MAX_AGE_S, path="/",
                        httponly=True, samesite="strict", secure=secure)
    return response


@router.post("/signout")
def signout(request: Request, settings: SettingsDep) -> RedirectResponse:
    """Forget the sign-in cookie; back to the sign-in page."""
    check_same_origin(request, settings)
    response = RedirectResponse("/signin", status_code=303)
    response.delete_cookie(TOKEN_COOKIE, path="/", httponly=True, samesite="strict")
    return response


@router.get("/jobs", response_class=HTMLResponse)
def jobs_page(request: Request, session: SessionDep, settings: SettingsDep,
              status: Annotated[str | None, Query()] = None,
              kind: Annotated[str | None, Query()] = None,
              before: Annotated[str | None, Query()] = None,
              train_from: Annotated[str | None, Query()] = None) -> Response:
    """Your jobs (filters by status and kind, auto-refresh) and the submit form
    (``?train_from=<tune job id>``: pre-filled with that tune's recommended settings)."""
    user = page_user(request, session, settings)
    if user is None:
        return _to_signin(request)
    stmt = select(Dataset).order_by(Dataset.id.desc())
    if not user.is_admin:
        stmt = stmt.where(Dataset.owner_id == user.id)
    datasets = list(session.scalars(stmt))
    ctx = _rows_context(session, user, status if status in STATUSES else None,
                        kind if kind in KINDS else None, before, settings)
    return _render(request, "jobs.html", {
        **_base_context(request, user, "jobs"), **ctx, "statuses": STATUSES, "kinds": KINDS,
        "models": list_models(), "datasets": datasets, "gpu_choices": GPU_CHOICES,
        "default_gpus": settings.default_gpus, "before": before,
        "prefill": _prefill(session, settings, user, train_from)})


@router.get("/web/jobs/rows", response_class=HTMLResponse)
def jobs_rows(request: Request, session: SessionDep, settings: SettingsDep,
              status: Annotated[str | None, Query()] = None,
              kind: Annotated[str | None, Query()] = None) -> Response:
    """The ``<tbody>`` rows of the jobs table (the page's auto-refresh).

    Raises:
        401: not signed in (the script then goes to the sign-in page).
    """
    user = current_user(request, session, settings, request.headers.get("authorization"))
    ctx = _rows_context(session, user, status if status in STATUSES else None,
                        kind if kind in KINDS else None, None, settings)
    return _render(request, "_job_rows.html", ctx)


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(job_id: str, request: Request, session: SessionDep, settings: SettingsDep
             ) -> Response:
    """One job: live log (SSE), loss and mAP curves, result, verdict, artifacts, cancel."""
    user = page_user(request, session, settings)
    if user is None:
        return _to_signin(request)
    job = _owned(session, user, job_id)
    if job is None:
        return _render(request, "error.html", {
            **_base_context(request, user, "jobs"), "title": "Job not found",
            "message": f"There is no job {job_id} among your jobs."}, status_code=404)
    ctx = _summary_context(request, session, user, job)
    return _render(request, "job.html", {**_base_context(request, user, "jobs"), **ctx,
                                         "terminal": job.status in TERMINAL})


@router.get("/web/jobs/{job_id}/summary", response_class=HTMLResponse)
def job_summary(job_id: str, request: Request, session: SessionDep, settings: SettingsDep
                ) -> Response:
    """The job page's summary panel (status, result, verdict, error, artifacts) as HTML.

    Raises:
        401: not signed in. 404: no such job, or another user's.
    """
    user = current_user(request, session, settings, request.headers.get("authorization"))
    job = _owned(session, user, job_id)
    if job is None:
        raise Problem(404, f"job {job_id!r} not found")
    response = _render(request, "_job_summary.html",
                       _summary_context(request, session, user, job))
    response.headers["X-Job-Status"] = job.status
    return response


@router.get("/datasets", response_class=HTMLResponse)
def datasets_page(request: Request, session: SessionDep, settings: SettingsDep) -> Response:
    """Your datasets with their scan reports (images, boxes, classes, each defect kind)."""
    user = page_user(request, session, settings)
    if user is None:
        return _to_signin(request)
    stmt = select(Dataset).order_by(Dataset.id.desc())
    if not user.is_admin:
        stmt = stmt.where(Dataset.owner_id == user.id)
    datasets = [dataset_public(d, settings) for d in session.scalars(stmt)]
    return _render(request, "datasets.html", {**_base_context(request, user, "datasets"),
                                              "datasets": datasets})


@router.post("/web/params")
async def parse_params(request: Request, session: SessionDep, settings: SettingsDep
                       ) -> JSONResponse:
    """Parse the submit form's advanced parameters (YAML, ``safe_load``) into JSON.

    Body: ``{"yaml": "<text>"}``. Returns ``{"params": {...}}``; the page then submits the
    job to ``POST /v1/jobs``, which validates every key.

    Raises:
        422: the text is not YAML, or not a mapping of ``key: value`` (``field: params``).
    """
    current_user(request, session, settings, request.headers.get("authorization"))
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        raise Problem(422, "body: not JSON", field="body") from None
    text = body.get("yaml", "") if isinstance(body, dict) else ""
    if not isinstance(text, str):
        raise Problem(422, "yaml: must be a string", field="params")
    try:
        value = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise Problem(422, f"params: not valid YAML{where}: {problem}", field="params") from None
    if value is None:
        value = {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise Problem(422, "params: write one 'key: value' per line (a YAML mapping)",
                      field="params")
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        raise Problem(422, "params: values must be numbers, strings, booleans or lists",
                      field="params") from None
    return JSONResponse({"params": value})
