"""YOLOX through the trainer: the L1 switch at the mosaic boundary and resume across it."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from libreyolo_core import LibreYOLO
from libreyolo_core.engine.events import read_events
from libreyolo_core.engine.trainer import TrainingInterrupted

SWITCH = dict(imgsz=128, batch=8, epochs=4, no_aug_epochs=2, warmup_epochs=1, seed=3, mixup=0.0,
              eval_interval=100)


def _rows(run_dir: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(open(run_dir / "results.csv")))


class _MosaicSpy:
    """Wraps the train loader and records, per epoch, the ``mosaic`` flag of every sample
    the (possibly persistent) workers produced."""

    def __init__(self, trainer, seen: dict[int, list[bool]]):
        self.loader, self.trainer, self.seen = trainer.parts.train_loader, trainer, seen
        self.sampler = self.loader.sampler

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            self.seen.setdefault(self.trainer.state.epoch + 1, []).extend(m["mosaic"] for m in batch.metas)
            yield batch


def _spy(seen):
    def install(trainer):
        trainer.parts.train_loader = _MosaicSpy(trainer, seen)
    return install


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_l1_switch_and_mosaic_close_at_no_aug_boundary(sample_yaml, tmp_path, workers):
    seen: dict[int, list[bool]] = {}
    result = LibreYOLO("yolox-n").train(data=sample_yaml, project=tmp_path, workers=workers,
                                        callbacks={"on_train_start": [_spy(seen)]}, **SWITCH)
    run = Path(result["save_dir"])
    rows = _rows(run)
    assert [float(r["train/l1_loss"]) > 0 for r in rows] == [False, False, True, True]
    assert {"train/iou_loss", "train/obj_loss", "train/cls_loss", "train/l1_loss"} <= set(rows[0])
    events = read_events(run / "events.jsonl")
    ends = [e for e in events if e.event == "epoch_end"]
    assert [e.mosaic for e in ends] == [True, True, False, False]
    assert [e.losses["l1"] > 0 for e in ends] == [False, False, True, True]
    changed = [e for e in events if e.event == "captured_region_changed"]
    assert len(changed) == 1 and changed[0].epoch == 3
    # the loader workers produced mosaics before the boundary and none after it
    assert all(seen[1]) and all(seen[2]) and not any(seen[3]) and not any(seen[4])


@pytest.mark.slow
def test_resume_across_the_l1_boundary_keeps_l1_on(sample_yaml, tmp_path):
    def stop_after_three(trainer):
        if trainer.state.epoch + 1 == 3:
            trainer.request_stop("test stop")

    with pytest.raises(TrainingInterrupted):
        LibreYOLO("yolox-n").train(data=sample_yaml, project=tmp_path, name="cut", workers=0,
                                   callbacks={"on_epoch_end": [stop_after_three]}, **SWITCH)
    last = tmp_path / "cut" / "weights" / "last.pt"
    # as a user would: only the checkpoint, no model= or data= (both come from it)
    done = subprocess.run([sys.executable, "-m", "libreyolo_core.cli", "train", f"resume={last}"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _rows(tmp_path / "cut")
    assert [r["epoch"] for r in rows] == ["1", "2", "3", "4"]
    assert float(rows[3]["train/l1_loss"]) > 0
    events = read_events(tmp_path / "cut" / "events.jsonl")
    ends = [e for e in events if e.event == "epoch_end"]
    assert ends[-1].epoch == 4 and ends[-1].mosaic is False and ends[-1].losses["l1"] > 0
    # the resumed run announces the change again (a fresh process has a fresh graph)
    assert [e.epoch for e in events if e.event == "captured_region_changed"] == [3, 4]
