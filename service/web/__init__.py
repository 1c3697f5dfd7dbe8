"""Browser pages: sign-in, jobs, one job (live log, curves, verdict), datasets, models.

Jinja2 templates and a little plain JavaScript under ``static/`` (no build step, no CDN).
Every page is sent with a Content-Security-Policy without ``'unsafe-inline'``: the HTML
has no inline script, style or event handler. :func:`install` mounts the pages and the
static files on an app.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from service.web.models_pages import router as models_router
from service.web.routes import router

__all__ = ["install", "router", "STATIC_DIR"]

STATIC_DIR = Path(__file__).resolve().parent / "static"


def install(app: FastAPI) -> None:
    """Add the page routes and mount ``/web/static`` on ``app``."""
    app.include_router(router)
    app.include_router(models_router)
    app.mount("/web/static", StaticFiles(directory=STATIC_DIR), name="web-static")
