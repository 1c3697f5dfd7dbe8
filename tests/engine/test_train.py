"""Real training runs on CPU: run directory, resume equivalence, SIGTERM, overfitting."""

from __future__ import annotations

import csv
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from libreyolo_core import LibreYOLO
from libreyolo_core.engine.checkpoint import load_checkpoint
from libreyolo_core.engine.events import read_events
from libreyolo_core.engine.trainer import TrainingInterrupted

#: imgsz 64: nothing here depends on the image size (files, rows, events, resume equality,
#: signals), and 64 costs a quarter of 128's compute
FAST = dict(imgsz=64, batch=8, workers=0, warmup_epochs=1, no_aug_epochs=1, seed=3, lr0=0.01)


def _rows(run_dir: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(open(run_dir / "results.csv")))


@pytest.mark.slow
def test_run_directory_contents(sample_yaml, tmp_path):
    result = LibreYOLO("yolo9-t").train(data=sample_yaml, epochs=2, project=tmp_path, **FAST)
    run = Path(result["save_dir"])
    assert run == tmp_path / "exp"
    assert result["names"][0] == "circle" and set(result["per_class_AP"]) <= set(result["names"])
    assert {p.name for p in run.iterdir()} >= {"args.yaml", "results.csv", "events.jsonl", "weights"}
    assert (run / "weights" / "last.pt").is_file() and (run / "weights" / "best.pt").is_file()
    rows = _rows(run)
    assert [r["epoch"] for r in rows] == ["1", "2"]
    assert {"train/box_loss", "train/dfl_loss", "train/cls_loss", "metrics/mAP50", "metrics/mAP50-95",
            "metrics/precision", "metrics/recall", "lr", "epoch_time_s"} <= set(rows[0])
    kinds = [e.event for e in read_events(run / "events.jsonl")]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end"
    assert kinds.count("epoch_end") == 2 and "progress" in kinds and "artifact" in kinds
    ckpt = torch.load(run / "weights" / "last.pt", weights_only=True)
    assert ckpt["model_family"] == "yolo9" and ckpt["nc"] == 4 and ckpt["epoch"] == 1
    assert yaml.safe_load((run / "args.yaml").read_text())["epochs"] == 2
    # a second run does not overwrite the first
    again = LibreYOLO("yolo9-t").train(data=sample_yaml, epochs=1, project=tmp_path, **FAST)
    assert Path(again["save_dir"]).name == "exp2"
    # the trained checkpoint rebuilds through the facade and predicts
    model = LibreYOLO(run / "weights" / "best.pt")
    assert model.nc == 4 and model.names[0] == "circle"
    preds = model.predict(str(Path(sample_yaml).parent / "images" / "val"), conf=0.0)
    assert len(preds) == 8 and all(p.boxes.shape[1] == 4 for p in preds)


@pytest.mark.slow
def test_resume_reproduces_the_uninterrupted_run(sample_yaml, tmp_path, caplog):
    full = LibreYOLO("yolo9-t").train(data=sample_yaml, epochs=3, project=tmp_path, name="full", **FAST)

    def stop_after_two(trainer):
        if trainer.state.epoch + 1 == 2:
            trainer.request_stop("test stop")

    with pytest.raises(TrainingInterrupted):
        LibreYOLO("yolo9-t").train(data=sample_yaml, epochs=3, project=tmp_path, name="cut",
                                   callbacks={"on_epoch_end": [stop_after_two]}, **FAST)
    last = tmp_path / "cut" / "weights" / "last.pt"
    assert load_checkpoint(last)["epoch"] == 1
    with caplog.at_level(logging.INFO, logger="libreyolo_core"):
        LibreYOLO("yolo9-t").train(data=sample_yaml, resume=str(last))
    assert re.search(r"resuming .*last.pt from epoch 3 at lr=[0-9.e-]+ \(step \d+ of the \w+ schedule\)",
                     caplog.text), caplog.text[-2000:]
    a, b = _rows(Path(full["save_dir"])), _rows(tmp_path / "cut")
    assert len(a) == len(b) == 3
    for key in ("train/box_loss", "train/dfl_loss", "train/cls_loss", "metrics/mAP50", "metrics/mAP50-95"):
        assert float(a[2][key]) == pytest.approx(float(b[2][key]), abs=1e-4), key
    events = read_events(tmp_path / "cut" / "events.jsonl")
    ends = [e.status for e in events if e.event == "run_end"]
    assert ends == ["interrupted", "succeeded"]
    assert "changed on resume" not in caplog.text  # same epochs: nothing to say
    # the finished run resumed once more: nothing trained, its 3 epochs still counted
    model = LibreYOLO("yolo9-t")
    again = model.train(data=sample_yaml, resume=str(last))
    assert again["epochs_completed"] == 3 and len(_rows(tmp_path / "cut")) == 3
    assert model.imgsz == FAST["imgsz"]  # the run's imgsz, not the default 640


def test_resume_with_more_epochs_says_what_it_does_to_the_schedule(sample_yaml, tmp_path, caplog):
    """#28.11 (a public bug report): a changed epochs= was applied silently."""
    def stop_after_one(trainer):
        trainer.request_stop("test stop")

    with pytest.raises(TrainingInterrupted):
        LibreYOLO("yolo9-t").train(data=sample_yaml, epochs=2, project=tmp_path, name="cut",
                                   callbacks={"on_epoch_end": [stop_after_one]}, **FAST)
    last = tmp_path / "cut" / "weights" / "last.pt"
    with caplog.at_level(logging.INFO, logger="libreyolo_core"):
        LibreYOLO("yolo9-t").train(data=sample_yaml, resume=str(last), epochs=3)
    assert re.search(r"epochs 2 -> 3 \(changed on resume\): the \w+ schedule is laid out again "
                     r"over 3 epochs, so the learning rate continues at [0-9.e-]+ \(step \d+\) "
                     r"and reaches its final value at epoch 3 instead of 2", caplog.text), \
        caplog.text[-2000:]
    assert len(_rows(tmp_path / "cut")) == 3


@pytest.mark.slow
def test_sigterm_saves_last_and_exits_143_then_resumes(sample_yaml, tmp_path):
    cmd = [sys.executable, "-m", "libreyolo_core.cli", "train", "model=yolo9-t", f"data={sample_yaml}",
           "epochs=50", "imgsz=64", "batch=4", "workers=0", f"project={tmp_path}", "log_interval=1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    events = tmp_path / "exp" / "events.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline:
        if events.is_file() and sum(e.event == "epoch_end" for e in read_events(events)) >= 1:
            break
        time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("no epoch finished in time:\n" + proc.stdout.read()[-2000:])
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out[-2000:]
    run_end = [e for e in read_events(events) if e.event == "run_end"][-1]
    assert run_end.status == "interrupted"
    ckpt = load_checkpoint(tmp_path / "exp" / "weights" / "last.pt")
    done = ckpt["epoch"] + 1
    assert done >= 1
    resumed = subprocess.run([sys.executable, "-m", "libreyolo_core.cli", "train", "model=yolo9-t",
                              f"resume={tmp_path / 'exp' / 'weights' / 'last.pt'}", f"epochs={done + 1}"],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    rows = _rows(tmp_path / "exp")
    assert [int(r["epoch"]) for r in rows] == list(range(1, done + 2))


@pytest.mark.slow
def test_progress_is_time_throttled_and_validation_reports_its_own_phase(sample_yaml, tmp_path,
                                                                        monkeypatch, capsys, caplog):
    """A log_interval longer than the epoch no longer means silence: progress comes at least
    every PROGRESS_EVERY_S (0 here: every step), and validation reports 'validating k/n'."""
    from libreyolo_core.engine import progress

    monkeypatch.setattr(progress, "PROGRESS_EVERY_S", 0.0)
    caplog.set_level("INFO", logger="libreyolo_core.engine")
    LibreYOLO("yolo9-t").train(data=sample_yaml, epochs=1, project=tmp_path, log_interval=1000,
                               **{**FAST, "batch": 4})
    events = read_events(tmp_path / "exp" / "events.jsonl")
    training = [e for e in events if e.event == "progress" and e.phase == "training"]
    assert [e.step for e in training] == [1, 2, 3, 4]  # 16 images / batch 4, every step
    validating = [e for e in events if e.event == "progress" and e.phase == "validating"]
    assert [(e.val_batch, e.val_batches) for e in validating] == [(1, 2), (2, 2)]
    assert all(e.epoch == 1 and e.epochs == 1 for e in validating)
    kinds = [e.event for e in events]
    assert kinds.index("epoch_end") > max(i for i, e in enumerate(events) if getattr(e, "phase", None) == "validating")
    assert "epoch 1/1 validating 2/2" in capsys.readouterr().out
    assert "mosaic and mixup off for the last epoch" in caplog.text  # not "last 1 epochs"
