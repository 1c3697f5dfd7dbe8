"""``timeline.html`` of a real CPU profile run in headless Debian Chromium (Playwright).

Checks: the page loads with no console errors, no page errors and no network request
other than the ``file://`` page itself; the verdict panel and the drawn canvases are there;
the timeline answers a zoom and a hover without freezing. A screenshot is written to
``$TIMELINE_SCREENSHOT`` when that variable names a path (for looking at it by eye).
Skipped when ``/usr/bin/chromium`` or the ``playwright`` package is missing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

pytestmark = pytest.mark.skipif(not CHROMIUM.is_file(), reason=f"{CHROMIUM} is not installed")


def test_timeline_opens_without_errors_or_network(profiled_run, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    page_url = (profiled_run / "timeline.html").resolve().as_uri()
    console: list[str] = []
    page_errors: list[str] = []
    requests: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1500, "height": 900})
            page = context.new_page()
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.on("pageerror", lambda e: page_errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_url, wait_until="load", timeout=30_000)
            page.wait_for_timeout(300)  # let the first frame draw

            assert "LibreYOLO profile" in page.title()
            verdict = page.locator(".verdict").first
            assert verdict.is_visible()
            assert any(v in verdict.inner_text() for v in ("dataloader", "compute"))
            sizes = page.evaluate(
                "() => [...document.querySelectorAll('canvas')].map(c => [c.id, c.width, c.height])"
            )
            assert {"tl", "steps"} <= {s[0] for s in sizes}
            assert all(w > 0 and h > 0 for _, w, h in sizes), sizes
            # the timeline canvas holds pixels (something was drawn)
            drawn = page.evaluate(
                """() => { const c = document.getElementById('tl');
                           const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                           let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++;
                           return n; }"""
            )
            assert drawn > 1000
            # the lanes use most of the window; every CPU-op row is labelled; the op-mix
            # bars show their percentage (not hidden under the bar); no caption on the chart
            lane_h, wrap_h = page.evaluate(
                "() => [document.getElementById('tl').height,"
                " document.getElementById('wrap').clientHeight]")
            assert lane_h >= 0.6 * wrap_h, (lane_h, wrap_h)
            covered = page.evaluate(
                """() => [...document.querySelectorAll('.bar em')].filter(em => {
                     em.scrollIntoView({block: 'center'});
                     const r = em.getBoundingClientRect();
                     return document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2)
                            !== em; }).length""")
            assert covered == 0
            assert page.locator(".bar em").first.inner_text().endswith("%")
            assert "tallest" in page.locator("#steps-caption").inner_text()

            box = page.locator("#tl").bounding_box()
            x, y = box["x"] + box["width"] / 2, box["y"] + 40
            page.mouse.move(x, y)
            page.mouse.wheel(0, -400)  # zoom in; must answer promptly
            t0 = time.perf_counter()  # the next animation frame comes promptly
            page.evaluate("() => new Promise(r => requestAnimationFrame(() => r(1)))")
            assert time.perf_counter() - t0 < 5.0
            page.mouse.dblclick(x, y)  # reset
            page.wait_for_timeout(200)

            shot = os.environ.get("TIMELINE_SCREENSHOT")
            page.screenshot(path=shot or str(tmp_path / "timeline.png"), full_page=False)
        finally:
            browser.close()

    assert not page_errors, page_errors
    errors = [c for c in console if c.startswith("error")]
    assert not errors, errors
    assert requests == [page_url], requests
