"""The models pages in Chromium: list (linked from the nav), detail, delete; and the job
page's "Started from" line for a job that starts from a registered model."""

from __future__ import annotations

from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(f"{CHROMIUM} not installed (apt-get install chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api", reason="the playwright python package is missing")

from playwright.sync_api import expect  # noqa: E402
from testkit import client, write_weights  # noqa: E402


def test_models_list_detail_started_from_and_delete(web, stack, shot, data_yaml, tmp_path):
    _, token = stack.user()
    weights = write_weights(tmp_path / "shapes.pt")
    with client(stack.url, token) as c:
        m = c.post("/v1/models", params={"name": "shapes v1"}, content=weights.read_bytes(),
                   timeout=180).json()
        job = c.post("/v1/jobs", json={"model": m["id"], "data": data_yaml, "gpus": 0,
                                       "params": {"epochs": 1, "imgsz": 64}}).json()
    page = web.page(token)
    page.get_by_role("link", name="Models").click()
    page.wait_for_url("**/models")
    row = page.locator("#models-table tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("yolo9-t")
    expect(row).to_contain_text("upload")
    shot(page, "models")

    page.get_by_role("link", name="shapes v1").click()
    page.wait_for_url(f"**/models/{m['id']}")
    expect(page.locator(".facts")).to_contain_text("class0, class1")
    expect(page.locator(".facts")).to_contain_text(m["sha256"])
    page.get_by_role("link", name=job["id"]).click()
    page.wait_for_url(f"**/jobs/{job['id']}")
    started = page.locator("#started-from")
    expect(started).to_contain_text(f"model {m['id']} (shapes v1)")

    # a queued job uses it: delete is refused, with the reason on the page
    page.goto(f"/models/{m['id']}")
    page.get_by_role("button", name="Delete…").click()
    page.get_by_role("button", name="Delete model").click()
    web.allowed_errors.append("status of 409")
    expect(page.locator("#delete-message")).to_contain_text(job["id"])
    with client(stack.url, token) as c:
        assert c.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202
    page.get_by_role("button", name="Delete…").click()
    page.get_by_role("button", name="Delete model").click()
    page.wait_for_url("**/models")
    expect(page.get_by_text("No models yet.")).to_be_visible()
