"""``libreyolo-service datasets upload|list|rm``: datasets from a terminal (the SDK's calls).

URL and token as for ``jobs``: ``--url`` / ``--token`` (before the sub-command),
``LIBREYOLO_URL`` / ``LIBREYOLO_TOKEN``, or the credentials file that ``up`` writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from libreyolo_client.cli import _client, add_connection_options

__all__ = ["datasets_app"]

datasets_app = typer.Typer(help="upload, list and delete datasets on a service",
                           no_args_is_help=True, pretty_exceptions_enable=False)


add_connection_options(
    datasets_app,
    "Manage your datasets on a LibreYOLO service (URL and token default to what `up` saved).")


def _splits(report: dict | None) -> str:
    splits = (report or {}).get("splits") or {}
    return ", ".join(f"{name} {s.get('images', '?')} images / {s.get('boxes', '?')} boxes"
                     for name, s in splits.items())


@datasets_app.command("upload")
def upload(
    path: Annotated[Path, typer.Argument(help="dataset folder (with its data.yaml) or .zip")],
    name: Annotated[str | None, typer.Option(help="dataset name (default: the folder's)")] = None,
) -> None:
    """Upload a dataset folder or zip; the service checks and scans it. Prints its id.

    The same zip uploaded again gives the dataset already made from it.
    """
    with _client() as c:
        try:
            ds = c.upload_dataset(path, name, progress=True)
        except (FileNotFoundError, ValueError) as exc:
            typer.secho(f"error: {exc}", fg="red", err=True)
            raise typer.Exit(2) from None
        typer.echo(ds.id)
        typer.echo(f"{ds.name}: {ds.status}; {_splits(ds.report)}", err=True)
        if ds.status != "ready":
            output = (ds.report or {}).get("output", "")
            typer.secho(f"the scan failed:\n{output}", fg="red", err=True)
            raise typer.Exit(1)


@datasets_app.command("list")
def list_datasets(
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines")] = False,
) -> None:
    """Your datasets, newest first."""
    with _client() as c:
        datasets = c.datasets()
        if as_json:
            for d in datasets:
                typer.echo(d.model_dump_json())
            return
        typer.echo(f"{'ID':<26} {'NAME':<20} {'SOURCE':<9} {'STATUS':<8} PATH / SPLITS")
        for d in datasets:
            typer.echo(f"{d.id:<26} {d.name[:20]:<20} {d.source:<9} {d.status:<8} {d.path}"
                       + (f"  ({_splits(d.report)})" if d.report else ""))


@datasets_app.command("rm")
def remove(
    dataset_ids: Annotated[list[str], typer.Argument(help="dataset id(s)")],
) -> None:
    """Delete datasets (an upload's files too). A dataset a queued or running job reads
    is refused."""
    with _client() as c:
        for dataset_id in dataset_ids:
            c.delete_dataset(dataset_id)
            typer.echo(f"deleted {dataset_id}")


