"""Application factory: ``create_app(settings)``; no globals, no import-time side effects."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi_offline import FastAPIOffline
from prometheus_client import CollectorRegistry

from service.api import (
    admin,
    artifacts,
    datasets,
    events,
    health,
    jobs,
    model_export,
    models,
    predict,
)
from service.api.guard import RequestGuard
from service.api.methods import OptionsMiddleware
from service.api.outage import install_outage_handler
from service.api.problems import document_problems, install_problem_handlers
from service.db.session import make_engine, make_session_factory
from service.metrics import ServiceCollector
from service.outlook_cache import OutlookCache
from service.queue import broker_epoch, create_celery, enqueue
from service.reaper import reaper_loop
from service.settings import Settings
from service.storage import ArtifactStore
from service.streams import EventNotifier
from service.users import TokenCache
from service.web import install as install_web

__all__ = ["create_app"]

log = logging.getLogger(__name__)

#: threads the hot reads run in at once, per API process (see ``create_app``)
READ_THREADS = 4

DESCRIPTION = """Remote training service for YOLO detectors.

Submit a training or profile job (`POST /v1/jobs`), follow its events
(`GET /v1/jobs/{id}/events/stream`, Server-Sent Events), then download checkpoints,
metrics and the profiler timeline (`GET /v1/jobs/{id}/artifacts/{path}`).

Every route except `/healthz`, `/readyz` and `/metrics` needs `Authorization: Bearer <token>`
(`libreyolo-service token create --name alice`). Errors are `application/problem+json`
whose `detail` (and `field`, for 422s) names what is wrong.

This page works offline: its Swagger UI assets are served by the service itself.
"""


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the API.

    Args:
        settings: configuration; ``Settings()`` (environment) when None. The database must
            be migrated already (``libreyolo-service db upgrade``; ``serve`` and ``up`` do it).

    Returns:
        The FastAPI app. Its lifespan runs the reaper (unless ``reaper_enabled`` is false)
        and the SSE streams' poller (:class:`~service.streams.EventNotifier`), and disposes the database engine on shutdown. ``/docs`` (Swagger UI) loads
        its scripts from this service (fastapi-offline's copies), never from a CDN (there
        is no ``/redoc``: ReDoc fetches its logo from one); ``/openapi.json`` documents every error as problem+json.
    """
    settings = settings or Settings()
    app = FastAPIOffline(title="LibreYOLO training service", version="0.1.0",
                         description=DESCRIPTION, lifespan=_lifespan(settings),
                         redoc_url=None, favicon_url="/web/static/favicon.svg",
                         # no badge from the public validator: the page stays offline
                         swagger_ui_parameters={"validatorUrl": None})
    _document_errors(app)
    _install_state(app, settings)
    _install_middleware(app, settings)
    _install_routers(app)
    return app


def _lifespan(settings: Settings) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """The app's lifespan: the reaper (unless ``reaper_enabled`` is false) and the SSE
    poller run while the app serves; the database engine is disposed on shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings.ensure_dirs()
        async with anyio.create_task_group() as tg:
            if settings.reaper_enabled:
                tg.start_soon(functools.partial(
                    reaper_loop, app.state.sessions, settings, app.state.send,
                    epoch=lambda: broker_epoch(app.state.celery)))
            tg.start_soon(app.state.notifier.run)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
        app.state.engine.dispose()

    return lifespan


def _install_state(app: FastAPI, settings: Settings) -> None:
    """The app's shared parts on ``app.state``: settings, database engine and sessions,
    Celery and its ``send``, the artifact store, the SSE notifier, the outlook and token
    caches, the hot reads' thread limiter, the metrics registry."""
    engine = make_engine(settings.database_url)
    celery = create_celery(settings)
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessions = make_session_factory(engine)
    app.state.celery = celery
    app.state.send = lambda job_id, queue, priority: enqueue(celery, job_id, queue, priority)
    app.state.store = ArtifactStore(settings.artifact_root)
    app.state.notifier = EventNotifier(app.state.sessions, settings.sse_poll_s)
    app.state.outlooks = OutlookCache()
    app.state.tokens = TokenCache()
    # the hot reads' threads (service.api.deps.read_in_thread): few, so the event loop and
    # they do not queue for the GIL behind dozens of others (docs/scaling.md)
    app.state.read_limiter = anyio.CapacityLimiter(READ_THREADS)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServiceCollector(app.state.sessions, settings.worker_ttl_s))
    app.state.registry = registry


def _install_middleware(app: FastAPI, settings: Settings) -> None:
    """Error handlers and middleware; the request guard outermost (bounds before anything
    is spent)."""
    install_problem_handlers(app)
    install_outage_handler(app, settings.retry_after_s)
    app.add_middleware(OptionsMiddleware, root=app)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins,
                           allow_methods=["*"], allow_headers=["*"],
                           expose_headers=["Location", "ETag", "X-Content-SHA256", "X-Log-Size"])
    app.add_middleware(RequestGuard, root=app)  # outermost: bounds before anything is spent


def _install_routers(app: FastAPI) -> None:
    """The API's routers, then the pages (:mod:`service.web`)."""
    for router in (health.router, jobs.router, events.router, artifacts.router,
                   datasets.router, models.router, model_export.router, admin.router,
                   models.publish_router, predict.router):
        app.include_router(router)
    install_web(app)


def _document_errors(app: FastAPI) -> None:
    """Let ``app.openapi()`` document errors as they are sent (problem+json)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document_problems(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
