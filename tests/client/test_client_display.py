"""How a job reads in the SDK, the CLI and the page: progress while it trains and while it
validates, a profile job's lever."""

from __future__ import annotations

from types import SimpleNamespace

from libreyolo_client._progress import progress_text

TRAINING = {"phase": "training", "epoch": 2, "epochs": 3, "step": 5, "steps": 8, "eta_s": 40.0}
VALIDATING = {"phase": "validating", "epoch": 3, "epochs": 3, "val_batch": 2, "val_batches": 4,
              "step": 8, "steps": 8, "eta_s": 0.0}


def test_sdk_and_cli_text():
    assert progress_text(TRAINING) == "epoch 2/3  step 5/8  eta 40s"
    assert progress_text(VALIDATING) == "epoch 3/3  validating 2/4"


def test_page_text_and_the_jobs_list():
    from libreyolo_client._models import JobInfo
    from libreyolo_client.cli import _summary
    from service.web.views import job_progress

    job = SimpleNamespace(status="running", progress=VALIDATING, queue="cpu")
    assert job_progress(job)[1] == "epoch 3/3 · validating 2/4"
    job.progress = TRAINING
    assert job_progress(job)[1] == "epoch 2/3 · step 5/8 · ETA 40 s"  # the ETA of the progress
    info = JobInfo(id="j1", kind="train", model="yolo9-t", data="d.yaml", status="running",
                   progress=VALIDATING)
    assert _summary(info) == "epoch 3/3  validating 2/4"
    info.progress = {}
    assert _summary(info).startswith("starting")


PROFILING = {"phase": "profiling", "step": 7, "steps": 25, "warmup": 5, "measured": 20,
             "eta_s": 9.0}


def test_a_profile_job_shows_its_window_not_an_epoch():
    from libreyolo_client._models import JobInfo
    from libreyolo_client.cli import _summary
    from service.web.views import job_progress

    text = "profile window step 7/25 (5 warm-up + 20 measured)"
    assert progress_text(PROFILING) == text + "  eta 9s"
    job = SimpleNamespace(status="running", progress=PROFILING, queue="cpu")
    assert job_progress(job) == (28.0, text)
    info = JobInfo(id="j2", kind="profile", model="yolo9-t", data="d.yaml", status="running",
                   progress=PROFILING)
    assert _summary(info) == text + "  eta 9s"


def test_profile_lever_in_the_sdk_and_on_the_page():
    from libreyolo_client import Job
    from libreyolo_client._models import JobInfo
    from libreyolo_core.profiler.record import Lever
    from service.web.formatting import lever_text

    lever = {"verdict": "dataloader", "params": {"workers": 8, "cache": "ram"},
             "why": "the step waits for data", "also": ["lighter augmentation"]}
    info = JobInfo(id="j1", kind="profile", model="yolo9-t", data="d.yaml", status="succeeded",
                   result={"verdict": "dataloader", "lever": lever})
    assert Job(None, info).lever["params"] == {"workers": 8, "cache": "ram"}
    assert lever_text(Lever.model_validate(lever)) == ("try workers=8 cache=ram: the step waits for data; "
                                 "lighter augmentation")
    assert Job(None, info.model_copy(update={"result": {}})).lever == {}


def test_profile_confidence_on_the_page():
    from libreyolo_core.profiler.confidence import Confidence
    from service.web.formatting import confidence_text

    assert confidence_text(None) is None  # a profile from before confidence was recorded
    assert confidence_text(Confidence.from_dict({"reliable": True, "reasons": []}))[0] is True
    ok, text = confidence_text(Confidence.from_dict(
        {"reliable": False, "reasons": ["other processes took 54%"],
         "advice": "profile again with --repeat 3"}))
    assert not ok and text == ("unreliable: other processes took 54%. profile again with "
                               "--repeat 3")


TUNING = {"phase": "tuning", "candidate": "cache=ram", "candidate_index": 2, "candidates": 4,
          "trial": 1, "trials": 3, "trials_done": 7, "trials_planned": 15, "eta_s": 60.0}


def test_a_tune_job_shows_its_candidate_and_trial():
    from libreyolo_client._models import JobInfo
    from libreyolo_client.cli import _summary
    from service.web.views import job_progress

    assert progress_text(TUNING) == ("tuning cache=ram (candidate 2 of 4)  trial 1/3  "
                                     "7/15 trials done  eta 60s")
    job = SimpleNamespace(status="running", progress=TUNING, queue="cpu", result=None)
    pct, text = job_progress(job)
    assert round(pct) == 47 and text == ("tuning: cache=ram (candidate 2 of 4) · trial 1/3 · "
                                         "7 of 15 trials done")
    job.status, job.result = "succeeded", {"tune": {"trials_run": 15}}
    assert job_progress(job) == (100.0, "tune succeeded: 15 trials run")
    info = JobInfo(id="j3", kind="tune", model="yolo9-t", data="d.yaml", status="running",
                   progress=TUNING)
    assert _summary(info).startswith("tuning cache=ram")
    info.status, info.result = "succeeded", {"answer": "no significant lever on this device: x"}
    assert _summary(info) == "no significant lever on this device: x"


def test_preflight_actual_is_the_same_figure_in_the_cli_and_on_the_page():
    """#28.9: 21 s in the CLI and 53 s (the whole job) on the page."""
    from datetime import UTC, datetime, timedelta

    from libreyolo_client.cli import preflight_text
    from service.web.views import _preflight_view

    pf = {"img_per_s": 10.0, "epoch_s": 9.0, "total_s": 20.0, "epochs": 2,
          "actual": {"epochs": 2, "epoch_time_s": 9.5, "train_s": 19.0, "val_s": 2.0,
                     "wall_s": 30.0}}
    cli = preflight_text(pf)
    assert "total 21 s (training and validation; the engine ran 30 s in all)" in cli, cli
    now = datetime.now(UTC)
    job = SimpleNamespace(status="succeeded", started_at=now - timedelta(seconds=53),
                          finished_at=now)
    page = _preflight_view(job, pf)["total_actual"]
    assert page.startswith("21 s") and "the whole job 53 s" in page, page
