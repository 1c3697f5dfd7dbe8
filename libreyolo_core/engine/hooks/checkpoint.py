"""Checkpoints and ``results.csv`` after every epoch, ``last.pt`` on an interrupt (rank 0)."""

from __future__ import annotations

import csv
import io
import math
import os
import shutil

from libreyolo_core.engine import fence
from libreyolo_core.engine.checkpoint import lean_state, save_checkpoint
from libreyolo_core.engine.hooks.base import HookBase
from libreyolo_core.records.events import ArtifactEvent

__all__ = ["CheckpointHook"]


class CheckpointHook(HookBase):
    """Rank 0: ``weights/last.pt`` after every epoch (``best.pt`` too when best, lean;
    ``epoch_N.pt`` every ``save_period`` epochs) and ``results.csv``; on an interrupt,
    ``last.pt`` of the last completed epoch."""

    def after_epoch(self) -> None:
        out = self.trainer.outcome
        self.save(out.epoch, out.is_best)
        self._write_results()
        self.trainer.events.write(ArtifactEvent(path="results.csv", kind="results"))

    def on_interrupt(self) -> None:
        self.save(self.trainer.state.epoch - 1, is_best=False, periodic=False)

    def save(self, epoch: int, is_best: bool, periodic: bool = True) -> None:
        """``last.pt`` (+ ``best.pt`` when best); ``epoch_N.pt`` every ``save_period``
        completed epochs unless ``periodic`` is False (an interrupt's save, whose ``epoch``
        is the last completed one, -1 when none was)."""
        t = self.trainer
        state = t.state.checkpoint(epoch, t.parts, meta=t.meta(), config=t.cfg.model_dump(mode="json"))
        weights = t.run_dir / "weights"
        last = save_checkpoint(state, weights / "last.pt")
        t.events.write(ArtifactEvent(path="weights/last.pt", kind="checkpoint"))
        if is_best:  # lean: the EMA weights in float16 and the metadata, no training state
            save_checkpoint(lean_state(state), weights / "best.pt")
            t.events.write(ArtifactEvent(path="weights/best.pt", kind="checkpoint"))
        if periodic and t.cfg.save_period and (epoch + 1) % t.cfg.save_period == 0:
            fence.check(f"checkpoint epoch_{epoch + 1}.pt")
            shutil.copyfile(last, weights / f"epoch_{epoch + 1}.pt")

    def _write_results(self) -> None:
        history, run_dir = self.trainer.state.history, self.trainer.run_dir
        if not history:
            return
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(history[-1].keys()), extrasaction="ignore")
        writer.writeheader()
        for row in history:
            writer.writerow({k: ("" if isinstance(v, float) and not math.isfinite(v) else v)
                             for k, v in row.items()})
        tmp = run_dir / ".results.csv.tmp"
        fence.check("results.csv")  # an attempt given up writes nothing
        tmp.write_text(buf.getvalue(), encoding="utf-8")
        fence.check("results.csv", leftover=tmp)
        os.replace(tmp, run_dir / "results.csv")
