"""Infrastructure outages: which errors mean "the database or the broker is away for now".

An outage is not the job's fault nor the caller's: the API answers it with 503 and
``Retry-After`` (:func:`service.api.outage.install_outage_handler`), and the worker's watch
loop retries with backoff while its lease lasts (:mod:`worker.runner`), so a short outage
costs a job nothing.
"""

from __future__ import annotations

__all__ = ["TRANSIENT_DB", "broker_errors", "is_outage", "what_is_down"]

from sqlalchemy import exc as sa_exc

#: SQLAlchemy errors of a lost or refused connection (``DBAPIError`` with
#: ``connection_invalidated`` counts too, see :func:`is_outage`).
TRANSIENT_DB: tuple[type[Exception], ...] = (
    sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError,
    sa_exc.DisconnectionError)


def broker_errors() -> tuple[type[Exception], ...]:
    """The broker clients' connection errors (kombu's, redis-py's when installed)."""
    out: list[type[Exception]] = []
    try:
        from kombu.exceptions import OperationalError as KombuOperationalError

        out.append(KombuOperationalError)
    except ImportError:  # pragma: no cover - kombu is a dependency
        pass
    try:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        out += [RedisConnectionError, RedisTimeoutError]
    except ImportError:  # redis is only there with the Redis broker
        pass
    return tuple(out)


def what_is_down(exc: BaseException) -> str | None:
    """``"database"``, ``"broker"`` or None: which part of the infrastructure ``exc``
    (or an exception it was raised from) says is unreachable."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    broker = broker_errors()
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, TRANSIENT_DB) or (
                isinstance(cur, sa_exc.DBAPIError) and cur.connection_invalidated):
            return "database"
        if broker and isinstance(cur, broker):
            return "broker"
        cur = cur.__cause__ or cur.__context__
    return None


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` is a database or broker outage (:func:`what_is_down`)."""
    return what_is_down(exc) is not None
