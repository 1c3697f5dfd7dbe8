"""``libreyolo-service users list|cap``: users and their cap on running jobs (admin side:
it writes the database named by the settings, like ``token create``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from service.admin_db import HomeOption, admin_settings, require_database
from service.settings import Settings

__all__ = ["users_app"]

users_app = typer.Typer(help="users and their cap on running jobs", no_args_is_help=True)


def _sessions(settings: Settings, home: Path | None):
    from service.db.session import make_engine, make_session_factory

    require_database(settings, home)
    engine = make_engine(settings.database_url)
    return engine, make_session_factory(engine)


def _cap_text(cap: int | None, settings: Settings) -> str:
    if cap is None:
        default = settings.max_running_per_user
        return f"{default or 'none'} (default)"
    return str(cap) if cap else "none"


@users_app.command("list")
def users_list(home: HomeOption = None) -> None:
    """Every user: admin or not, cap on running jobs, jobs running and queued now."""
    from sqlalchemy import func, select

    from service.db.models import Job, User
    from service.lifecycle import ACTIVE, JobStatus

    settings = admin_settings(home)
    engine, sessions = _sessions(settings, home)
    try:
        with sessions() as s:
            counts = {(o, st): n for o, st, n in s.execute(
                select(Job.owner_id, Job.status, func.count())
                .where(Job.status.in_((JobStatus.QUEUED, *ACTIVE))).group_by(Job.owner_id, Job.status))}
            users = list(s.scalars(select(User).order_by(User.name)))
    finally:
        engine.dispose()
    w = max([len(u.name) for u in users] + [4])
    typer.echo(f"{'name':<{w}}  admin  {'cap':<13} running  queued")
    for u in users:
        running = sum(counts.get((u.id, st), 0) for st in ACTIVE)
        typer.echo(f"{u.name:<{w}}  {'yes' if u.is_admin else 'no':<5}  "
                   f"{_cap_text(u.max_running, settings):<13} {running:>7}  "
                   f"{counts.get((u.id, JobStatus.QUEUED), 0):>6}")


@users_app.command("cap")
def users_cap(
    name: Annotated[str, typer.Argument(help="user name")],
    max_running: Annotated[int | None, typer.Argument(
        min=0, help="running jobs the user may have at once; 0: no cap")] = None,
    default: Annotated[bool, typer.Option(
        "--default", help="back to the setting max_running_per_user")] = False,
    home: HomeOption = None,
) -> None:
    """Show or set how many running jobs user NAME may have at once (all queues together).

    Raising a cap sends a wake-up to each queue holding the user's queued jobs, so a worker
    that is idle takes one at once.
    """
    from service.scheduler import wake_targets
    from service.users import set_user_cap

    settings = admin_settings(home)
    if default and max_running is not None:
        raise typer.BadParameter("give a number or --default, not both")
    engine, sessions = _sessions(settings, home)
    try:
        with sessions() as s:
            if max_running is None and not default:
                from sqlalchemy import select

                from service.db.models import User

                user = s.scalar(select(User).where(User.name == name))
                if user is None:
                    typer.echo(f"no user named {name!r} (`libreyolo-service users list`)", err=True)
                    raise typer.Exit(2)
                typer.echo(f"{name}: cap {_cap_text(user.max_running, settings)}")
                return
            try:
                user = set_user_cap(s, name, None if default else max_running)
            except LookupError as exc:
                typer.echo(f"{exc} (`libreyolo-service users list`)", err=True)
                raise typer.Exit(2) from None
            s.commit()
            targets = wake_targets(s, user.id)
    finally:
        engine.dispose()
    typer.echo(f"{name}: cap {_cap_text(None if default else max_running, settings)}")
    if targets:
        _wake(settings, targets)


def _wake(settings: Settings, targets: list[tuple[str, str, int]]) -> None:
    """Send the wake-ups; a broker that cannot be reached only delays them (the reaper
    re-sends queued jobs' messages after ``resend_after_s``)."""
    from service.queue import create_celery, enqueue

    app = create_celery(settings)
    try:
        for job_id, queue, priority in targets:
            enqueue(app, job_id, queue, priority)
        typer.echo(f"woke the workers of {', '.join(sorted({q for _, q, _ in targets}))}")
    except Exception as exc:  # the broker is down: not an error of this command
        typer.echo(f"could not reach the broker ({exc}); the reaper re-sends within "
                   f"{settings.resend_after_s:.0f} s", err=True)
    finally:
        app.close()
