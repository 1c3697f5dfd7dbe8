"""The training profiler's hook (``profile=True``): its window, its progress, its end.

The run's :class:`~libreyolo_core.profiler.window.TrainingProfiler` (built with the run,
:func:`~libreyolo_core.engine.profile_hook.build_profiler`) reaches the step through two
seams only: this hook's :meth:`~ProfilerHook.wrap_loader` (the loader hook point) and the
trainer's phase timer (``trainer.timer``, :mod:`~libreyolo_core.engine.timer`), which this hook
sets to the profiler for the window. The hook closes each step (``step_end``), reports a
profile-only run's window and, when the window is over, writes its artifacts and puts the
null timer back (the loop takes no detour after it). Without ``profile`` neither this hook
nor a profiler exists, so the step path makes no profiler call. Rank 0 of a single-device
run only: the profiler does not run under DDP.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from libreyolo_core.engine import progress
from libreyolo_core.engine.hooks.base import HookBase
from libreyolo_core.engine.timer import NULL_TIMER
from libreyolo_core.records.events import ArtifactEvent, ProfileEvent, ProgressEvent

if TYPE_CHECKING:
    from libreyolo_core.profiler.window import TrainingProfiler

__all__ = ["ProfilerHook"]

log = logging.getLogger(__name__)


class ProfilerHook(HookBase):
    """Closes each step of the profile window; a profile-only run (``profile_then_stop``)
    reports the window (step k of ``warmup + steps``) instead of the epoch and stops when
    it is over."""

    def __init__(self) -> None:
        self.profiler: TrainingProfiler | None = None  # while the window is open
        self.window = False  # this epoch reports the window (a profile-only run)
        self.bar: Any = None
        self._last_report = 0.0  # when the window's progress was last reported

    def before_train(self) -> None:
        t = self.trainer
        self.profiler = t.run.profiler
        if self.profiler is not None:
            t.timer = self.profiler

    def before_epoch(self) -> None:
        t = self.trainer
        self.window = self.profiler is not None and t.cfg.profile_then_stop
        t.quiet_progress = self.window  # the window reports this epoch, not the progress hook
        self.bar = (progress.progress_bar(self.profiler.window.total, "profile window")
                    if self.window and self.profiler is not None else None)

    def wrap_loader(self, loader: Iterable[Any]) -> Iterable[Any]:
        """The profiler times each batch's wait while its window is open."""
        return loader if self.profiler is None else self.profiler.wrap_loader(loader)

    def after_step(self, finite: bool) -> bool:
        t = self.trainer
        prof = self.profiler
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
        """The window is over: write its artifacts, put the null timer back, go on (or stop)."""
        t, prof = self.trainer, self.profiler
        if prof is None:
            return
        self.profiler, t.timer = None, NULL_TIMER
        summary = prof.finish(t.run_dir)
        for path, kind in summary.get("artifacts", {}).items():
            t.events.write(ArtifactEvent(path=path, kind=kind))
        t.events.write(ProfileEvent(**{k: v for k, v in summary.items() if k != "artifacts"}))
        t.extra_result["profile"] = summary
        if t.cfg.profile_then_stop:
            log.info("profile-only run: stopping after the profile window")
            t.stop_is_success = True
            t.request_stop("profile_then_stop")

    def _window_progress(self, prof: TrainingProfiler, done: int, total: int, last: bool) -> None:
        """Progress of a profile-only run: the window, step ``done`` of ``warmup + steps``.

        A ``progress`` event ``{phase: "profiling", step, steps, warmup, measured, eta_s,
        img_per_s, losses}`` (no epoch: the run never leaves the first one) at the first
        and last step, the end of the warm-up, every ``log_interval`` steps and at least
        every ``PROGRESS_EVERY_S``; the same as a printed line when stderr is no terminal, a
        tqdm bar when it is."""
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
