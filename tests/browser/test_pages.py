"""The browser pages in Debian's Chromium (Playwright): sign-in, jobs, one job, datasets.

Against a real service (uvicorn thread, SQLite) with worker threads running the fake
engine, and the real engine for one tiny profile job (its timeline.html). The ``web``
fixture fails a test on any console error or request to another origin.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
PHONE = {"width": 390, "height": 844}

if not CHROMIUM.exists():
    pytest.skip(f"{CHROMIUM} not installed (apt-get install chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api", reason="the playwright python package is missing")

from playwright.sync_api import expect  # noqa: E402
from testkit import client, wait_for  # noqa: E402

NO_INLINE_JS = """() => {
  const inline = [...document.querySelectorAll('script:not([src])')].length;
  const handlers = [...document.querySelectorAll('*')].flatMap(
    el => [...el.attributes].filter(a => /^on/i.test(a.name)).map(a => el.tagName + '@' + a.name));
  const styled = [...document.querySelectorAll('[style]')].length;
  return {inline, handlers, styled};
}"""


def _submit(stack, token: str, data: str, **body) -> dict:
    with client(stack.url, token) as c:
        r = c.post("/v1/jobs", json={"kind": "train", "model": "yolo9-t", "data": data,
                                     "gpus": 0, **body})
        assert r.status_code == 201, r.text
        return r.json()


def _status(stack, token: str, job_id: str) -> str:
    with client(stack.url, token) as c:
        return c.get(f"/v1/jobs/{job_id}").json()["status"]


def _no_inline_script(page) -> None:
    found = page.evaluate(NO_INLINE_JS)
    assert found == {"inline": 0, "handlers": [], "styled": 0}, found


def _fits_width(page) -> None:
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 1, f"page is {overflow}px wider than the viewport"


def test_sign_in_cookie_and_sign_out(web, stack, shot):
    _, token = stack.user()
    page = web.page()
    response = page.goto("/jobs")
    assert re.search(r"/signin\?next=%2Fjobs$", page.url)
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    _no_inline_script(page)

    web.allowed_errors.append("status of 401")  # the bad token below, on purpose
    page.get_by_label("API token").fill("not-a-token")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#token-error")).to_have_text("unknown or revoked token")
    expect(page.get_by_label("API token")).to_have_attribute("aria-invalid", "true")
    shot(page, "signin-error")

    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/jobs")
    cookie = next(c for c in page.context.cookies() if c["name"] == "libreyolo_token")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert page.evaluate("document.cookie") == ""  # HttpOnly: invisible to scripts
    expect(page.get_by_role("heading", name="Jobs", exact=True)).to_be_visible()

    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/signin")
    assert not [c for c in page.context.cookies() if c["name"] == "libreyolo_token"]
    page.goto("/datasets")
    assert "/signin" in page.url


def test_submit_from_the_form_then_watch_log_and_curves(web, stack, shot, data_yaml):
    _, token = stack.user()
    page = web.page(token)
    _no_inline_script(page)
    page.get_by_label("Dataset").fill(data_yaml)
    page.get_by_label("Epochs").fill("4")
    page.get_by_label("Advanced parameters").fill("lr0: 0.02\nmosaic: 0.5\n")
    page.get_by_role("button", name="Submit job").click()
    expect(page.locator("#form-ok")).to_contain_text("Submitted job")
    job_id = page.locator("#form-ok a").inner_text()
    row = page.locator(f'#job-rows tr[data-job-id="{job_id}"]')
    expect(row).to_be_visible()
    expect(row).to_contain_text("queued")
    with client(stack.url, token) as c:
        job = c.get(f"/v1/jobs/{job_id}").json()
    assert job["params"] == {"epochs": 4, "lr0": 0.02, "mosaic": 0.5}
    assert job["nodes"] == 1  # the Nodes field's default
    shot(page, "jobs-submitted")

    stack.run(job_id, FAKE_EPOCH_S="1.2", FAKE_STEPS="3")
    expect(row).to_contain_text("running", timeout=10_000)  # auto-refresh of the table

    page.locator(f"#job-rows a[href='/jobs/{job_id}']").click()
    page.wait_for_url(f"**/jobs/{job_id}")
    _no_inline_script(page)
    expect(page.locator("#stream-state")).to_have_text("live")
    expect(page.locator("#log")).to_contain_text("epoch 1 step 1/3")
    loss = page.locator("#loss-chart path.series")
    expect(loss).to_have_count(1, timeout=10_000)  # first epoch_end drew the curve
    first = loss.get_attribute("d")
    expect(page.locator("#map-chart path.series")).to_have_count(2)
    expect(page.locator("#map-legend")).to_contain_text("mAP50-95")
    shot(page, "job-running")
    expect(loss).not_to_have_attribute("d", first, timeout=10_000)  # grew live
    assert loss.get_attribute("d").count("L") >= 1
    expect(page.locator("#status-badge")).to_have_text("succeeded", timeout=15_000)
    expect(page.locator("#stream-state")).to_contain_text("finished")
    result = page.locator(".result-card")
    expect(result).to_contain_text("Best epoch")
    expect(result).to_contain_text("0.4000")  # mAP50 of epoch 4
    expect(page.locator("#log")).to_contain_text("done")
    expect(page.locator("#log")).to_contain_text("run ended: succeeded")
    log = page.locator("#log").inner_text()
    # the engine's last lines come before the 'run ended' line, which comes before the job's
    assert log.index("done") < log.index("run ended") < log.index("job succeeded"), log
    assert page.locator("#map-chart circle").count() == 8
    artifacts = page.locator("table.artifacts")
    expect(artifacts).to_contain_text("weights/last.pt")
    href = artifacts.get_by_role("link", name="results.csv").get_attribute("href")
    assert href == f"/v1/jobs/{job_id}/artifacts/results.csv"
    assert page.request.get(href).text() == "epoch,mAP50\n"  # the cookie authenticates it
    page.locator("#curves-title").scroll_into_view_if_needed()
    shot(page, "job-succeeded")



def test_live_log_resumes_after_the_service_restarts(web, stack, data_yaml):
    """The stream drops (API restart) mid-run: the page reconnects and every log line and
    epoch arrives exactly once."""
    _, token = stack.user()
    job = _submit(stack, token, data_yaml, params={"epochs": 5})
    stack.run(job["id"], FAKE_EPOCH_S="0.8", FAKE_STEPS="2")
    page = web.page(token)
    page.goto(f"/jobs/{job['id']}")
    expect(page.locator("#log")).to_contain_text("epoch 2 step 1/2", timeout=10_000)
    # the cut stream and the refused reconnects are logged by Chromium; expected here
    web.allowed_errors += ["ERR_", "/events/stream", "status of 50"]
    stack.restart(down_s=1.0)
    expect(page.locator("#status-badge")).to_have_text("succeeded", timeout=20_000)
    expect(page.locator("#stream-state")).to_contain_text("finished")
    log = page.locator("#log").inner_text()
    for epoch in range(1, 6):
        for step in (1, 2):
            assert log.count(f"epoch {epoch} step {step}/2") == 1, log
    expect(page.locator("#map-chart circle")).to_have_count(10)


def test_validation_errors_next_to_their_field(web, stack, shot, data_yaml):
    _, token = stack.user()
    page = web.page(token)
    page.get_by_label("Dataset").fill(data_yaml)
    page.get_by_label("Epochs").fill("0")
    page.get_by_role("button", name="Submit job").click()
    error = page.locator("#epochs-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("epochs")
    expect(page.get_by_label("Epochs")).to_have_attribute("aria-invalid", "true")
    expect(page.get_by_label("Epochs")).to_be_focused()
    shot(page, "jobs-validation-error")

    page.get_by_label("Epochs").fill("2")
    page.get_by_label("Advanced parameters").fill("lr0: [1, 2\n")
    page.get_by_role("button", name="Submit job").click()
    expect(page.locator("#params-error")).to_contain_text("not valid YAML")
    expect(page.locator("#epochs-error")).to_be_hidden()

    page.get_by_label("Advanced parameters").fill("no_such_key: 1\n")
    page.get_by_role("button", name="Submit job").click()
    expect(page.locator("#params-error")).to_contain_text("no_such_key")

    page.get_by_label("Advanced parameters").fill("")
    page.get_by_label("Dataset").fill("/nowhere/data.yaml")
    page.get_by_role("button", name="Submit job").click()
    expect(page.locator("#data-error")).to_contain_text("does not exist")

    page.get_by_label("Dataset").fill(data_yaml)
    page.get_by_label("Nodes").fill("17")
    page.get_by_role("button", name="Submit job").click()
    expect(page.locator("#nodes-error")).to_contain_text("max_nodes=16")
    expect(page.get_by_label("Nodes")).to_be_focused()

    page.get_by_label("Nodes").fill("1")
    page.get_by_label("Model").fill("yolo9-zz")
    page.get_by_role("button", name="Submit job").click()
    expect(page.locator("#model-error")).to_be_visible()
    expect(page.locator("#nodes-error")).to_be_hidden()
    with client(stack.url, token) as c:
        assert c.get("/v1/jobs").json()["data"] == []  # nothing was queued
    # the API's 422 responses are logged by Chromium as failed resource loads
    web.allowed_errors.append("status of 422")


def test_filters_cancel_and_error_tail(web, stack, shot, data_yaml):
    _, token = stack.user()
    long_job = _submit(stack, token, data_yaml, params={"epochs": 50})
    failing = _submit(stack, token, data_yaml, params={"epochs": 2})
    stack.run(long_job["id"], FAKE_EPOCH_S="2")
    stack.run(failing["id"], FAKE_EXIT="3")
    wait_for(lambda: _status(stack, token, failing["id"]) == "failed", what="failed job")
    wait_for(lambda: _status(stack, token, long_job["id"]) == "running", what="running job")

    page = web.page(token)
    page.get_by_label("Status").select_option("failed")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**/jobs?status=failed*")
    rows = page.locator("#job-rows tr[data-job-id]")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-job-id", failing["id"])

    page.goto(f"/jobs/{failing['id']}")
    card = page.locator(".error-card")
    expect(card).to_contain_text("exit code 3")
    expect(card.locator("pre")).to_contain_text("fatal: something broke in the data")
    expect(page.locator("#cancel-button")).to_have_count(0)
    shot(page, "job-failed")

    page.goto(f"/jobs/{long_job['id']}")
    page.get_by_role("button", name="Cancel job…").click()
    dialog = page.locator("#cancel-dialog")
    expect(dialog).to_be_visible()
    dialog.get_by_role("button", name="Keep it running").click()
    expect(dialog).to_be_hidden()
    time.sleep(0.3)
    assert _status(stack, token, long_job["id"]) == "running"
    page.get_by_role("button", name="Cancel job…").focus()
    page.keyboard.press("Enter")  # keyboard works as well as the mouse
    dialog.get_by_role("button", name="Cancel job", exact=True).click()
    expect(page.locator("#cancel-message")).to_contain_text("Cancel")
    expect(page.locator("#status-badge")).to_have_text("cancelled", timeout=15_000)
    expect(page.locator("#cancel-button")).to_have_count(0)
    # #28.9: an ended job keeps no "ETA" (live, and after a reload)
    expect(page.locator("#live-progress-text")).not_to_contain_text("ETA")
    page.reload()
    expect(page.locator("#live-progress-text")).not_to_contain_text("ETA")


def test_profile_job_verdict_and_timeline(web, stack, shot, sample_yaml):
    """One real (tiny) profile job on the CPU: the verdict card and the real timeline."""
    _, token = stack.user()
    job = _submit(stack, token, str(sample_yaml), kind="profile", params={
        "imgsz": 64, "batch": 4, "workers": 0, "epochs": 2, "profile_warmup": 1,
        "profile_steps": 3})
    stack.run(job["id"], real=True).join(120)
    assert _status(stack, token, job["id"]) == "succeeded"
    with client(stack.url, token) as c:
        result = c.get(f"/v1/jobs/{job['id']}").json()["result"]
    lever = result["lever"]  # the lever as data, next to the verdict
    assert lever["verdict"] == result["verdict"] and lever["why"] and "params" in lever

    page = web.page(token)
    page.goto(f"/jobs/{job['id']}")
    card = page.locator(".verdict-card")
    expect(card).to_contain_text("Bottleneck:")
    expect(card).to_contain_text("Why:")
    expect(card).to_contain_text("Lever to pull:")
    expect(card).to_contain_text(lever["why"])
    expect(card).to_contain_text("step time")
    expect(card).to_contain_text("Confidence:")  # reliable or not, with the reasons
    expect(page.locator("table.artifacts")).to_contain_text("profile.json")
    shot(page, "job-profile")
    with page.context.expect_page() as popup_info:
        card.get_by_role("link", name="Open timeline").click()
    timeline = popup_info.value
    timeline.wait_for_load_state()
    assert timeline.url.endswith(f"/v1/jobs/{job['id']}/artifacts/timeline.html")
    assert timeline.locator("canvas").count() >= 1
    time.sleep(0.5)
    shot(timeline, "timeline")


def test_second_user_cannot_see_the_first_users_job(web, stack, data_yaml):
    _, token_a = stack.user()
    _, token_b = stack.user()
    job = _submit(stack, token_a, data_yaml, params={"epochs": 1})
    page_a = web.page(token_a)
    expect(page_a.locator(f'#job-rows tr[data-job-id="{job["id"]}"]')).to_be_visible()

    page = web.page(token_b)
    expect(page.locator("#job-rows")).to_contain_text("No jobs yet")
    assert job["id"] not in page.content()
    web.allowed_errors.append("status of 404")
    response = page.goto(f"/jobs/{job['id']}")
    assert response.status == 404
    expect(page.get_by_role("heading", name="Job not found")).to_be_visible()
    for url in (f"/v1/jobs/{job['id']}", f"/v1/jobs/{job['id']}/events",
                f"/web/jobs/{job['id']}/summary", f"/v1/jobs/{job['id']}/logs"):
        assert page.request.get(url).status == 404, url
    # cookie-authenticated POST from this origin reaches the API, and is still refused
    status = page.evaluate("""async (id) => (await fetch('/v1/jobs/' + id + '/cancel',
        {method: 'POST', credentials: 'same-origin'})).status""", job["id"])
    assert status == 404
    assert _status(stack, token_a, job["id"]) == "queued"


def test_datasets_page_shows_scan_reports(web, stack, shot, tmp_path):
    from service.db.models import Dataset, User

    name, token = stack.user()
    split = {"source": "images/train", "images": 128, "usable": 126, "backgrounds": 2,
             "missing_labels": 0, "boxes": 929, "classes_named": 80, "classes_present": 71,
             "class_counts": {"person": 254, "car": 46},
             "defects": {"out_of_range": 3, "duplicate": 1, "bad_class": 0},
             "skipped": [{"image": "a.jpg", "reason": "corrupt"}], "orphan_labels": []}
    with stack.sessions() as s:
        user_id = s.query(User).filter_by(name=name).one().id
        s.add(Dataset(owner_id=user_id, name="coco128", path=str(tmp_path / "coco128.yaml"),
                      source="upload", status="ready",
                      report={"ok": True, "exit_code": 0, "splits": {"train": split}}))
        s.add(Dataset(owner_id=user_id, name="shared-coco", path="/data/coco/data.yaml",
                      source="register", status="ready", report=None))
        s.commit()
    page = web.page(token)
    page.get_by_role("link", name="Datasets").click()
    page.wait_for_url("**/datasets")
    _no_inline_script(page)
    scan = page.locator("table.scan")
    expect(scan).to_contain_text("929")
    expect(scan).to_contain_text("71 / 80")
    expect(scan.locator(".defect-hit")).to_have_text(["out_of_range: 3", "duplicate: 1"])
    expect(page.get_by_text("Registered path: not scanned here")).to_be_visible()
    shot(page, "datasets")

    shared = page.locator("section.dataset", has_text="shared-coco")
    shared.get_by_role("button", name="Delete").click()
    page.get_by_role("button", name="Delete dataset").click()
    expect(shared).to_have_count(0)
    expect(page.locator("section.dataset", has_text="coco128")).to_have_count(1)
    page.reload()
    expect(page.locator("section.dataset")).to_have_count(1)


def test_phone_width_pages_fit(web, stack, shot, data_yaml):
    _, token = stack.user()
    job = _submit(stack, token, data_yaml, params={"epochs": 2})
    stack.run(job["id"]).join(30)
    page = web.page(token, viewport=PHONE)
    _fits_width(page)
    shot(page, "phone-jobs")
    page.goto(f"/jobs/{job['id']}")
    expect(page.locator("#status-badge")).to_have_text("succeeded")
    expect(page.locator("#map-chart path.series")).to_have_count(2)
    _fits_width(page)
    shot(page, "phone-job")



ONE_LINE_COMMANDS = """() => [...document.querySelectorAll('main code, main pre')].map(el => {
  const range = document.createRange();
  range.selectNodeContents(el);
  const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
  return [el.textContent.trim(), tops.size];
})"""


@pytest.mark.parametrize("viewport", [None, PHONE], ids=["laptop", "phone"])
def test_signin_page_never_breaks_a_command(web, shot, viewport):
    page = web.page(viewport=viewport)
    page.goto("/signin")
    commands = page.evaluate(ONE_LINE_COMMANDS)
    assert "libreyolo-service token create --name you" in [c for c, _ in commands]
    assert all(lines == 1 for _, lines in commands), commands
    _fits_width(page)
    shot(page, f"signin-{'phone' if viewport else 'laptop'}")


def test_queued_jobs_show_their_place_in_the_queue(web, stack, shot, data_yaml):
    """With a live CPU worker (its heartbeat row) the jobs table says where each queued job
    stands; the job page says it too, and refreshes it while the job waits."""
    from service.db.models import WorkerRow

    _, token = stack.user()
    jobs = [_submit(stack, token, data_yaml, params={"epochs": 1}) for _ in range(2)]
    with stack.sessions() as s:
        s.add(WorkerRow(name="browser-queue-test", host="h", pid=1, queues=["cpu"], gpus=0))
        s.commit()
    try:
        with client(stack.url, token) as c:
            places = [c.get(f"/v1/jobs/{j['id']}").json()["queue_position"] for j in jobs]
        assert places[1] == places[0] + 1
        page = web.page(token)
        page.goto("/jobs")
        row = page.locator(f'tr[data-job-id="{jobs[1]["id"]}"]')
        expect(row.locator(".cell-progress")).to_contain_text(re.compile(
            r"(next|\d+(st|nd|rd|th)) in queue"))
        shot(page, "jobs-queued")
        page.goto(f"/jobs/{jobs[1]['id']}")
        place = page.locator("#queue-place")
        expect(place).to_contain_text(re.compile(r"in queue"))
        before = place.inner_text()
        shot(page, "job-queued")
        with client(stack.url, token) as c:  # the first leaves the queue: the page follows
            c.post(f"/v1/jobs/{jobs[0]['id']}/cancel")
        expect(place).not_to_have_text(before, timeout=20_000)
        expect(place).to_contain_text(re.compile(r"in queue"))
    finally:
        with client(stack.url, token) as c:
            for j in jobs:
                c.post(f"/v1/jobs/{j['id']}/cancel")
        with stack.sessions() as s:
            s.query(WorkerRow).filter_by(name="browser-queue-test").delete()
            s.commit()


def test_tune_job_table_and_train_with_these_settings(web, stack, shot, sample_yaml):
    """One real (tiny) tune job on the CPU: its table on the page, and the button that
    pre-fills the submit form with the settings to train with, which then submits."""
    _, token = stack.user()
    job = _submit(stack, token, str(sample_yaml), kind="tune",
                  params={"imgsz": 64, "batch": 4, "workers": 0, "epochs": 3},
                  tune={"repeat": 2, "warmup": 1, "steps": 2, "max_candidates": 2})
    stack.run(job["id"], real=True).join(300)
    assert _status(stack, token, job["id"]) == "succeeded"
    with client(stack.url, token) as c:
        tune = c.get(f"/v1/jobs/{job['id']}").json()["result"]["tune"]

    page = web.page(token)
    page.goto(f"/jobs/{job['id']}")
    card = page.locator(".tune-card")
    expect(card.locator("#tune-answer")).to_contain_text(tune["answer"][:40])
    table = card.locator("#tune-table")
    expect(table.locator("tbody tr")).to_have_count(1 + len(tune["candidates"]))
    expect(table.locator("tbody tr").first).to_contain_text("baseline")
    expect(table).to_contain_text(f"{tune['baseline']['img_per_s']:.1f}")
    expect(card).to_contain_text("Expected epoch time")
    shot(page, "job-tune")
    card.get_by_role("link", name="Train with these settings").click()
    page.wait_for_url(f"**/jobs?train_from={job['id']}*")
    expect(page.locator("#prefill-note")).to_contain_text(job["id"])
    expect(page.locator("#f-model")).to_have_value("yolo9-t")
    expect(page.locator("#f-data")).to_have_value(str(sample_yaml))
    expect(page.locator("#f-imgsz")).to_have_value("64")
    expect(page.locator("#f-batch")).to_have_value(str(tune["recommended_params"]["batch"]))
    expect(page.locator("#f-epochs")).to_have_value("3")
    assert page.locator('input[name="kind"][value="train"]').is_checked()
    workers = tune["recommended_params"]["workers"]
    expect(page.locator("#f-params")).to_have_value(re.compile(rf"workers: {workers}"))
    _no_inline_script(page)
    page.get_by_role("button", name="Submit job").click()
    expect(page.locator("#form-ok")).to_contain_text("Submitted job")
    new_id = page.locator("#form-ok a").inner_text()
    with client(stack.url, token) as c:
        submitted = c.get(f"/v1/jobs/{new_id}").json()
    assert submitted["kind"] == "train"
    assert {k: submitted["params"][k] for k in tune["recommended_params"]} == \
        tune["recommended_params"]


def test_multi_node_job_shows_its_nodes_and_world_size(web, stack, shot):
    """A 2-node CPU job put in the database and gathered by the real gang code: the jobs
    table says "2 nodes × 1 CPU rank"; the job page shows the world size and each node's
    worker, the gang's log line, and follows the start live (the log names the nodes)."""
    from sqlalchemy import select
    from testkit import queued_job, take_node

    from service.db.models import User

    name, token = stack.user()
    with stack.sessions() as s:
        owner = s.scalar(select(User.id).where(User.name == name))
    job_id = queued_job(stack.sessions, owner, nodes=2)
    single = queued_job(stack.sessions, owner)
    take_node(stack.sessions, job_id, "w-a", "10.0.0.1")
    try:
        page = web.page(token)
        page.goto("/jobs")
        expect(page.locator(f'tr[data-job-id="{job_id}"] .nodes-text')).to_have_text(
            "2 nodes × 1 CPU rank")
        expect(page.locator(f'tr[data-job-id="{single}"] .nodes-text')).to_have_count(0)
        shot(page, "jobs-multi-node")

        page.goto(f"/jobs/{job_id}")
        expect(page.locator("#world-size")).to_have_text("2 ranks")
        expect(page.locator("#nodes-note")).to_contain_text("1 of 2 nodes claimed")
        table = page.locator("#nodes-table")
        expect(table.locator('tr[data-node-rank="0"]')).to_contain_text("w-a")
        expect(table.locator('tr[data-node-rank="0"]')).to_contain_text("host-w-a (10.0.0.1)")
        expect(table.locator('tr[data-node-rank="1"]')).to_contain_text("waiting for a worker")
        expect(page.locator("#log")).to_contain_text("node 0 of 2 claimed by w-a")
        shot(page, "job-multi-node-gathering")

        take_node(stack.sessions, job_id, "w-b", "10.0.0.2")  # the last slot: it starts
        expect(page.locator("#status-badge")).to_have_text("running")
        expect(page.locator("#live-progress-text")).to_have_text("starting")
        expect(page.locator("#log")).to_contain_text(
            "job running on 2 nodes (world size 2): node 0 w-a (10.0.0.1), "
            "node 1 w-b (10.0.0.2); rendezvous 10.0.0.1:29500")
        expect(page.locator("#nodes-note")).to_have_text("2 nodes, world size 2, attempt 1.")
        expect(table.locator('tr[data-node-rank="1"]')).to_contain_text("w-b")
        expect(table.locator('tr[data-node-rank="1"]')).to_contain_text("running")
        _no_inline_script(page)
        shot(page, "job-multi-node-running")

        page.goto(f"/jobs/{single}")
        expect(page.locator("#devices")).to_have_text("CPU · queue cpu")
        expect(page.locator("#nodes-table")).to_have_count(0)
        expect(page.locator("#world-size")).to_have_count(0)
    finally:
        with client(stack.url, token) as c:
            for j in (job_id, single):
                c.post(f"/v1/jobs/{j}/cancel")
