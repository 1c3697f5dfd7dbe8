"""The typed job results: ``tune.json`` (:class:`TuneRecord`) and a job's ``result``
(:class:`JobResult`) round-trip their JSON unchanged (key order too), read older files, and
the verdict has one name inside while the files keep their keys."""

from __future__ import annotations

import json

from libreyolo_core.profiler.record import ProfileRecord
from libreyolo_core.records.events import ProfileEvent, parse_event
from libreyolo_core.records.result import JobResult
from libreyolo_core.records.tune import TuneRecord

ROW = {"name": "baseline", "label": "baseline", "params": {}, "side_effect": None,
       "why": "the configuration as given", "img_per_s": 30.5, "img_per_s_std": 0.4, "n": 3,
       "img_per_s_trials": [30.0, 31, 30.5], "step_ms": 1049.2, "dataload_frac": 0.61,
       "verdict": "dataloader", "reliable": True, "other_cpu_frac": 0.02, "batch": 32,
       "epoch_s": 4.197, "significant": None, "gain": None, "gain_low": None,
       "separated": None, "load_bound": None, "environment": None, "recommendable": False,
       "note": None, "skipped": False, "profile": "trials/baseline/profile_repeat.json",
       "trials": ["trials/baseline_1/profile.json"]}
CANDIDATE = {**ROW, "name": "workers", "label": "workers 0 -> 2", "params": {"workers": 2},
             "img_per_s": 61.0, "significant": True, "gain": 1.0, "gain_low": 0.9,
             "separated": True, "load_bound": 31.2, "recommendable": True,
             "environment": {"may_explain": False, "note": "", "reasons": []},
             "note": "faster beyond noise"}
TUNE = {"schema": "libreyolo.tune/v1", "status": "complete", "device": "cpu",
        "verdict": "dataloader", "verdicts": ["dataloader", "dataloader", "dataloader"],
        "model": "yolo9-t", "data": "/d/coco128.yaml", "config": {"batch": 32},
        "train_images": 128, "window": {"warmup": 1, "steps": 3},
        "options": {"repeat": 3, "warmup": 1, "steps": 3, "max_candidates": 6,
                    "budget_s": 1800.0, "min_gain": 0.05},
        "baseline": ROW, "candidates": [CANDIDATE], "recommended": CANDIDATE,
        "recommended_params": {"batch": 32, "workers": 2}, "answer": "recommended: workers=2",
        "also": [], "expected_epoch_s": 2.1, "baseline_epoch_s": 4.197, "notes": [],
        "trials_run": 6, "elapsed_s": 80.1}


def _same(a: dict, b: dict) -> None:
    assert json.dumps(a) == json.dumps(b)  # the keys in the same order, the same values


def test_tune_json_round_trips_unchanged_and_reads_partial_files():
    rec = TuneRecord.of(json.loads(json.dumps(TUNE)))
    _same(rec.to_dict(), TUNE)
    assert rec.recommended is not None and rec.recommended.params == {"workers": 2}
    assert [r.name for r in rec.rows] == ["baseline", "workers"]
    newer = {**TUNE, "from_a_newer_version": 1}
    _same(TuneRecord.of(newer).to_dict(), newer)
    early = {"status": "budget", "baseline": {"name": "baseline"}}  # written mid-run
    assert TuneRecord.of(early).to_dict() == early


def test_a_job_result_round_trips_unchanged():
    profile = {"verdict": "dataloader", "bound_why": "data wait is 61%",
               "lever": {"verdict": "dataloader", "params": {"workers": 2}, "why": "w",
                         "also": []},
               "step_ms": 10.0, "img_per_s": 800.0, "memory_pressure": False,
               "window": {"warmup": 1}, "confidence": None, "load": None}
    row = {"status": "completed", "best_epoch": None, "metrics": {"mAP50": 0.1},
           "epochs_completed": 0, "names": None, "verdict": "dataloader",
           "bound_why": "data wait is 61%", "lever": profile["lever"], "profile": profile,
           "preflight": {"img_per_s": 10.0, "total_s": 20.0, "actual": {"epochs": 2,
                                                                          "wall_s": None}},
           "tune": TUNE, "answer": TUNE["answer"],
           "recommended_params": TUNE["recommended_params"]}
    res = JobResult.of(json.loads(json.dumps(row)))
    _same(res.to_dict(), row)
    assert res.tune is not None and res.tune.recommended is not None
    assert res.lever is not None and res.lever.params == {"workers": 2}
    assert res.profile is not None and res.profile.img_per_s == 800.0
    assert res.preflight is not None and res.preflight.actual is not None


def test_a_job_result_with_a_value_of_another_type_keeps_the_rest():
    res = JobResult.of({"status": "completed", "best_epoch": "three", "metrics": {"mAP50": 1}})
    assert res.best_epoch is None and res.metrics == {"mAP50": 1}
    assert JobResult.of(None).to_dict() == {}


def test_the_verdict_has_one_name_and_the_files_keep_their_keys():
    old = {"schema": "libreyolo.profile/v1", "bound": "compute", "trial_bounds": ["compute"]}
    rec = ProfileRecord.of(old)
    assert rec.verdict == "compute" and rec.trial_verdicts == ["compute"]
    assert rec.to_dict() == old
    assert ProfileRecord(verdict="dataloader").to_dict() == {"bound": "dataloader"}
    event = ProfileEvent(verdict="compute", bound_why="x", step_ms=1.0, window={}, load=None)
    line = event.to_dict()
    assert list(line) == ["event", "time", "verdict", "bound_why", "step_ms", "window", "load"]
    assert parse_event(line).to_dict() == line


def test_a_train_result_gives_back_the_dict_train_returns():
    """``LibreYOLO.train`` returns ``TrainResult.to_dict()``: the same keys, values and order
    as the trainer's dict, in process and through a spawned run's JSON (string class ids)."""
    from libreyolo_core.records.train import TrainResult

    run = {"precision": 0.5, "recall": 0.25, "mAP50": 0.4, "mAP50-95": 0.2,
           "per_class_AP": {0: 0.2}, "fitness": 0.22, "best_epoch": 2, "epochs_completed": 3,
           "save_dir": "runs/train/exp", "best_checkpoint": "runs/train/exp/weights/best.pt",
           "last_checkpoint": "runs/train/exp/weights/last.pt", "names": {0: "cat", 1: "dog"},
           "nonfinite_skipped": 0, "amp_skipped": 1, "timing": {"train_s": 1.5, "wall_s": None}}
    result = TrainResult.of(run)
    assert result.metrics["mAP50"] == 0.4 and result.best_epoch == 2 and result.profile is None
    assert list(result.to_dict().items()) == list(run.items())
    spawned = json.loads(json.dumps({**run, "preflight": {"img_per_s": 9.5}}, default=str))
    back = TrainResult.of(spawned).to_dict()
    assert list(back.items()) == list(spawned.items()) and back["names"] == {"0": "cat", "1": "dog"}
    profile_only = {k: v for k, v in run.items() if k not in ("precision", "recall", "mAP50", "mAP50-95",
                                                             "per_class_AP")}
    profile_only["profile"] = {"verdict": "compute"}
    assert list(TrainResult.of(profile_only).to_dict().items()) == list(profile_only.items())
