"""``/docs`` (Swagger UI) works on a host without internet.

The browser context aborts every request that leaves the service's origin, so a page
that still loads its scripts from a CDN shows nothing and fails here.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

if not Path("/usr/bin/chromium").exists():
    pytest.skip("/usr/bin/chromium not installed (apt-get install chromium)",
                allow_module_level=True)
pytest.importorskip("playwright.sync_api", reason="the playwright python package is missing")

from playwright.sync_api import expect  # noqa: E402


def _offline(web, page) -> list[str]:
    """Abort every request to another origin; returns the list of the aborted URLs."""
    blocked: list[str] = []

    def route(r):
        parts = urlsplit(r.request.url)
        if f"{parts.scheme}://{parts.netloc}" == web.origin:
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort("internetdisconnected")

    page.context.route("**/*", route)
    return blocked


def test_swagger_ui_lists_the_operations_offline(web, shot):
    page = web.page()
    blocked = _offline(web, page)
    page.goto("/docs")
    expect(page.locator(".opblock").first).to_be_visible()
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    for want in ("/v1/jobs", "/v1/jobs/{job_id}", "/v1/datasets"):
        assert any(p.replace("\u200b", "") == want for p in paths), paths
    expect(page.get_by_role("button", name="Authorize")).to_be_visible()
    shot(page, "docs-offline")
    assert blocked == [], blocked
