"""#28.9: a cancelled train job's page offers Resume (a new job from its last.pt)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(f"{CHROMIUM} not installed (apt-get install chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api", reason="the playwright python package is missing")

from playwright.sync_api import expect  # noqa: E402
from testkit import client, wait_for  # noqa: E402


def test_resume_button_starts_a_new_job_from_last_pt(web, stack, shot, data_yaml):
    _, token = stack.user()
    with client(stack.url, token) as c:
        job = c.post("/v1/jobs", json={"model": "yolo9-t", "data": data_yaml, "gpus": 0,
                                       "params": {"epochs": 8, "imgsz": 64}}).json()
        stack.run(job["id"], FAKE_EPOCH_S="0.3")
        last = stack.settings.artifact_root / job["id"] / "run" / "weights" / "last.pt"
        wait_for(lambda: last.is_file() and json.loads(last.read_text())["epoch"] >= 1,
                 timeout=60, what="an epoch")
        c.post(f"/v1/jobs/{job['id']}/cancel")
        wait_for(lambda: c.get(f"/v1/jobs/{job['id']}").json()["status"] == "cancelled",
                 timeout=60, what="cancelled")
    page = web.page(token)
    page.goto(f"/jobs/{job['id']}")
    button = page.locator("#resume-button")
    expect(button).to_be_visible()
    shot(page, "job-resumable")
    button.click()
    page.wait_for_url(lambda url: "/jobs/" in url and job["id"] not in url)
    new_id = page.url.rstrip("/").rsplit("/", 1)[-1]
    with client(stack.url, token) as c:
        new = c.get(f"/v1/jobs/{new_id}").json()
        assert new["status"] == "queued" and new["params"] == job["params"]
        c.post(f"/v1/jobs/{new_id}/cancel")
    # a queued job has no Resume button
    with client(stack.url, token) as c:
        queued = c.post("/v1/jobs", json={"model": "yolo9-t", "data": data_yaml, "gpus": 0,
                                          "params": {"epochs": 1, "imgsz": 64}}).json()
    page.goto(f"/jobs/{queued['id']}")
    expect(page.locator("#status-badge")).to_have_text("queued")
    expect(page.locator("#resume-button")).to_have_count(0)
    with client(stack.url, token) as c:
        c.post(f"/v1/jobs/{queued['id']}/cancel")
