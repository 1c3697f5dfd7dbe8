"""Rank 0's run reports: ``run_start``, training ``progress`` with its ETA, ``epoch_end``
and ``run_end`` events, with their printed lines or tqdm bars (:mod:`~libreyolo_core.engine.progress`
throttles them), and the preflight's files in the run directory."""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from libreyolo_core.engine import progress as reports
from libreyolo_core.engine.eta import Eta, validations_left
from libreyolo_core.engine.eta import eta as estimate_eta
from libreyolo_core.engine.hooks.base import HookBase
from libreyolo_core.records.events import (
    ArtifactEvent,
    EpochEndEvent,
    PreflightEvent,
    ProgressEvent,
    RunEndEvent,
    RunStartEvent,
)

__all__ = ["ProgressHook"]


class ProgressHook(HookBase):
    """Rank 0's reports: ``run_start`` (+ the header line and the preflight's files),
    training ``progress`` with ETA, ``epoch_end`` (+ the epoch's line) and ``run_end``
    (then the event log is closed). A profile-only run's window reports itself
    (:class:`~libreyolo_core.engine.hooks.profile.ProfilerHook`)."""

    def __init__(self) -> None:
        self.bar: Any = None
        self.quiet = False  # another hook reports this epoch (a profile-only run's window)

    def before_train(self) -> None:
        t = self.trainer
        t.events.write(RunStartEvent(
            config=t.cfg.model_dump(mode="json"), run_dir=str(t.run_dir.resolve()),
            start_epoch=t.state.start_epoch + 1, device=str(t.device), amp=t.parts.amp.name,
            world_size=t.dist.world_size, batch=t.parts.batch))
        ddp = f" x {t.dist.world_size} ranks ({t.dist.backend})" if t.dist.enabled else ""
        layout = ", channels-last" if t.parts.memory_format is torch.channels_last else ""
        print(f"{t.family.title}-{t.size} nc={t.nc} on {t.device}{ddp} ({t.parts.amp.name}{layout}), "
              f"imgsz={t.cfg.imgsz} batch={t.parts.batch} accumulate={t.parts.accumulate}, "
              f"{len(t.parts.train_set)} train images -> {t.run_dir}", flush=True)
        if t.preflight is not None:
            self._record_preflight()

    def before_epoch(self) -> None:
        t = self.trainer
        self.quiet = t.quiet_progress
        self.bar = None if self.quiet else reports.progress_bar(len(t.parts.train_loader),
                                                        f"epoch {t.state.epoch + 1}/{t.cfg.epochs}")

    def after_step(self, finite: bool) -> None:
        t, m = self.trainer, self.trainer.meter
        if not finite or self.quiet:
            return
        i, nb = m.step, m.steps
        now = time.perf_counter()
        report = (i + 1) % t.cfg.log_interval == 0 or i + 1 == nb or now - m.last_report >= reports.PROGRESS_EVERY_S
        if self.bar is None and not report:
            return
        elapsed = now - m.t_start
        ips = m.images / max(elapsed, 1e-9)
        mean = m.mean()
        eta = self.eta(t.state.epoch, i + 1, nb, elapsed).seconds
        if self.bar is not None:
            self.bar.set_postfix({**{k: f"{v:.3f}" for k, v in mean.items()}, "img/s": f"{ips:.1f}"})
            self.bar.update(1)
        if report:
            m.last_report = now
            t.events.write(ProgressEvent(
                phase="training", epoch=t.state.epoch + 1, epochs=t.cfg.epochs, step=i + 1,
                steps=nb, eta_s=round(eta, 1), img_per_s=round(ips, 2), losses=mean))
            if self.bar is None:
                print(f"epoch {t.state.epoch + 1}/{t.cfg.epochs} step {i + 1}/{nb} "
                      + " ".join(f"{k}={v:.4f}" for k, v in mean.items())
                      + f" {ips:.1f} img/s eta {eta:.0f}s", flush=True)

    def after_train_epoch(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def after_epoch(self) -> None:
        t, out = self.trainer, self.trainer.outcome
        metrics = t.state.metrics
        t.events.write(EpochEndEvent(
            epoch=out.epoch + 1, epochs=t.cfg.epochs, losses=out.losses,
            metrics={k: v for k, v in metrics.items() if k != "per_class_AP"}
            if out.validated else {}, lr=out.lr, epoch_time_s=out.epoch_time_s,
            val_time_s=out.val_time_s, fitness=out.fitness, is_best=out.is_best,
            mosaic=t.parts.train_set.mosaic_enabled,
            eta_s=round(self.eta(out.epoch + 1, 0, 1, 0.0).seconds, 1)))
        parts = [f"epoch {out.epoch + 1}/{t.cfg.epochs}"] + [f"{k}={v:.4f}" for k, v in out.losses.items()]
        if out.validated:
            parts += [f"P={metrics.get('precision', 0):.3f}", f"R={metrics.get('recall', 0):.3f}",
                      f"mAP50={metrics.get('mAP50', 0):.4f}", f"mAP50-95={metrics.get('mAP50-95', 0):.4f}"]
        print("  ".join(parts), flush=True)

    def after_train(self) -> None:
        t, st = self.trainer, self.trainer.state
        t.events.write(RunEndEvent(status=t.status, best_epoch=st.best_epoch,
                                   metrics=st.best_metrics or st.metrics, error=t.error,
                                   names=t.names, nonfinite_skipped=st.nonfinite_skipped,
                                   timing=t.timing(),
                                   **({"data": t.parts.data_summary} if t.parts.data_summary else {})))
        t.events.close()

    def eta(self, epoch: int, done: int, nb: int, elapsed: float) -> Eta:
        """Time left (:func:`~libreyolo_core.engine.eta.eta`) at step ``done`` of ``nb`` of
        epoch ``epoch`` (0-based); ``done == 0``: epoch ``epoch`` has not started."""
        t, cfg = self.trainer, self.trainer.cfg
        validates = bool(cfg.val and t.parts.val_loader is not None)
        after = cfg.epochs - epoch - (0 if done == 0 else 1)
        return estimate_eta(step=done, steps=nb, elapsed_s=elapsed, epochs_after=after,
                            validations=validations_left(epoch, cfg.epochs, cfg.eval_interval, validates),
                            train_s=t.state.train_s, val_s=t.state.val_s,
                            val_estimate_s=getattr(t.preflight, "val_s", None))

    def _record_preflight(self) -> None:
        """Move the preflight trial into ``<run>/preflight/``, write ``preflight.json`` and
        emit the ``preflight`` event."""
        t = self.trainer
        pf = t.preflight
        src = Path(pf.trial_dir) if pf.trial_dir else None
        dst = t.run_dir / "preflight"
        if src is not None and src.is_dir() and src.resolve() != dst.resolve():
            shutil.rmtree(dst, ignore_errors=True)
            shutil.move(str(src), str(dst))
            if src.parent.name.startswith("libreyolo-preflight-"):  # its temporary folder
                with contextlib.suppress(OSError):
                    src.parent.rmdir()
            pf = pf.moved_to(dst)
            t.preflight = pf
        (t.run_dir / "preflight.json").write_text(pf.to_json(), encoding="utf-8")
        t.events.write(ArtifactEvent(path="preflight.json", kind="preflight"))
        for name, kind in (("profile.json", "profile"), ("timeline.html", "timeline")):
            if (dst / name).is_file():
                t.events.write(ArtifactEvent(path=f"preflight/{name}", kind=kind))
        t.events.write(PreflightEvent(**pf.to_dict()))
        print(pf.summary_line(), flush=True)
