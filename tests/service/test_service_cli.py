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


def _service_cli(*args: str, cwd, env_extra: dict | None = None):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("LIBREYOLO_")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "service.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_admin_commands_create_no_database_and_say_which_they_used(tmp_path):
    """#28.1: `token create` / `users list` in a folder without a service create nothing,
    say where they looked and how to point them; given the state folder (--home or
    LIBREYOLO_HOME) they name the database they wrote."""
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    for args in (["token", "create", "--name", "alice"], ["users", "list"],
                 ["users", "cap", "alice", "2"]):
        r = _service_cli(*args, cwd=empty)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert r.stdout == ""
        err = " ".join(r.stderr.split())
        assert "no service database" in err and str(empty) in err, err
        assert "--home" in err and "LIBREYOLO_HOME" in err and "Traceback" not in err, err
        assert "the file does not exist" in err, err
        assert list(empty.iterdir()) == [], list(empty.iterdir())

    home = tmp_path / "srv" / ".libreyolo"
    assert _service_cli("db", "upgrade", "--home", str(home), cwd=empty).returncode == 0
    db = (home / "libreyolo.db").resolve()
    r = _service_cli("token", "create", "--name", "alice", "--home", str(home), cwd=empty)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().count("\n") == 0 and len(r.stdout.strip()) > 20
    assert f"database: sqlite:///{db}" in r.stderr and "--home" in r.stderr
    for blank in ("", "   ", "\u200b"):  # refused before the database is touched
        r = _service_cli("token", "create", "--name", blank, "--home", str(home), cwd=empty)
        assert r.returncode == 2 and "empty or blank" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = _service_cli("token", "create", "--name", " alice ", "--home", str(home), cwd=empty)
    assert r.returncode == 2 and "starts or ends with" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = _service_cli("users", "list", cwd=empty, env_extra={"LIBREYOLO_HOME": str(home)})
    assert r.returncode == 0 and "alice" in r.stdout, r.stderr
    assert f"sqlite:///{db}" in r.stderr and "LIBREYOLO_HOME" in r.stderr
    assert list(empty.iterdir()) == []


def test_a_mistyped_command_gets_a_did_you_mean():
    """#28.10: `libreyolo-service job list` named no way out; the SDK's commands are loaded
    lazily, so Typer's own suggestion did not see them."""
    from service.cli import app

    run = CliRunner()
    r = run.invoke(app, ["job", "list"])
    assert r.exit_code == 2 and "No such command 'job'. Did you mean 'jobs'?" in r.output
    r = run.invoke(app, ["tokn", "create"])
    assert r.exit_code == 2 and "Did you mean 'token'?" in r.output
