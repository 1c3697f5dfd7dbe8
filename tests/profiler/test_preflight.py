"""Preflight: the estimate's arithmetic on a made-up trial, the ETA rule, and one real CPU
training run with ``preflight=True`` (its files, its event, its result)."""

from __future__ import annotations

import json

import pytest

from libreyolo_core.engine.eta import eta, validations_left
from libreyolo_core.profiler.preflight import (
    Phase,
    PreflightEstimate,
    estimate,
    gpu_hour_price,
    phases_of,
)


def trial(device: str = "cpu", steps=(100.0, 110.0, 90.0), first_fetch=500.0,
          fetch: float = 10.0) -> dict:
    """A trial's profile.json: one warm-up step (first fetch ``first_fetch`` ms), then the
    measured steps (wall ms, each waiting ``fetch`` ms for data)."""
    rec = [{"index": 0, "kind": "warmup", "wall_ms": 800.0, "dataload_ms": first_fetch}]
    rec += [{"index": i + 1, "kind": "unsynced" if i < 2 else "synced", "wall_ms": w,
             "dataload_ms": fetch} for i, w in enumerate(steps)]
    return {"device_type": device, "step_ms": 105.0, "steps": rec, "bound": "compute",
            "confidence": {"reliable": True}, "window": {"warmup": 1, "steps": len(steps)}}


def test_the_estimate_is_steps_times_step_plus_first_fetch_plus_validation():
    est = estimate([Phase("mosaic", 10, trial())], train_images=130, batch=16, validations=10,
                   val_s=2.0, setup_s=3.0)
    # a CPU step is the mean of every measured step (none is synchronised there): 100 ms
    assert est.step_ms == pytest.approx(100.0) and est.img_per_s == pytest.approx(160.0)
    assert est.steps_per_epoch == 8  # 130 // 16: the partial batch is dropped
    assert est.first_fetch_s == pytest.approx(0.49)  # 500 ms first fetch - 10 ms a step
    assert est.epoch_s == pytest.approx(8 * 0.1 + 0.49)
    assert est.total_s == pytest.approx(3.0 + 10 * (0.8 + 0.49) + 10 * 2.0)
    assert est.gpus == 0 and est.cost is None and est.gpu_hours is None
    back = PreflightEstimate.from_dict(json.loads(est.to_json()))
    assert back == est


def test_on_a_gpu_the_unsynced_steps_count_and_a_price_gives_the_cost():
    est = estimate([Phase("mosaic", 2, trial("cuda"))], train_images=32, batch=16,
                   validations=0, val_s=None, setup_s=0.0, price=3.6, currency="EUR")
    assert est.step_ms == 105.0 and est.gpus == 1
    assert est.gpu_hours == pytest.approx(est.total_s / 3600, rel=1e-3)
    assert est.cost == pytest.approx(est.gpu_hours * 3.6, abs=1e-4) and est.currency == "EUR"
    assert "EUR" in est.summary_line()
    cpu = estimate([Phase("mosaic", 2, trial())], train_images=32, batch=16, validations=0,
                   val_s=None, setup_s=0.0, price=3.6)
    assert cpu.cost is None and any("no GPU hours" in n for n in cpu.notes)


def test_mosaic_and_no_mosaic_epochs_are_timed_apart():
    assert phases_of(300, 15, 1.0, 1.0) == [("mosaic", 285), ("no mosaic", 15)]
    assert phases_of(10, 15, 1.0, 0.0) == [("no mosaic", 10)]
    assert phases_of(10, 2, 0.0, 0.0) == [("no mosaic", 10)]
    est = estimate([Phase("mosaic", 3, trial(steps=(200.0,) * 3)),
                    Phase("no mosaic", 2, trial(steps=(100.0,) * 3))],
                   train_images=160, batch=16, validations=0, val_s=None, setup_s=0.0)
    assert est.epochs == 5 and est.epoch_s == pytest.approx(10 * 0.2 + 0.49)
    assert est.total_s == pytest.approx(3 * (2.0 + 0.49) + 2 * (1.0 + 0.49))
    assert [p["name"] for p in est.phases] == ["mosaic", "no mosaic"]


def test_a_no_mosaic_step_is_never_slower_than_a_mosaic_one():
    """Less loading and the same compute cannot be slower: the load changed between the
    trials, so the mosaic trial's step bounds the no-mosaic phase (with a note)."""
    est = estimate([Phase("mosaic", 3, trial(steps=(200.0,) * 3)),
                    Phase("no mosaic", 2, trial(steps=(450.0,) * 3))],
                   train_images=160, batch=16, validations=0, val_s=None, setup_s=0.0)
    assert [p["step_ms"] for p in est.phases] == [200.0, 200.0]
    assert any("load changed between them" in n for n in est.notes)


def test_the_price_comes_from_the_environment():
    assert gpu_hour_price({}) == (None, "USD")
    assert gpu_hour_price({"LIBREYOLO_GPU_HOUR_PRICE": "2.5", "LIBREYOLO_CURRENCY": "EUR"}) == (2.5, "EUR")
    assert gpu_hour_price({"LIBREYOLO_GPU_HOUR_PRICE": "free"})[0] is None


def test_eta_uses_measured_epochs_and_validations():
    # before any epoch completed: this epoch's pace for every epoch, the preflight's validation
    first = eta(step=2, steps=10, elapsed_s=4.0, epochs_after=3, validations=4,
                val_estimate_s=5.0)
    assert first.seconds == pytest.approx(8 * 2.0 + 3 * 20.0 + 4 * 5.0)
    assert first.basis == "this epoch + preflight validation"
    # later: the mean of the last three measured epochs and validations
    later = eta(step=5, steps=10, elapsed_s=10.0, epochs_after=2, validations=3,
                train_s=[40.0, 22.0, 20.0, 18.0], val_s=[6.0, 4.0, 5.0, 6.0], val_estimate_s=50.0)
    assert later.seconds == pytest.approx(5 * 2.0 + 2 * 20.0 + 3 * 5.0)
    assert later.basis == "measured epochs"
    assert validations_left(0, 10, 3, True) == 4  # epochs 3, 6, 9 and the last
    assert validations_left(5, 10, 1, False) == 0


def test_a_training_run_with_preflight_writes_its_estimate(small_yaml, tmp_path):
    """One real CPU run (24 images at batch 4, 2 epochs): the trial, preflight.json, the event,
    the result, the measured epoch times beside it."""
    from libreyolo_core.engine.events import read_events
    from libreyolo_core.facade import LibreYOLO

    res = LibreYOLO("yolo9-t").train(data=str(small_yaml), epochs=2, imgsz=64, batch=4, workers=0,
                                     device="cpu", preflight=True, project=str(tmp_path), name="pf",
                                     no_aug_epochs=1)
    run = tmp_path / "pf"
    pf = json.loads((run / "preflight.json").read_text())
    assert pf["steps_per_epoch"] == 6 and pf["epochs"] == 2 and pf["validations"] == 2
    assert [p["name"] for p in pf["phases"]] == ["mosaic", "no mosaic"]
    assert pf["img_per_s"] > 0 and pf["total_s"] > pf["epoch_s"] > 0 and pf["val_s"] > 0
    assert pf["peak_memory_mb"] > 0 and pf["memory_kind"] == "process RSS high-water mark"
    assert (run / "preflight" / "profile.json").is_file()
    assert (run / "preflight" / "trial_no_mosaic" / "profile.json").is_file()
    assert not (run / "preflight" / "weights" / "last.pt").exists()
    events = read_events(run / "events.jsonl")
    assert [e.total_s for e in events if e.event == "preflight"] == [pf["total_s"]]
    ends = [e for e in events if e.event == "epoch_end"]
    assert [e.epoch for e in ends] == [1, 2] and all(e.val_time_s > 0 for e in ends)
    assert ends[-1].eta_s == 0.0
    assert res["preflight"]["total_s"] == pf["total_s"] and res["timing"]["epochs"] == 2
    run_end = next(e for e in events if e.event == "run_end")
    assert run_end.timing["epoch_time_s"] > 0
