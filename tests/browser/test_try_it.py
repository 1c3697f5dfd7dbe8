"""'Try it' on a model's page in Chromium: an image goes to a worker (the real engine), the
page shows the annotated image and the boxes; without a live worker it says so at once."""

from __future__ import annotations

from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(f"{CHROMIUM} not installed (apt-get install chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api", reason="the playwright python package is missing")

from playwright.sync_api import expect  # noqa: E402
from testkit import client, wait_for, write_weights  # noqa: E402


@pytest.fixture
def model(stack, tmp_path):
    """A user's token and a registered 2-class yolo9-t model."""
    _, token = stack.user()
    weights = write_weights(tmp_path / "shapes.pt")
    with client(stack.url, token) as c:
        m = c.post("/v1/models", params={"name": "shapes"}, content=weights.read_bytes(),
                   timeout=180).json()
    return token, m


def _picture(path: Path) -> Path:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (320, 240), (235, 240, 245))
    draw = ImageDraw.Draw(img)
    draw.rectangle((60, 50, 200, 190), fill=(40, 110, 200))
    draw.ellipse((190, 90, 290, 200), fill=(220, 80, 40))
    img.save(path)
    return path


def test_try_it_shows_the_boxes(web, stack, shot, model, tmp_path):
    from sqlalchemy import select

    from service.db.models import Job
    from worker.heartbeat import Heartbeat, queues_for

    token, m = model
    beat = Heartbeat(stack.sessions, "tryit-cpu@host", queues_for([]), 0, 10.0)
    beat.beat()
    try:
        page = web.page(token)
        page.goto(f"/models/{m['id']}")
        expect(page.get_by_role("heading", name="Try it")).to_be_visible()
        page.get_by_label("Score threshold").fill("0.0001")  # a random head scores ~1.6e-4
        page.get_by_label("Image").set_input_files(str(_picture(tmp_path / "shapes.png")))

        def queued() -> str | None:
            with stack.sessions() as s:
                return s.scalar(select(Job.id).where(Job.kind == "predict",
                                                     Job.status == "queued"))
        job_id = wait_for(queued, timeout=30, what="the page's predict job")
        expect(page.locator("#try-status")).to_contain_text("Waiting for a worker")
        stack.run(job_id, real=True)
        figure = page.locator("#try-result")
        expect(figure).to_be_visible(timeout=120_000)
        expect(page.locator("#try-caption")).to_contain_text(job_id)
        rows = page.locator("#try-boxes tbody tr")
        expect(rows.first).to_be_visible()
        assert 1 <= rows.count() <= 300
        expect(rows.first).to_contain_text("class")
        loaded = page.locator("#try-image").evaluate("img => img.complete && img.naturalWidth")
        assert loaded == 320
        shot(page, "try-it")
    finally:
        beat.stop()


def test_try_it_says_at_once_when_no_worker_serves(web, stack, shot, model, tmp_path):
    token, m = model
    web.allowed_errors.append("status of 409")
    page = web.page(token)
    page.goto(f"/models/{m['id']}")
    page.get_by_label("Image").set_input_files(str(_picture(tmp_path / "shapes.png")))
    expect(page.locator("#try-error")).to_contain_text("no live worker serves")
    expect(page.get_by_label("Image")).to_be_enabled()
    shot(page, "try-it-no-worker")
