"""A tune job and a train job with a preflight, through the SDK, the API, the runner and the
real engine (CPU, tiny): typed results, the page's table and button, the pre-filled form,
and a tune cancelled half-way that keeps what it measured."""

from __future__ import annotations

import threading
import time

import httpx
from testkit import make_user

from libreyolo_client import Client, Preflight, TuneReport

SMALL = {"imgsz": 64, "batch": 4, "workers": 0}


def _work(stack, job_id: str) -> threading.Thread:
    from worker.runner import run_job

    t = threading.Thread(target=run_job, args=(job_id,), daemon=True,
                         kwargs={"settings": stack.settings, "sessions": stack.sessions})
    t.start()
    return t


def test_tune_job_end_to_end(real_stack, sample_yaml):
    _, token = make_user(real_stack.sessions)
    with Client(real_stack.url, token) as c:
        job = c.tune("yolo9-t", sample_yaml, gpus=0, repeat=2, warmup=1, steps=2,
                     max_candidates=2, budget_s=600, **SMALL)
        assert job.info.tune["repeat"] == 2 and job.info.kind == "tune"
        progress = []
        worker = _work(real_stack, job.id)
        info = job.wait(timeout=600, on_event=lambda e: progress.append(e.data)
                        if e.name == "progress" else None)
        worker.join(60)
        assert info.status == "succeeded"
        assert progress and all(p["phase"] == "tuning" for p in progress)
        assert progress[0]["candidate"] == "baseline" and progress[0]["trial"] == 1
        report = job.tune
        assert isinstance(report, TuneReport) and report.status == "complete"
        assert report.baseline.n == 2 and report.baseline.img_per_s > 0
        assert report.answer and report.recommended_params["imgsz"] == 64
        assert "device" not in report.recommended_params  # the service sets it
        assert all(r.significant in (True, False) or r.note for r in report.candidates)
        assert "tune.json" in {a.path for a in job.artifacts()}

        page = httpx.get(job.page_url, headers={"Authorization": f"Bearer {token}"})
        assert page.status_code == 200
        assert 'id="tune-table"' in page.text and "Train with these settings" in page.text
        form = httpx.get(f"{real_stack.url}/jobs", params={"train_from": job.id},
                         headers={"Authorization": f"Bearer {token}"})
        assert "Pre-filled from tune job" in form.text and 'value="64"' in form.text


def test_tune_job_cancelled_half_way_keeps_what_it_measured(real_stack, sample_yaml):
    _, token = make_user(real_stack.sessions)
    with Client(real_stack.url, token) as c:
        job = c.tune("yolo9-t", sample_yaml, gpus=0, repeat=4, warmup=1, steps=2, **SMALL)
        worker = _work(real_stack, job.id)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            p = job.refresh().progress or {}
            if (p.get("trials_done") or 0) >= 1 or job.info.done:
                break
            time.sleep(0.3)
        job.cancel()
        info = job.wait(timeout=300, raise_on_failure=False)
        worker.join(60)
        assert info.status == "cancelled", info
        report = TuneReport.model_validate(info.result["tune"])
        assert report.status == "cancelled" and "cancelled" in report.answer
        assert report.trials_run >= 1 and report.recommended is None


def test_train_job_with_preflight_has_estimate_and_actual(real_stack, sample_yaml):
    _, token = make_user(real_stack.sessions)
    with Client(real_stack.url, token) as c:
        job = c.train("yolo9-t", sample_yaml, gpus=0, epochs=2, preflight=True, **SMALL)
        worker = _work(real_stack, job.id)
        info = job.wait(timeout=600)
        worker.join(60)
        assert info.status == "succeeded"
        pf = job.preflight
        assert isinstance(pf, Preflight)
        assert pf.img_per_s > 0 and pf.epoch_s > 0 and pf.total_s > pf.epoch_s
        assert pf.epochs == 2 and pf.peak_memory_mb and pf.cost is None  # no price, a CPU job
        assert pf.actual is not None and pf.actual.epochs == 2 and pf.actual.epoch_time_s > 0
        assert info.progress["preflight"]["total_s"] == pf.total_s
        names = {a.path for a in job.artifacts()}
        assert {"preflight.json", "preflight/profile.json"} <= names
        page = httpx.get(job.page_url, headers={"Authorization": f"Bearer {token}"})
        assert "Preflight estimate" in page.text and "actual" in page.text
