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


@pytest.mark.parametrize("width", [1280, 1920])
def test_jobs_list_fits_and_names_the_model_not_its_file(web, stack, shot, tmp_path, width):
    """#28.8: at 1400 px the columns right of Dataset were cut off, and a job started from
    a model id showed the server's file path in its Model cell."""
    from testkit import write_data_yaml

    _, token = stack.user()
    weights = write_weights(tmp_path / "shapes.pt")
    # a long dataset path, as a real one is
    deep = tmp_path / "a-rather-long-folder-name-for-datasets" / "customer-project-2026-q4"
    data = str(write_data_yaml(deep / "images-of-the-production-line-camera-3"))
    with client(stack.url, token) as c:
        m = c.post("/v1/models", params={"name": "shapes-v1-finetuned-on-line-3"},
                   content=weights.read_bytes(), timeout=180).json()
        job = c.post("/v1/jobs", json={"model": m["id"], "data": data, "gpus": 0,
                                       "params": {"epochs": 1, "imgsz": 64}}).json()
    page = web.page(token, viewport={"width": width, "height": 900})
    row = page.locator(f'tr[data-job-id="{job["id"]}"]')
    model_cell = row.locator('td[data-label="Model"]')
    expect(model_cell).to_have_text(f"shapes-v1-finetuned-on-line-3 ({m['id']})")
    assert str(stack.settings.model_root) not in page.content()
    # every column is inside the table's box and the viewport: nothing to scroll to
    fit = page.evaluate("""() => {
      const wrap = document.querySelector('.table-wrap');
      const last = document.querySelector('.jobs-table thead th:last-child').getBoundingClientRect();
      return {scroll: wrap.scrollWidth - wrap.clientWidth, right: last.right, vw: window.innerWidth};
    }""")
    assert fit["scroll"] <= 1 and fit["right"] <= fit["vw"], fit
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 1, overflow
    shot(page, f"jobs-{width}")
    with client(stack.url, token) as c:
        c.post(f"/v1/jobs/{job['id']}/cancel")
