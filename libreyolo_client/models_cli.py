"""``libreyolo-service models ...``: the model registry in a terminal.

``upload | list | show | rm | publish | export | download``. URL and token as for ``jobs`` (``--url``
/ ``--token``, ``LIBREYOLO_URL`` / ``LIBREYOLO_TOKEN``, or what ``up`` saved). Exit codes:
0 ok, 1 error, 2 invalid request (a refused upload: the message says why).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from libreyolo_client._models import Model
from libreyolo_client._progress import format_bytes
from libreyolo_client.cli import _client, add_connection_options, dest_option

__all__ = ["models_app"]

models_app = typer.Typer(help="register weights files and start jobs from them",
                         no_args_is_help=True, pretty_exceptions_enable=False)


add_connection_options(
    models_app,
    "Registered models: uploads and published job checkpoints (pass the id as a job's model).")


def _line(m: Model) -> str:
    return (f"{m.id}  {m.model_name:<8} nc={m.nc:<3} {m.params / 1e6:5.2f}M params  "
            f"{format_bytes(m.bytes):>9}  {m.source:<32} {m.name}")


@models_app.command("upload")
def upload(
    path: Annotated[Path, typer.Argument(help="weights file (.pt)")],
    name: Annotated[str | None, typer.Option("--name", "-n",
                                             help="model name (default: file name)")] = None,
) -> None:
    """Upload a weights file; prints the model id to pass as a job's model."""
    with _client() as c:
        m = c.upload_model(path, name=name, progress=True)
    typer.echo(_line(m))
    typer.echo(f"train from it: libreyolo-service jobs submit --model {m.id} --data ...")


@models_app.command("list")
def list_models(
    as_json: Annotated[bool, typer.Option("--json", help="JSON, one model per line")] = False,
) -> None:
    """Your models, newest first."""
    with _client() as c:
        models = c.models()
    for m in models:
        typer.echo(m.model_dump_json() if as_json else _line(m))
    if not models and not as_json:
        typer.echo("no models yet (libreyolo-service models upload FILE, or models publish JOB)")


def show_text(m: Model) -> str:
    """One model as ``key: value`` lines, as ``jobs show`` prints a job."""
    names = ", ".join(f"{k} {v}" for k, v in list(m.names.items())[:20])
    more = f", ... ({len(m.names)} in all)" if len(m.names) > 20 else ""
    created = m.created_at.strftime("%Y-%m-%d %H:%M:%S") if m.created_at else ""
    return "\n".join([
        f"id:       {m.id}", f"name:     {m.name}", f"model:    {m.model_name}",
        f"classes:  {m.nc}" + (f" ({names}{more})" if names else ""),
        f"params:   {m.params / 1e6:.2f}M", f"imgsz:    {m.imgsz or '—'}",
        f"file:     {format_bytes(m.bytes)}, {m.format or '—'}, sha256 {m.sha256}",
        f"source:   {m.source}", f"created:  {created}",
        f"onnx:     {_onnx_text(m)}",
        f"train from it: libreyolo-service jobs submit --model {m.id} --data ..."])


def _onnx_text(m: Model) -> str:
    """The ONNX export in one line: its state, and once ready the check figure and size."""
    o = m.onnx
    if o.state == "ready" and o.info:
        return (f"ready, {format_bytes(int(o.info.get('bytes', 0)))}, onnxruntime check max "
                f"diff {float(o.info.get('max_diff', 0)):.3g} (tolerance "
                f"{float(o.info.get('tolerance', 0)):g}) (models download {m.id} --format onnx)")
    if o.state == "failed":
        return f"failed: {o.error} (models export {m.id} retries)"
    if o.state == "exporting":
        return "exporting on a worker"
    return f"none (models export {m.id})"


@models_app.command("show")
def show(
    model_id: Annotated[str, typer.Argument(help="model id")],
    as_json: Annotated[bool, typer.Option("--json", help="the whole model as JSON")] = False,
) -> None:
    """One model: name, family and size, classes, parameters, file, source (--json: all
    the service knows, as JSON)."""
    with _client() as c:
        m = c.model(model_id)
    typer.echo(json.dumps(m.model_dump(mode="json"), indent=2) if as_json else show_text(m))


@models_app.command("rm")
def remove(model_id: Annotated[str, typer.Argument(help="model id")]) -> None:
    """Delete a model and its file (refused while a queued or running job uses it)."""
    with _client() as c:
        c.delete_model(model_id)
    typer.echo(f"deleted {model_id}")


@models_app.command("publish")
def publish(
    job_id: Annotated[str, typer.Argument(help="a succeeded job")],
    name: Annotated[str, typer.Option("--name", "-n", help="the new model's name")],
) -> None:
    """Register a succeeded job's weights/best.pt as a model."""
    with _client() as c:
        m = c.job(job_id).publish(name)
    typer.echo(_line(m))


@models_app.command("export")
def export(
    model_id: Annotated[str, typer.Argument(help="model id")],
    wait: Annotated[bool, typer.Option("--wait/--no-wait",
                                       help="wait until the export is ready")] = True,
    timeout: Annotated[float, typer.Option(help="seconds to wait")] = 1800.0,
) -> None:
    """Have a worker export the model to ONNX (checked by onnxruntime); then
    `models download MODEL --format onnx`."""
    with _client() as c:
        m = c.export_model(model_id, "onnx", wait=wait, timeout=timeout)
    typer.echo(f"onnx:     {_onnx_text(m)}")


@models_app.command("download")
def download(
    model_id: Annotated[str, typer.Argument(help="model id")],
    output: Annotated[str | None, dest_option("-o", "--output")] = None,
    format: Annotated[str, typer.Option("--format", "-f",
                                        help="pt (the weights) or onnx (its export)")] = "pt",
) -> None:
    """Download a model's weights file, or its ONNX export (sha256 checked)."""
    with _client() as c:
        path = c.download_model(model_id, output, format=format)
    typer.echo(str(path))
