"""``libreyolo-service``: the service's CLI does not import the SDK package (see
``test_service_api.py::test_service_never_imports_torch_nor_the_sdk``), yet mounts the
SDK's ``jobs``, ``datasets`` and ``models`` commands."""

from __future__ import annotations

from typer.testing import CliRunner


def test_the_sdk_commands_load_when_used():
    from service.cli import CLIENT_COMMANDS, app

    run = CliRunner()
    listed = run.invoke(app, ["--help"], env={"COLUMNS": "100"})
    assert listed.exit_code == 0, listed.output
    for name in ("jobs", "datasets", "models"):
        assert name in CLIENT_COMMANDS and f" {name} " in listed.stdout
        shown = run.invoke(app, [name, "--help"], env={"COLUMNS": "100"})
        assert shown.exit_code == 0, shown.output
        assert "--url" in shown.stdout and "--install-completion" not in shown.stdout


def test_without_the_sdk_its_commands_are_unknown(monkeypatch):
    from service import cli

    monkeypatch.setitem(cli.CLIENT_COMMANDS, "jobs", "no_such_sdk.cli:jobs_app")
    r = CliRunner().invoke(cli.app, ["jobs", "list"])
    assert r.exit_code == 2 and "No such command 'jobs'" in r.output
