"""The training profiler's hook (``profile=True``): its window, its progress, its end.

The trainer calls the profiler itself only through :meth:`Trainer.phase
<libreyolo_core.engine.trainer.Trainer.phase>` (``to_device``, ``forward``, ``backward``,
``optimizer``, ``ema``) and ``wrap_loader``; :class:`ProfilerHook` closes each step
(``step_end``), reports a profile-only run's window and, when the window is over, writes
its artifacts and drops the profiler (``trainer.profiler = None``: the loop takes no
detour after it). Without ``profile`` neither this hook nor a profiler exists, so the step
path makes no profiler call. Rank 0 of a single-device run only: the profiler does not run
under DDP.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from libreyolo_core.engine.hooks import HookBase
from libreyolo_core.engine.progress import progress_bar
from libreyolo_core.records.events import ArtifactEvent, ProfileEvent, ProgressEvent

__all__ = ["ProfilerHook", "build_profiler"]

log = logging.getLogger(__name__)


def build_profiler(cfg: Any, parts: Any, *, dist: Any, device: torch.device, title: str,
                   epochs_done: int) -> Any:
    """The run's :class:`~libreyolo_core.profiler.TrainingProfiler`, or None under DDP
    (rank 0 warns). The window stays inside the first epoch this run trains
    (``epochs_done``: epochs a resumed checkpoint completed).

    Raises:
        ProfileWindowError: one epoch cannot hold the window's steps.
    """
    if dist.enabled:
        if dist.is_main:
            log.warning("profile: the training profiler does not run under DDP; ignored "
                        "(profile a single-device run instead)")
        return None
    from libreyolo_core.profiler import TrainingProfiler

    epochs_left = cfg.epochs - epochs_done
    return TrainingProfiler(
        cfg, device=device, batch=parts.batch, accumulate=parts.accumulate,
        steps_available=len(parts.train_loader) if epochs_left > 0 else 0,
        images=len(parts.train_set), nbs=cfg.nbs,
        meta={"model": title, "device": str(device), "batch": parts.batch, "imgsz": cfg.imgsz,
              "amp": parts.amp.enabled, "amp_dtype": parts.amp.name, "workers": parts.train_loader.num_workers,
              "loader": cfg.loader,
              "cuda_graph": cfg.cuda_graph, "world_size": 1, "torch": torch.__version__},
    )


class ProfilerHook(HookBase):
    """Closes each step of the profile window; a profile-only run (``profile_then_stop``)
    reports the window (step k of ``warmup + steps``) instead of the epoch and stops when
    it is over."""

    def __init__(self) -> None:
        self.window = False  # this epoch reports the window (a profile-only run)
        self.bar = None
        self._last_report = 0.0  # when the window's progress was last reported

    def before_epoch(self) -> None:
        t = self.trainer
        self.window = t.profiler is not None and t.cfg.profile_then_stop
        self.bar = progress_bar(t.profiler.window.total, "profile window") if self.window else None

    def after_step(self, finite: bool) -> bool:
        t = self.trainer
        prof = t.profiler
        if prof is None:
            return False
        if not finite:  # a skipped step still closes its window step
            if prof.step_end():
                self.finish()
            return False
        done, total = prof.position[0] + 1, prof.window.total
        finished = prof.step_end()
        if self.window:
            self._window_progress(prof, done, total, last=finished)
        if not finished:
            return False
        self.finish()
        return t.stop_requested

    def after_train_epoch(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def finish(self) -> None:
        """The window is over: write its artifacts, drop the profiler, go on (or stop)."""
        t = self.trainer
        prof, t.profiler = t.profiler, None
        summary = prof.finish(t.run_dir)
        for path, kind in summary.get("artifacts", {}).items():
            t.events.write(ArtifactEvent(path=path, kind=kind))
        t.events.write(ProfileEvent(**{k: v for k, v in summary.items() if k != "artifacts"}))
        t.profile_summary = summary
        if t.cfg.profile_then_stop:
            log.info("profile-only run: stopping after the profile window")
            t.profile_only = True
            t.request_stop("profile_then_stop")

    def _window_progress(self, prof: Any, done: int, total: int, last: bool) -> None:
        """Progress of a profile-only run: the window, step ``done`` of ``warmup + steps``.

        A ``progress`` event ``{phase: "profiling", step, steps, warmup, measured, eta_s,
        img_per_s, losses}`` (no epoch: the run never leaves the first one) at the first
        and last step, the end of the warm-up, every ``log_interval`` steps and at least
        every ``PROGRESS_EVERY_S``; the same as a printed line when stderr is no terminal, a
        tqdm bar when it is."""
        from libreyolo_core.engine import progress

        t, m = self.trainer, self.trainer.meter
        losses = m.mean()
        now = time.perf_counter()
        elapsed = now - m.t_start
        if self.bar is not None:
            self.bar.set_postfix({**{k: f"{v:.3f}" for k, v in losses.items()},
                                  "img/s": f"{m.images / max(elapsed, 1e-9):.1f}"})
            self.bar.update(1)
            if last:
                self.bar.close()
        warmup = prof.window.warmup
        due = (done in (1, warmup) or last or done % t.cfg.log_interval == 0
               or now - self._last_report >= progress.PROGRESS_EVERY_S)
        if not due:
            return
        self._last_report = now
        eta = (total - done) * elapsed / done
        ips = m.images / max(elapsed, 1e-9)
        stage = "warm-up" if done <= warmup else "measured"
        t.events.write(ProgressEvent(phase="profiling", step=done, steps=total, warmup=warmup,
                                     measured=total - warmup, eta_s=round(eta, 1),
                                     img_per_s=round(ips, 2), losses=losses))
        if self.bar is None:
            print(f"profile window step {done}/{total} ({stage}; {warmup} warm-up + "
                  f"{total - warmup} measured) " + " ".join(f"{k}={v:.4f}" for k, v in losses.items())
                  + f" {ips:.1f} img/s eta {eta:.0f}s", flush=True)
