"""``libreyolo-service``: up | serve | worker | db upgrade | token create | users | jobs | datasets.

``up`` is the embedded default: migrations, an admin token saved for the SDK, the API and
one worker as child processes; Ctrl-C or SIGTERM stops both and leaves no child behind.
The CLI never imports the worker: it starts ``python -m worker`` as its own process.
Nor does it import the SDK: ``jobs``, ``datasets`` and ``models`` are the SDK's terminal
client (``libreyolo_client``), mounted by name and imported when one of them runs.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Annotated

import click
import typer
from typer.core import TyperGroup

from libreyolo_core.distributed.parent import die_with_parent
from service.admin_db import HomeOption, admin_settings, require_database
from service.credentials import save_credentials, saved_token
from service.settings import Settings
from service.tokens_cli import add_token_commands, parse_duration
from service.users_cli import users_app

__all__ = ["main", "app"]

#: ``up`` restarts a child that exits, at most this many times per window (seconds).
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0

#: The SDK's command groups (``module:Typer app``), loaded on first use by
#: :class:`_WithClientCommands`, so the service does not depend on the SDK package.
CLIENT_COMMANDS = {"jobs": "libreyolo_client.cli:jobs_app",
                   "datasets": "libreyolo_client.datasets_cli:datasets_app",
                   "models": "libreyolo_client.models_cli:models_app"}


class _WithClientCommands(TyperGroup):
    """The service's commands, then :data:`CLIENT_COMMANDS`, each imported when it is
    asked for (Click's lazily loaded sub-commands). Without the SDK installed they are
    listed but unknown."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*super().list_commands(ctx), *CLIENT_COMMANDS]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in CLIENT_COMMANDS:
            return super().get_command(ctx, cmd_name)
        module, _, attr = CLIENT_COMMANDS[cmd_name].partition(":")
        try:
            group = typer.main.get_group(getattr(importlib.import_module(module), attr))
        except ImportError:
            return None
        group.name = cmd_name
        return group

    def resolve_command(self, ctx: click.Context, args: list[str]):
        """Typer's, whose did-you-mean sees only the commands already loaded: here the SDK's
        are matched too (``job`` -> ``jobs``)."""
        # Typer vendors its own copy of Click: its UsageError, not click's
        usage_error = typer.core._click.exceptions.UsageError
        try:
            return super().resolve_command(ctx, args)
        except usage_error as exc:
            if args and "Did you mean" not in exc.message:
                import difflib

                matches = difflib.get_close_matches(args[0], self.list_commands(ctx))
                if matches:
                    exc.message = (f"{exc.message.rstrip('.')}. Did you mean "
                                   f"{', '.join(repr(m) for m in matches)}?")
            raise


app = typer.Typer(help="LibreYOLO training service", no_args_is_help=True,
                  pretty_exceptions_enable=False, cls=_WithClientCommands)
db_app = typer.Typer(help="database commands", no_args_is_help=True)
token_app = typer.Typer(help="API tokens", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(token_app, name="token")
app.add_typer(users_app, name="users")
add_token_commands(token_app)


def _settings() -> Settings:
    settings = Settings()
    settings.ensure_dirs()
    return settings


@db_app.command("upgrade")
def db_upgrade(revision: str = "head", home: HomeOption = None) -> None:
    """Apply the Alembic migrations (creates the tables on a new database)."""
    from service.db.migrate import upgrade

    settings = admin_settings(home)
    settings.ensure_dirs()
    upgrade(settings.database_url, revision)
    typer.echo(f"database at {revision}: {_redact(settings.database_url)}")


def _redact(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


def _create_token(settings: Settings, name: str, admin: bool,
                  expires_in_s: float | None = None) -> str:
    from service.db.session import make_engine, make_session_factory
    from service.users import create_user_token

    engine = make_engine(settings.database_url)
    try:
        with make_session_factory(engine)() as session:
            _, token = create_user_token(session, name=name, admin=admin,
                                         expires_in_s=expires_in_s)
            session.commit()
    finally:
        engine.dispose()
    return token


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Option(help="user name (created if new)")],
    admin: Annotated[bool, typer.Option(help="the user sees every job")] = False,
    expires_in: Annotated[str | None, typer.Option(
        help="expire after this long: 90s, 30m, 12h, 30d, 2w (default: never)")] = None,
    home: HomeOption = None,
) -> None:
    """Create a bearer token for user NAME and print it (shown once; only its sha256 is kept).

    It writes the service's existing database (the one `up` made under LIBREYOLO_HOME, by
    default ./.libreyolo) and names it on stderr; it creates none."""
    from service.users import check_user_name

    try:  # before any database is opened
        check_user_name(name)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--name'") from None
    settings = admin_settings(home)
    require_database(settings, home)
    typer.echo(_create_token(settings, name, admin,
                             parse_duration(expires_in) if expires_in else None))


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="bind address")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8000,
    workers: Annotated[int, typer.Option(min=1, help="API processes on this port (each "
                                         "with its reaper and its SSE poller)")] = 1,
    access_log: Annotated[bool, typer.Option(help="log every request (costs CPU per request)")] = False,
) -> None:
    """Run the API (and its reaper) with uvicorn, after applying migrations."""
    import uvicorn

    from service.app import create_app
    from service.db.migrate import upgrade
    from service.nodelay import NoDelayHttpToolsProtocol

    settings = _settings()
    _require_free_port(host, port)  # a taken port: the way out, not uvicorn's bind error
    upgrade(settings.database_url)
    # several processes: uvicorn's supervisor imports the factory in each (settings from
    # the same environment); see docs/scaling.md
    target = "service.app:create_app" if workers > 1 else create_app(settings)
    # the supervisor kills a process that answers no health ping for this long; the pong
    # needs the GIL, which a saturated process may not give it within uvicorn's 5 s
    uvicorn.run(target, factory=workers > 1, workers=workers, host=host, port=port,
                log_level="info", access_log=access_log, timeout_graceful_shutdown=5,
                timeout_worker_healthcheck=60, http=NoDelayHttpToolsProtocol)


def _worker_argv(gpus: str | None, cpu: bool) -> list[str]:
    argv = [sys.executable, "-m", "worker"]
    if cpu:
        argv.append("--cpu")
    elif gpus:
        argv += ["--gpus", gpus]
    return argv


@app.command()
def worker(
    gpus: Annotated[str | None, typer.Option(help="GPU indices this worker owns, e.g. 0,1")] = None,
    cpu: Annotated[bool, typer.Option(help="CPU worker (queue cpu)")] = False,
) -> None:
    """Run one Celery worker (one job at a time). Without options: the GPUs found, else CPU.

    It uses the service's database and artifact folder: start it in the folder where `up`
    runs (state in ./.libreyolo), or with the same LIBREYOLO_HOME or LIBREYOLO_DATABASE_URL
    (and LIBREYOLO_BROKER_URL, LIBREYOLO_ARTIFACT_ROOT) as the API. It refuses a database
    that was never set up."""
    argv = _worker_argv(gpus, cpu)
    _root_note()
    os.execv(argv[0], argv)


def _root_note() -> None:
    """Our word before Celery's "superuser privileges" warning: what it means here."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        typer.echo("note:   running as root, so Celery warns below that the worker has superuser "
                   "privileges: the engine it starts runs as root too. Fine in a container or "
                   "on your own machine; on a shared one, start the service as a regular user",
                   err=True)


UP_HELP = f"""Embedded mode: migrations, an admin token, the API and one worker.

Everything lives under ./.libreyolo/ (SQLite database, SQLite broker, artifacts).
The admin token is printed and saved, for this URL, in the credentials file the SDK
reads (~/.config/libreyolo/credentials, mode 600; LIBREYOLO_CREDENTIALS_PATH moves it).
Started again, up reuses the token saved for its URL while this database still knows
it; a service on another URL gets its own entry, and the first one stays the default.

A child process that dies is restarted, up to {MAX_RESTARTS} times in {RESTART_WINDOW_S:.0f} s; then
the service stops with exit code 1. Ctrl-C or SIGTERM stops both processes (the
worker stops its engine first).
"""


def _admin_token(settings: Settings, url: str) -> tuple[str, bool]:
    """The token saved for ``url`` if this database still knows it (an admin's), else a
    new admin token. Returns ``(token, reused)``."""
    from service.db.session import make_engine, make_session_factory
    from service.users import user_for_token

    saved = saved_token(settings.credentials_path, url)
    if saved:
        engine = make_engine(settings.database_url)
        try:
            with make_session_factory(engine)() as session:
                user = user_for_token(session, saved)
                if user is not None and user.is_admin:
                    return saved, True
        finally:
            engine.dispose()
    return _create_token(settings, "admin", admin=True), False


@app.command(help=UP_HELP)
def up(
    host: Annotated[str, typer.Option(help="bind address")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8000,
    gpus: Annotated[str | None, typer.Option(help="GPUs of the worker (default: found)")] = None,
    cpu: Annotated[bool, typer.Option(help="CPU worker")] = False,
) -> None:
    """Embedded mode (see ``UP_HELP``): migrations, the admin token, the API and a worker,
    restarted when they die; exit code 1 after too many restarts."""
    from service.db.migrate import upgrade

    settings = _settings()
    _require_free_port(host, port)
    upgrade(settings.database_url)
    url = f"http://{host}:{port}"
    token, reused = _admin_token(settings, url)
    default = save_credentials(settings.credentials_path, url, token)
    _announce(settings, url, token, reused, default)
    argvs = {
        "API": [sys.executable, "-m", "service.cli", "serve", "--host", host, "--port", str(port)],
        "worker": _worker_argv(gpus, cpu),
    }
    _root_note()
    raise typer.Exit(1 if _supervise(argvs, _child_env(settings), settings) else 0)


def _announce(settings: Settings, url: str, token: str, reused: bool, default: str | None) -> None:
    """``up``'s first lines: the API's and the pages' URLs, the admin token, where it is saved."""
    typer.echo(f"API:    {url}  (docs: {url}/docs)")
    typer.echo(f"jobs:   {url}/jobs  (web pages; sign in with the token)")
    typer.echo(f"token:  {token}" + ("  (the one saved before)" if reused else ""))
    typer.echo(f"saved:  {settings.credentials_path}" + (
        f"  (for {url}; the default service stays {default}: pass this URL to the SDK "
        f"or set LIBREYOLO_URL={url})" if default else ""))


def _child_env(settings: Settings) -> dict[str, str]:
    """The environment of ``up``'s API and worker: ours, with the settings they share."""
    return {**os.environ, "LIBREYOLO_HOME": str(settings.home),
            "LIBREYOLO_DATABASE_URL": settings.database_url,
            "LIBREYOLO_BROKER_URL": settings.broker_url,
            "LIBREYOLO_ARTIFACT_ROOT": str(settings.artifact_root)}


def _supervise(argvs: dict[str, list[str]], env: dict[str, str], settings: Settings) -> bool:
    """Start one child per ``argvs`` entry and restart one that exits, until SIGINT or
    SIGTERM, or until one exited more than :data:`MAX_RESTARTS` times in
    :data:`RESTART_WINDOW_S`; then stop them all (:func:`_shutdown`).

    Returns:
        True when it stopped for too many restarts.
    """
    me = os.getpid()

    def start(argv: list[str]) -> subprocess.Popen:
        # the API and the worker end with `up`, even after its kill -9 (no orphan keeps
        # the port or claims jobs); SIGTERM so that the worker hands its job back
        return subprocess.Popen(argv, env=env, start_new_session=True,
                                preexec_fn=functools.partial(die_with_parent, signal.SIGTERM, me))

    procs = {name: start(argv) for name, argv in argvs.items()}
    crashes: dict[str, list[float]] = {name: [] for name in argvs}
    stopping = False
    failed = False

    def _stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    try:
        while not stopping and not failed:
            time.sleep(0.2)
            for name, p in procs.items():
                if p.poll() is None or stopping:
                    continue
                failed = _crashed(name, p, crashes[name], settings)
                if failed:
                    break
                procs[name] = start(argvs[name])
    finally:
        _shutdown(list(procs.values()), settings.grace_s + 10)
    return failed


def _crashed(name: str, p: subprocess.Popen, crashes: list[float], settings: Settings) -> bool:
    """Count the exit of ``up``'s child ``name`` in ``crashes`` (its exit times, kept to the
    last :data:`RESTART_WINDOW_S`) and say it.

    Returns:
        True when it exited too often (stop the service), False to restart it.
    """
    now = time.monotonic()
    crashes[:] = [t for t in crashes if now - t < RESTART_WINDOW_S] + [now]
    if len(crashes) > MAX_RESTARTS:
        typer.echo(f"the {name} process exited {len(crashes)} times in "
                   f"{RESTART_WINDOW_S:.0f} s (last code {p.returncode}): stopping the service",
                   err=True)
        return True
    typer.echo(f"the {name} process exited (code {p.returncode}); restarting it. A job it "
               f"was running goes back to the queue when its lease ({settings.lease_s:.0f} s) "
               "expires and resumes from last.pt", err=True)
    return False


def _require_free_port(host: str, port: int) -> None:
    """Exit 1 with a clear line when ``host:port`` is taken, before anything starts (the
    API would otherwise fail to bind six times and `up` give up after a minute)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            typer.secho(f"error: {host}:{port} is already in use ({exc.strerror}). Another "
                        "`libreyolo-service up` may still be running there (`curl "
                        f"http://{host}:{port}/healthz`): stop it first, or pass --port to "
                        "start a second service.", fg="red", err=True)
            raise typer.Exit(1) from None


def _shutdown(procs: list[subprocess.Popen], timeout_s: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def main() -> None:
    """Entry point of the ``libreyolo-service`` script."""
    app()


if __name__ == "__main__":
    main()
