"""The job page's validation report in Debian's Chromium: the plots, the sortable
per-class table, the gallery filtered by class with FP and FN marked; the files are
artifacts of the job, and the SDK's ``job.report()`` reads the same table typed.

The report is the engine's own (:func:`libreyolo_core.eval.report.write_report` on
constructed detections over real pictures), written into the job's run directory before
the (fake) engine runs, so the worker records its files as it records every artifact.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(f"{CHROMIUM} not installed (apt-get install chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api", reason="the playwright python package is missing")

from playwright.sync_api import expect  # noqa: E402
from testkit import client  # noqa: E402

NAMES = {0: "person", 1: "bicycle", 2: "dog", 3: "cow"}  # no cow anywhere: "no instances"


def _write_report(run_dir: Path) -> dict:
    """Six pictures with boxes; person found well, bicycle half, dog missed and confused."""
    from PIL import Image, ImageDraw

    from libreyolo_core.eval.coco import ImageDetections, ImageTargets, coco_metrics
    from libreyolo_core.eval.report import write_report
    from libreyolo_core.eval.validate import ValPredictions

    pics = run_dir.parent / "pics"
    pics.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    dets, tgts, paths = [], [], []
    for i in range(6):
        w, h = 480, 320
        im = Image.new("RGB", (w, h), tuple(int(v) for v in rng.integers(90, 200, 3)))
        d = ImageDraw.Draw(im)
        gt = np.array([[30, 40, 150, 290], [200, 120, 330, 260], [360, 60, 460, 200]], float)
        cls = np.array([0, 1, 2]) if i % 2 == 0 else np.array([0, 0, 1])
        for b in gt:
            d.rectangle(list(b), fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
        im.save(pics / f"{100 + i}.jpg")
        paths.append(str(pics / f"{100 + i}.jpg"))
        tgts.append(ImageTargets(gt, cls, w, h))
        jitter = rng.normal(0, 4, gt.shape)
        pred_b = np.concatenate([gt[:2] + jitter[:2], [[40, 10, 120, 60]]])
        pred_c = np.array([cls[0], cls[1] if i % 3 else 2, 2])  # a wrong class now and then, a stray dog
        dets.append(ImageDetections(pred_b, np.array([0.92, 0.61, 0.44]), pred_c))
    kept = ValPredictions(dets, tgts, paths, coco_metrics(dets, tgts, len(NAMES), detail=True))
    labels = [np.array([[c, (b[0] + b[2]) / 960, (b[1] + b[3]) / 640, (b[2] - b[0]) / 480, (b[3] - b[1]) / 320]
                        for b, c in zip(t.boxes, t.classes, strict=True)]) for t in tgts]
    return write_report(run_dir / "val", kept, NAMES, plot_images=6, train_labels=labels, meta={"epoch": 3})


def test_job_page_shows_the_report(web, stack, shot, data_yaml):
    from service.storage import ArtifactStore

    _, token = stack.user()
    with client(stack.url, token) as c:
        r = c.post("/v1/jobs", json={"kind": "train", "model": "yolo9-t", "data": data_yaml, "gpus": 0})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
    report = _write_report(ArtifactStore(stack.settings.artifact_root).run_dir(job_id))
    stack.run(job_id).join(60)
    with client(stack.url, token) as c:
        assert c.get(f"/v1/jobs/{job_id}").json()["status"] == "succeeded"
        listed = {a["path"]: a for a in c.get(f"/v1/jobs/{job_id}/artifacts").json()["data"]}
        png = c.get(f"/v1/jobs/{job_id}/artifacts/val/PR_curve.png")
    # every file of the report is an artifact, listed with the others (sha256 recorded)
    for rel in list(report["files"].values()) + [im["file"] for im in report["images"]]:
        assert f"val/{rel}" in listed and listed[f"val/{rel}"]["sha256"], rel
    assert png.headers["content-type"] == "image/png" and png.headers["content-disposition"].startswith("inline")

    page = web.page(token)
    page.goto(f"/jobs/{job_id}")
    card = page.locator("#report")
    expect(card).to_be_visible()
    expect(page.locator("#report-lede")).to_contain_text("Epoch 3")
    # the plots: seven pictures, each decoded by the browser
    imgs = page.locator("#report-plots img")
    expect(imgs).to_have_count(7)
    for k in range(7):
        imgs.nth(k).scroll_into_view_if_needed()
        page.wait_for_function("img => img.complete && img.naturalWidth > 300", arg=imgs.nth(k).element_handle())
    page.locator("#report-plots").screenshot(path=str(_shots() / "report_plots.png"))
    # the table: "all" first, every class, cow marked; sorting by mAP50 puts the best first
    rows = page.locator("#report-table tbody tr")
    expect(rows).to_have_count(5)
    expect(rows.nth(0)).to_contain_text("all")
    expect(page.locator("#report-table tr.no-instances")).to_contain_text("cow (no instances)")
    sort_map50 = page.get_by_role("button", name="mAP50", exact=True)
    sort_map50.click()
    sort_map50 = page.locator('#report-table button.sort[data-key="mAP50"]')  # its name has an arrow now
    expect(page.locator("#report-table th[aria-sort=descending]")).to_contain_text("mAP50")
    table = {r["class"]: r for r in report["table"]}
    best = max((r for r in report["table"][1:] if not r["no_instances"]), key=lambda r: r["mAP50"])
    expect(rows.nth(1).locator("th")).to_have_text(best["class"])
    expect(rows.nth(4)).to_contain_text("cow")  # no instances: always last
    sort_map50.click()
    expect(page.locator("#report-table th[aria-sort=ascending]")).to_contain_text("mAP50")
    sort_map50.click()
    assert rows.nth(1).locator("td").nth(4).inner_text() == f"{table[best['class']]['mAP50']:.3f}"
    page.locator("#report-table").screenshot(path=str(_shots() / "report_table_sorted.png"))
    # the gallery: six pictures; a class filter, FP / FN marked
    figs = page.locator("#report-gallery figure")
    expect(figs).to_have_count(6)
    expect(page.locator("#report-gallery .mark-fp").first).to_be_visible()
    expect(page.locator("#report-gallery .mark-fn").first).to_be_visible()
    page.select_option("#report-class", "dog")
    with_dog = [im for im in report["images"] if "dog" in im["classes"]]
    expect(figs).to_have_count(len(with_dog))
    expect(page.locator("#report-count")).to_have_text(f"{len(with_dog)} of 6 pictures")
    page.select_option("#report-class", "")
    page.select_option("#report-errors", "errors")
    expect(figs).to_have_count(sum(1 for im in report["images"] if im["fp"] or im["fn"]))
    page.select_option("#report-errors", "")
    page.select_option("#report-class", "bicycle")
    gallery = page.locator("#report-gallery")
    gallery.scroll_into_view_if_needed()
    for k in range(figs.count()):
        page.wait_for_function("img => img.complete && img.naturalWidth > 600",
                               arg=figs.nth(k).locator("img").element_handle())
    page.locator(".report-filter").scroll_into_view_if_needed()
    page.locator("#report").screenshot(path=str(_shots() / "report_card_bicycle.png"))
    shot(page, "report_job_page")
    styled = page.evaluate("[...document.querySelectorAll('[style]')].length")
    assert styled == 0  # the pages' rule: no inline style
    # a narrow screen: no sideways scroll
    phone = web.page(token, viewport={"width": 390, "height": 844})
    phone.goto(f"/jobs/{job_id}")
    expect(phone.locator("#report")).to_be_visible()
    assert phone.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 1
    first = phone.locator("#report-gallery figure").first
    first.scroll_into_view_if_needed()
    phone.wait_for_function("img => img.complete && img.naturalWidth > 600", arg=first.locator("img").element_handle())
    first.screenshot(path=str(_shots() / "report_phone_picture.png"))

    # the SDK reads the same table, typed
    from libreyolo_client import Client, ValReport

    with Client(stack.url, token) as sdk:
        typed = sdk.job(job_id).report()
    assert isinstance(typed, ValReport)
    assert typed.row("all").mAP50 == report["metrics"]["mAP50"]
    assert typed.row("cow").no_instances and typed.row("cow").mAP50_95 is None
    assert typed.row("person").mAP50_95 == table["person"]["mAP50-95"]
    assert len(typed.pr_curve["recall"]) == 101 and len(typed.images) == 6


def test_job_without_a_report_hides_the_section(web, stack, data_yaml):
    _, token = stack.user()
    with client(stack.url, token) as c:
        r = c.post("/v1/jobs", json={"kind": "train", "model": "yolo9-t", "data": data_yaml, "gpus": 0})
        job_id = r.json()["id"]
    stack.run(job_id).join(60)
    page = web.page(token)
    page.goto(f"/jobs/{job_id}")
    expect(page.locator("#status-badge")).to_have_text("succeeded")
    page.wait_for_timeout(500)
    expect(page.locator("#report")).to_be_hidden()  # and no 404 in the console (the web fixture)


def _shots() -> Path:
    # not `from conftest import SHOTS`: in the whole suite that name is another folder's conftest
    shots = Path(__file__).resolve().parent / "screenshots"
    shots.mkdir(exist_ok=True)
    return shots
