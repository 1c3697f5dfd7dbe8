"""Validation, the best epoch, the ``results.csv`` row and the early-stop decision."""

from __future__ import annotations

import time

from libreyolo_core.engine.ema import unwrap
from libreyolo_core.engine.hooks.base import HookBase
from libreyolo_core.engine.progress import validation_progress
from libreyolo_core.engine.state import fitness
from libreyolo_core.eval.validate import ValPredictions, validate

__all__ = ["ValidationHook"]


class ValidationHook(HookBase):
    """Validation with the EMA weights every ``eval_interval`` epochs and at the last
    (rank 0; the val loader exists there only), the best epoch by :func:`fitness`, the
    epoch's ``results.csv`` row, and the early-stop decision (``patience`` validated
    epochs without a better fitness)."""

    def __init__(self) -> None:
        self.since_best = 0  # validated epochs since the best one
        self.last_pass: ValPredictions | None = None  # the latest validation (the report's input)
        self.last_epoch = 0

    def after_epoch(self) -> None:
        t, cfg, st, out = self.trainer, self.trainer.cfg, self.trainer.state, self.trainer.outcome
        epoch = out.epoch
        out.validated = bool(cfg.val and t.parts.val_loader is not None and (
            (epoch + 1) % cfg.eval_interval == 0 or epoch + 1 == cfg.epochs))
        if out.validated:
            t_val = time.perf_counter()
            st.metrics = self._validate()
            out.val_time_s = time.perf_counter() - t_val
            st.val_s.append(out.val_time_s)
        out.fitness = fitness(st.metrics) if out.validated else float("nan")
        out.is_best = out.validated and out.fitness > st.best_fitness or (not cfg.val and epoch + 1 == cfg.epochs)
        if out.is_best:
            st.best_fitness, st.best_epoch = (out.fitness if out.validated else 0.0), epoch + 1
            st.best_metrics = dict(st.metrics)
            self.since_best = 0
        elif out.validated:
            self.since_best += 1
        out.since_best = self.since_best
        out.early_stop = bool(cfg.patience and out.validated and self.since_best >= cfg.patience)
        st.history.append({
            "epoch": epoch + 1, "time": round(time.time(), 3), "epoch_time_s": round(out.epoch_time_s, 3),
            "val_time_s": round(out.val_time_s, 3),
            **{f"train/{k}_loss": round(v, 6) for k, v in out.losses.items()},
            **{f"metrics/{k}": round(st.metrics.get(k, float("nan")), 6)
               for k in ("precision", "recall", "mAP50", "mAP50-95")},
            "fitness": round(out.fitness, 6), "lr": out.lr, "validated": int(out.validated),
            "is_best": int(out.is_best)})

    def _validate(self) -> dict[str, float]:
        t, parts = self.trainer, self.trainer.parts
        net = parts.ema.module if parts.ema is not None else unwrap(parts.model)
        progress = validation_progress(t.events, t.state.epoch + 1, t.cfg.epochs)
        dog = getattr(t, "watchdog", None)

        def on_batch(k: int, n: int) -> None:
            progress(k, n)
            if dog is not None:  # a validation batch is a sign of life
                dog.alive()

        kept = ValPredictions()
        metrics = validate(net, t.family, parts.val_loader, t.device, t.nc, conf=t.cfg.conf, iou=t.cfg.iou,
                           max_det=t.cfg.max_det, amp=parts.amp, on_batch=on_batch, keep=kept)
        self.last_pass, self.last_epoch = kept, t.state.epoch + 1
        return metrics
