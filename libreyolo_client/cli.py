"""``libreyolo-service jobs ...``: the client side of the service in a terminal.

``submit | list | show | logs [-f] | cancel | download | open``. The URL and token come
from ``--url`` / ``--token``, ``LIBREYOLO_URL`` / ``LIBREYOLO_TOKEN``, or the credentials
file that ``libreyolo-service up`` writes. Exit codes: 0 ok, 1 error (job failed, service
error), 2 invalid request (the message names the field).
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
import webbrowser
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from libreyolo_client._client import Client, Job
from libreyolo_client._errors import JobError, LibreYOLOError, SubmitWarning, ValidationError
from libreyolo_client._models import Event, JobInfo, TuneReport
from libreyolo_client._progress import (
    data_text,
    format_bytes,
    format_metrics,
    learned_note,
    nodes_text,
    progress_text,
    significance_word,
    status_text,
    unreliable_reasons,
    verdict_text,
)
from libreyolo_client._results import JobResult, LeverAdvice

__all__ = ["jobs_app", "parse_params", "tune_table", "preflight_text", "node_lines"]

jobs_app = typer.Typer(help="submit and follow jobs on a service (the SDK in a terminal)",
                       no_args_is_help=True, pretty_exceptions_enable=False)

_OPTS: dict[str, Any] = {}


def add_connection_options(app: typer.Typer, doc: str) -> None:
    """Give ``app`` the ``--url`` / ``--token`` options (before its sub-command; or
    ``LIBREYOLO_URL`` / ``LIBREYOLO_TOKEN``), kept for :func:`_client`; ``doc`` is the
    group's help text."""

    def _options(
        url: Annotated[str | None, typer.Option(
            envvar="LIBREYOLO_URL", help="service URL, e.g. http://127.0.0.1:8000")] = None,
        token: Annotated[str | None, typer.Option(envvar="LIBREYOLO_TOKEN",
                                                  help="bearer token")] = None,
    ) -> None:
        _OPTS.update(url=url, token=token)

    _options.__doc__ = doc
    app.callback()(_options)


add_connection_options(
    jobs_app, "Talk to a LibreYOLO service (URL and token default to what `up` saved).")


def dest_option(*names: str) -> Any:
    """A download's ``-o`` option: a file, or a folder (an existing one, or a path ending in
    ``/``, created if missing). Declare it ``str | None``, not a Path: ``Path("models/")``
    drops the slash that says "a folder" (the SDK's download reads the slash)."""
    return typer.Option(*names, help="file, or folder (an existing one, or a path ending in "
                                     "'/', created if missing); default: here")


@contextmanager
def _client() -> Iterator[Client]:
    """A client, turning SDK errors into a message and an exit code."""
    try:
        with Client(_OPTS.get("url"), _OPTS.get("token")) as c:
            yield c
    except ValidationError as exc:
        typer.secho(f"error: {exc.detail}", fg="red", err=True)
        if exc.allowed:
            typer.echo(f"allowed: {exc.allowed}", err=True)
        raise typer.Exit(2) from None
    except JobError as exc:
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(1) from None
    except LibreYOLOError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None


def _value(raw: str) -> Any:
    """``'3'`` -> 3, ``'0.5'`` -> 0.5, ``'true'`` -> True, ``'[1,2]'`` -> [1, 2], else str."""
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def parse_params(items: list[str]) -> dict[str, Any]:
    """``["epochs=3", "imgsz=320"]`` -> ``{"epochs": 3, "imgsz": 320}``.

    Raises:
        typer.BadParameter: an item without ``=``, or a key given twice with two values.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{item!r}: training keys are given as key=value "
                                     "(e.g. epochs=10 imgsz=320)")
        key, value = key.strip().lstrip("-"), _value(raw.strip())
        if key in out and out[key] != value:
            raise typer.BadParameter(f"{key}={out[key]} and {key}={value}: give one")
        out[key] = value
    return out


def _summary(info: JobInfo) -> str:
    p = info.progress or {}
    if info.status in ("running", "cancelling") and (p.get("epoch") or p.get("phase") in ("profiling",
                                                                                      "tuning")):
        return progress_text(p)
    if info.status in ("running", "cancelling"):
        return "starting (setting up the run)"
    if info.status == "succeeded":
        res = JobResult.of(info.result)
        if res.answer:  # a tune job
            return res.answer
        if res.verdict:
            return f"verdict {verdict_text(info.result or {}).split(':', 1)[0]}"
        return format_metrics(res.metrics, ("mAP50-95",))
    if info.status == "failed":
        return str((info.error or {}).get("reason", ""))
    if info.status == "queued" and info.waiting:
        return info.waiting
    if info.status == "queued":
        return queue_text(info)
    return ""


def node_lines(info: JobInfo) -> list[str]:
    """A multi-node job's nodes for ``jobs show``: the world, then one line per node
    (``node 0  w-a on host-a (10.0.0.1)  exit 0``); none for a one-node job."""
    if info.nodes <= 1:
        return []
    out = [f"nodes:    {nodes_text(info.nodes, info.gpus, info.procs)} "
           f"(world size {info.world_size})"]
    claimed = {n.node_rank: n for n in info.node_workers or []}
    for rank in range(info.nodes):
        n = claimed.get(rank)
        if n is None:
            out.append(f"  node {rank}  (no worker yet)")
            continue
        where = n.host + (f" ({n.addr})" if n.addr and n.addr != n.host else "")
        end = f"  exit {n.exit_code}" if n.exit_code is not None else ""
        end += f"  stopped: {n.stop}" if n.stop else ""
        out.append(f"  node {rank}  {n.worker} on {where}{end}")
    return out


def cluster_line(info: JobInfo) -> str:
    """``"slurm:    job 12 RUNNING on n[1-2]"`` (``(Resources)`` while it waits) for a job
    run on a cluster; empty otherwise."""
    c = info.cluster or {}
    if not c.get("job_id"):
        return ""
    name = f"{c.get('launcher') or 'cluster'}:"
    text = f"{name:<9} job {c['job_id']} {c.get('state') or ''}"
    if c.get("nodes"):
        text += f" on {c['nodes']}"
    if c.get("reason"):
        text += f" ({c['reason']})"
    if c.get("restarts"):
        text += f", re-queued {c['restarts']}x"
    return text


def queue_text(info: JobInfo) -> str:
    """``"#2 in queue cpu, starts ~14:05 UTC"`` for a queued job (empty when the service
    gave no position)."""
    if info.queue_position is None:
        return ""
    text = f"#{info.queue_position} in queue {info.queue}"
    if info.estimated_start is not None:
        text += f", starts ~{info.estimated_start.strftime('%H:%M UTC')}"
    return text


class _Follower:
    """The lines and the bar :func:`follow` shows for each event of a job."""

    def __init__(self, job: Job, bar: Any, task: Any, logs: bool):
        self.job, self.bar, self.task, self.logs = job, bar, task, logs

    def say(self, text: str, **kw: Any) -> None:
        self.bar.console.print(text, **kw)

    def __call__(self, ev: Event) -> None:
        d, name = ev.data, ev.name
        if name in ("progress", "epoch_start") and d.get("epochs"):
            self.epoch_progress(d)
        elif name == "progress" and d.get("phase") == "tuning" and d.get("trials_planned"):
            self.bar.update(self.task, total=int(d["trials_planned"]),
                            completed=int(d.get("trials_done") or 0),
                            detail=progress_text(d).replace("  ", " "))
        elif name == "profile":
            self.say(f"verdict: {verdict_text(d)}", markup=False, highlight=False)
        elif name in self.LINES:
            self.say(self.LINES[name](d))
        elif name == "status":
            self.bar.update(self.task, description=f"{self.job.id} {d.get('status')}")
            self.say(f"status: {status_text(d)}", markup=False, highlight=False)
        elif name == "gang" or (ev.kind == "log" and self.logs):
            prefix = "nodes: " if name == "gang" else ""  # a node slot taken or released
            for ln in d.get("lines") or []:
                self.say(f"{prefix}{ln}", markup=False, highlight=False)

    def epoch_progress(self, d: dict[str, Any]) -> None:
        """The bar over the steps of all epochs (it stays at the epoch's end while
        validating)."""
        if d.get("phase") == "validating":
            self.bar.update(self.task, detail=progress_text(d).replace("  ", " "))
            return
        steps = int(d.get("steps") or 1)
        total = int(d["epochs"]) * steps
        done = (int(d.get("epoch") or 1) - 1) * steps + int(d.get("step") or 0)
        self.bar.update(self.task, total=total, completed=done,
                        detail=f"epoch {d.get('epoch')}/{d['epochs']}")

    @staticmethod
    def _epoch_end(d: dict[str, Any]) -> str:
        losses = "  ".join(f"{k} {v:.3f}" for k, v in (d.get("losses") or {}).items()
                           if isinstance(v, int | float))
        return f"epoch {d.get('epoch')}/{d.get('epochs')}  {losses}  {format_metrics(d.get('metrics'))}"

    @staticmethod
    def _tune_candidate(d: dict[str, Any]) -> str:
        sig = significance_word(d.get("significant"))
        return (f"tune: {d.get('label')}: {d.get('img_per_s') or 0:.1f} img/s, {sig}"
                + (", recommendable" if d.get("recommendable") else ""))

    #: One printed line per event of these names.
    LINES: dict[str, Any] = {
        "epoch_end": _epoch_end,
        "tune_candidate": _tune_candidate,
        "preflight": lambda d: preflight_text(d),
    }


def follow(job: Job, *, logs: bool = False) -> JobInfo:
    """Follow a job with a progress bar (steps of all epochs) and one line per epoch.

    Raises:
        JobFailed, JobCancelled: as :meth:`Job.wait`.
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                  TextColumn("{task.fields[detail]}"), TimeRemainingColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task(f"{job.id} {job.status}", total=None, detail="")
        return job.wait(on_event=_Follower(job, bar, task, logs))


def _print_final(info: JobInfo) -> None:
    raw = info.result or {}
    res = JobResult.of(raw)
    line = f"{info.id}: {info.status}"
    if res.metrics:
        line += "  " + format_metrics(res.metrics)
    if res.verdict and not res.tune:
        line += f"  verdict {verdict_text(raw)}"
    typer.echo(line)
    if data_text(raw):
        typer.echo(f"data: {data_text(raw)}")
    note = learned_note(raw, info.model) if info.status == "succeeded" else None
    if note:
        typer.echo(f"note: {note}")
    if res.tune is not None:
        typer.echo(tune_table(res.tune))
    if isinstance(raw.get("preflight"), dict):
        typer.echo(preflight_text(raw["preflight"]))


def tune_table(tune: TuneReport | dict[str, Any]) -> str:
    """A tune result as a text table (one row per configuration), then its answer."""
    t = tune if isinstance(tune, TuneReport) else TuneReport.model_validate(tune)
    out = [f"{'configuration':32s} {'img/s (mean ± std, n)':>22s} {'step ms':>8s} "
           f"{'verdict':>12s} {'signif.':>8s} {'gain':>6s}"]
    for r in t.rows:
        ips = "—" if r.img_per_s is None else f"{r.img_per_s:.1f} ± {r.img_per_s_std or 0:.1f} ({r.n})"
        sig = "—" if r.name == "baseline" or r.significant is None else ("yes" if r.significant else "no")
        gain = "—" if r.gain is None else f"{100 * r.gain:+.0f}%"
        step = "—" if r.step_ms is None else f"{r.step_ms:.0f}"
        mark = " *" if t.recommended and r.name == t.recommended.name else ""
        out.append(f"{(r.label or r.name)[:32]:32s} {ips:>22s} {step:>8s} {r.verdict or '—':>12s} "
                   f"{sig:>8s} {gain:>6s}{mark}")
    out.append(f"answer:   {t.answer}")
    if t.expected_epoch_s is not None:
        out.append(f"epoch:    {t.expected_epoch_s:.1f} s expected (baseline "
                   f"{t.baseline_epoch_s or 0:.1f} s)")
    if t.recommended_params:
        out.append("train with: " + " ".join(f"{k}={v}" for k, v in t.recommended_params.items()))
    return "\n".join(out)


def preflight_text(pf: dict[str, Any]) -> str:
    """A preflight estimate (and the actual times once the run ended) in two lines."""
    from libreyolo_client._models import Preflight

    p = Preflight.model_validate(pf)
    text = (f"preflight: {p.img_per_s:.1f} img/s, epoch {p.epoch_s:.1f} s, total {p.total_s:.0f} s"
            + (f", peak memory {p.peak_memory_mb:,.0f} MiB ({p.memory_kind})"
               if p.peak_memory_mb is not None else "")
            + (f", cost {p.cost:.2f} {p.currency}" if p.cost is not None else ""))
    if p.actual is not None and p.actual.epoch_time_s is not None:
        a = p.actual
        total = (f", total {(a.train_s or 0) + (a.val_s or 0):.0f} s (training and validation; "
                 f"the engine ran {a.wall_s or 0:.0f} s in all)" if a.train_s is not None
                 else f", engine {a.wall_s or 0:.0f} s")
        text += f"\nactual:    epoch {a.epoch_time_s:.1f} s (mean of {a.epochs}){total}"
    return text


@jobs_app.command("submit")
def submit(
    data: Annotated[str, typer.Option("--data", "-d",
                                      help="dataset id or dataset yaml path")],
    params: Annotated[list[str] | None, typer.Argument(
        help="training keys as key=value, e.g. epochs=10 imgsz=320 batch=16")] = None,
    model: Annotated[str, typer.Option("--model", "-m", help="e.g. yolo9-t")] = "yolo9-t",
    kind: Annotated[str, typer.Option(help="train, profile, tune or predict")] = "train",
    gpus: Annotated[int | None, typer.Option(help="0 (CPU), 1, 2, 4 or 8")] = None,
    procs: Annotated[int, typer.Option(help="CPU ranks of a --gpus 0 job (DDP over Gloo)")] = 1,
    nodes: Annotated[int, typer.Option(
        help="hosts of one torchrun world: --gpus (or --procs) ranks on each of this many "
             "workers; the job starts once they are all free")] = 1,
    priority: Annotated[int, typer.Option(help="0..9")] = 0,
    time_budget_s: Annotated[float | None, typer.Option(help="wall-clock limit, s")] = None,
    follow_: Annotated[bool, typer.Option("--follow", "-f",
                                          help="follow with a progress bar until done")] = False,
    batch: Annotated[int | None, typer.Option(help="images per step: the same as batch=N")] = None,
    repeat: Annotated[int | None, typer.Option(help="tune: trials per configuration")] = None,
    steps: Annotated[int | None, typer.Option(
        help="tune: measured steps per trial; profile: measured steps (profile_steps)")] = None,
    warmup: Annotated[int | None, typer.Option(
        help="tune: discarded steps per trial; profile: discarded steps (profile_warmup)")] = None,
    max_candidates: Annotated[int | None, typer.Option(
        help="tune: configurations tried besides the baseline")] = None,
    budget_s: Annotated[float | None, typer.Option(help="tune: time budget, s")] = None,
    min_gain: Annotated[float | None, typer.Option(
        help="tune: smallest gain recommended (0.05 = 5%)")] = None,
) -> None:
    """Submit a job and print its id (with -f: follow it to the end). ``--kind tune`` takes
    the tune options (--repeat, --steps, --warmup, --max-candidates, --budget-s,
    --min-gain); ``--kind profile`` takes --steps and --warmup (its window, the keys
    profile_steps and profile_warmup), as ``libreyolo profile run`` does; --batch N is
    batch=N; ``preflight=true`` asks a train job for its estimate first; ``gpus=0``,
    ``procs=2``, ``nodes=1``, ``priority=5`` are their flags (the service's messages print
    that form)."""
    keys = parse_params(params or [])
    gpus, procs, nodes, priority = _job_fields(keys, gpus=gpus, procs=procs, nodes=nodes,
                                               priority=priority)
    keys = _with_flags(keys, kind, batch=batch,
                       steps=steps if kind == "profile" else None,
                       warmup=warmup if kind == "profile" else None)
    if kind == "profile":  # the window flags were training keys
        steps = warmup = None
    options = _tune_options(kind, repeat=repeat, steps=steps, warmup=warmup,
                            max_candidates=max_candidates, budget_s=budget_s, min_gain=min_gain)
    with _client() as c, warnings.catch_warnings():
        warnings.simplefilter("ignore", SubmitWarning)  # printed below, as a plain line
        job = c.submit(kind, model, data, gpus=gpus, procs=procs, nodes=nodes, priority=priority,
                       time_budget_s=time_budget_s, params=keys,
                       tune=options if kind == "tune" else None)
        typer.echo(job.id)
        for text in job.info.warnings:
            typer.echo(f"warning: {text}", err=True)
        typer.echo(f"page: {job.page_url}", err=True)
        if follow_:
            _print_final(follow(job))


def _job_fields(keys: dict[str, Any], *, gpus: int | None, procs: int, nodes: int,
                priority: int) -> tuple[int | None, int, int, int]:
    """The job's own fields given as key=value (``nodes=1``, ``gpus=0``: the form the
    service's errors and warnings print) count as their flags: taken out of ``keys``.

    Returns:
        ``(gpus, procs, nodes, priority)``.

    Raises:
        typer.Exit: 2, a value that is no integer, or a key and its flag that differ.
    """
    fields: dict[str, int | None] = {"gpus": gpus, "procs": procs, "nodes": nodes,
                                     "priority": priority}
    unset = {"gpus": None, "procs": 1, "nodes": 1, "priority": 0}
    for key in [k for k in fields if k in keys]:
        value = keys.pop(key)
        if not isinstance(value, int) or isinstance(value, bool):
            typer.secho(f"error: {key}={value!r} is not an integer", fg="red", err=True)
            raise typer.Exit(2)
        if fields[key] not in (unset[key], value):
            typer.secho(f"error: {key}={value} and --{key} say {fields[key]}: give one",
                        fg="red", err=True)
            raise typer.Exit(2)
        fields[key] = value
    procs, nodes, priority = (int(fields[k] or 0) for k in ("procs", "nodes", "priority"))
    return fields["gpus"], procs, nodes, priority


def _with_flags(keys: dict[str, Any], kind: str, *, batch: int | None, steps: int | None,
                warmup: int | None) -> dict[str, Any]:
    """``keys`` with the flags that are training keys: ``--batch`` (batch), and for a
    profile job ``--steps`` and ``--warmup`` (its window: profile_steps, profile_warmup,
    as ``libreyolo profile run`` takes them).

    Raises:
        typer.Exit: 2, a key and its flag given with different values.
    """
    flag_keys: dict[str, Any] = {"batch": batch}
    if kind == "profile":
        flag_keys |= {"profile_steps": steps, "profile_warmup": warmup}
    for key, value in flag_keys.items():
        if value is None:
            continue
        if key in keys and keys[key] != value:
            typer.secho(f"error: {key}={keys[key]} and its flag say {value}: give one", fg="red",
                        err=True)
            raise typer.Exit(2)
        keys[key] = value
    return keys


def _tune_options(kind: str, **flags: Any) -> dict[str, Any]:
    """The tune options given as flags (those not ``None``).

    Raises:
        typer.Exit: 2, a tune option given to a job of another kind.
    """
    options = {k: v for k, v in flags.items() if v is not None}
    if options and kind != "tune":
        first = next(iter(options)).replace("_", "-")
        also = " (or with --kind profile)" if first in ("steps", "warmup") else ""
        typer.secho(f"error: --{first} is a tune option: use it with --kind tune{also}",
                    fg="red", err=True)
        raise typer.Exit(2)
    return options


@jobs_app.command("list")
def list_jobs(
    status: Annotated[str | None, typer.Option(help="e.g. running or queued,running")] = None,
    kind: Annotated[str | None, typer.Option(help="train, profile, tune or predict")] = None,
    limit: Annotated[int, typer.Option(help="at most this many")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines")] = False,
) -> None:
    """Your jobs, newest first."""
    with _client() as c:
        jobs = c.jobs(status=status, kind=kind, limit=limit)
        if as_json:
            for j in jobs:
                typer.echo(j.info.model_dump_json())
            return
        # the model as the job page's "Started from" says it, never the server's file path
        models = [j.info.started_from or j.info.model for j in jobs]
        w = max([9, *map(len, models)])
        typer.echo(f"{'ID':<26} {'KIND':<8} {'MODEL':<{w}} {'STATUS':<11} {'CREATED':<20} INFO")
        for j, model in zip(jobs, models, strict=True):
            i = j.info
            created = i.created_at.strftime("%Y-%m-%d %H:%M:%S") if i.created_at else ""
            nodes = f"[{nodes_text(i.nodes, i.gpus, i.procs)}] " if i.nodes > 1 else ""
            typer.echo(f"{i.id:<26} {i.kind:<8} {model:<{w}} {i.status:<11} {created:<20} "
                       f"{nodes}{_summary(i)}")


@jobs_app.command("show")
def show(
    job_id: Annotated[str, typer.Argument(help="job id")],
    as_json: Annotated[bool, typer.Option("--json", help="the whole job as JSON")] = False,
    follow_: Annotated[bool, typer.Option("--follow", "-f", help="follow until done")] = False,
) -> None:
    """A job: status, progress, result (metrics, verdict) or error tail."""
    with _client() as c:
        job = c.job(job_id)
        if follow_ and not job.info.done:
            follow(job)
        i = job.info
        if as_json:
            typer.echo(i.model_dump_json(indent=2))
            return
        for line in [*_head_lines(i), *_result_lines(i), *_error_lines(i)]:
            typer.echo(line)
        typer.echo(f"page:     {job.page_url}")


def _requeues(i: JobInfo) -> str:
    """``; N infrastructure re-queue(s), not counted`` when the service re-queued the job
    after a lost worker (as the job page says), else nothing."""
    n = i.infra_retries
    return f"; {n} infrastructure re-queue{'s' if n != 1 else ''}, not counted" if n else ""


def _head_lines(i: JobInfo) -> list[str]:
    """``jobs show``'s first lines: what the job is, its status and how the last attempt
    ended, its nodes, its place in the queue, its progress and duration."""
    out = [f"id:       {i.id}\nkind:     {i.kind}\nmodel:    {i.started_from or i.model}\n"
           f"data:     {i.data}\nparams:   {json.dumps(i.params)}\n"
           f"gpus:     {i.gpus}" + (f" (CPU ranks: {i.procs})" if not i.gpus and i.procs > 1 else "")
           + f"\nstatus:   {i.status} (attempt {i.attempt}/{i.max_attempts}{_requeues(i)})"
           + (f": {i.waiting}" if i.waiting else "")]
    if i.end_class:  # how the last attempt ended: infrastructure, job or user
        retries = f" ({i.infra_retries} infrastructure re-queue" \
                  f"{'s' if i.infra_retries != 1 else ''})" if i.infra_retries else ""
        out.append(f"ended:    {i.end_class}: {i.end_reason or ''}{retries}".rstrip())
    out += node_lines(i)
    if line := cluster_line(i):
        out.append(line)
    if i.status == "queued" and queue_text(i):
        out.append(f"queue:    {queue_text(i)} (priority {i.priority}, effective "
                   f"{i.effective_priority})")
    if i.progress and not i.done:
        p = i.progress
        out.append(f"progress: {progress_text(p)}  {format_metrics(p.get('metrics'))}".rstrip())
    if i.duration_s is not None:
        out.append(f"duration: {i.duration_s:.1f} s")
    return out


def _result_lines(i: JobInfo) -> list[str]:
    """``jobs show``'s result: a tune's table, or a finished job's best epoch, note and
    verdict with its lever; the data scan; the preflight estimate."""
    raw = i.result or {}
    res = JobResult.of(raw)
    out = []
    if res.tune is not None:
        out.append(tune_table(res.tune))
    elif i.status == "succeeded":
        if i.kind != "profile" and res.best_epoch:  # a profile job trains no best
            out.append(f"best:     epoch {res.best_epoch}  {format_metrics(res.metrics)}")
        note = learned_note(raw, i.model)
        if note:
            out.append(f"note:     {note}")
        if res.verdict:
            out += _verdict_lines(raw, res.lever)
    if data_text(raw):
        out.append(f"data:     {data_text(raw)}")
    pf = res.preflight or (i.progress or {}).get("preflight")
    if isinstance(pf, dict) and pf.get("total_s") is not None:
        out.append(preflight_text(pf))
    return out


def _verdict_lines(raw: dict[str, Any], lever: LeverAdvice | None) -> list[str]:
    """A profile job's verdict, why it may be unreliable, and its lever."""
    out = [f"verdict:  {verdict_text(raw)}"]
    if unreliable_reasons(raw):
        out.append(f"          UNRELIABLE: {unreliable_reasons(raw)}")
    if lever is not None and lever.model_fields_set:
        tried = " ".join(f"{k}={v}" for k, v in lever.params.items())
        out.append(f"lever:    {('try ' + tried + ' — ') if tried else ''}{lever.why}")
        out += [f"          also: {tip}" for tip in lever.also]
    return out


def _error_lines(i: JobInfo) -> list[str]:
    """``jobs show``'s error: the reason, the engine's error and the log's last lines."""
    if not i.error:
        return []
    out = [f"error:    {i.error.get('reason')} (exit code {i.error.get('exit_code')})"]
    if i.error.get("engine_error"):
        rank = i.error.get("failed_rank")
        out.append(f"cause:    {i.error['engine_error']}"
                   + (f" (rank {rank})" if rank is not None else ""))
    out += [f"    {ln}" for ln in i.error.get("log_tail") or []]
    return out


@jobs_app.command("logs")
def logs(
    job_id: Annotated[str, typer.Argument(help="job id")],
    follow_: Annotated[bool, typer.Option("--follow", "-f",
                                          help="keep printing until the job ends")] = False,
    tail: Annotated[int | None, typer.Option(help="only the last N lines")] = None,
) -> None:
    """The engine's log (stdout and stderr of the run)."""
    with _client() as c:
        for line in c.job(job_id).logs(follow=follow_, tail=tail):
            typer.echo(line)


@jobs_app.command("cancel")
def cancel(job_id: Annotated[str, typer.Argument(help="job id")]) -> None:
    """Cancel a job (a running one stops after its engine saved last.pt)."""
    with _client() as c:
        info = c.cancel(job_id)
        typer.echo(f"{info.id}: {info.status}")


@jobs_app.command("resume")
def resume(
    job_id: Annotated[str, typer.Argument(help="a cancelled or failed train job")],
    follow_: Annotated[bool, typer.Option("--follow", "-f",
                                          help="follow the new job to the end")] = False,
) -> None:
    """Resume a cancelled or failed train job from its last.pt: prints the new job's id."""
    with _client() as c:
        job = c.resume(job_id)
        typer.echo(job.id)
        typer.echo(f"page: {job.page_url}", err=True)
        if follow_:
            _print_final(follow(job))


@jobs_app.command("download")
def download(
    job_id: Annotated[str, typer.Argument(help="job id")],
    path: Annotated[str, typer.Argument(help="artifact path in the run directory")]
    = "weights/best.pt",
    dest: Annotated[str | None, dest_option("--dest", "-o")] = None,
    list_: Annotated[bool, typer.Option("--list", "-l", help="list the artifacts")] = False,
) -> None:
    """Download an artifact (resumes an interrupted download; checks its sha256)."""
    with _client() as c:
        job = c.job(job_id)
        if list_:
            for a in job.artifacts():
                typer.echo(f"{a.path:<40} {a.kind:<12} {format_bytes(a.size_bytes):>10}  "
                           f"{a.sha256 or ''}")
            return
        out = job.download(path, dest, progress=True)
        typer.echo(str(out))


@jobs_app.command("open")
def open_job(
    job_id: Annotated[str, typer.Argument(help="job id")],
    timeline: Annotated[bool, typer.Option(help="open the profiler timeline instead")] = False,
) -> None:
    """Open the job's page (or its profiler timeline) in the browser."""
    with _client() as c:
        job = c.job(job_id)
        if timeline:
            folder = Path(tempfile.gettempdir()) / "libreyolo" / job.id
            target = job.download("timeline.html", folder / "timeline.html").resolve()
            url = target.as_uri()
        else:
            url = job.page_url
        typer.echo(url)
        if not os.environ.get("LIBREYOLO_NO_BROWSER"):
            webbrowser.open(url)
