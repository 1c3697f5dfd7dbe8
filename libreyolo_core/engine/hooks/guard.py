"""The non-finite guard: a step with a non-finite loss or gradient leaves no trace."""

from __future__ import annotations

import logging
import math

import torch

from libreyolo_core.engine.hooks.base import HookBase
from libreyolo_core.engine.nonfinite import NonFiniteLossError, describe_nonfinite, grads_finite

__all__ = ["NonFiniteGuard", "MAX_NONFINITE_STREAK"]

log = logging.getLogger(__name__)


#: Consecutive non-finite losses that stop a run.
MAX_NONFINITE_STREAK = 10


class NonFiniteGuard(HookBase):
    """A non-finite step leaves no trace (docs/architecture.md, "Trainer"): the step's
    gradients are dropped and BatchNorm's statistics restored; ten in a row, or an epoch
    without one optimizer step, raise :class:`NonFiniteLossError`."""

    def __init__(self) -> None:
        self.first_bad = ""  # "step 3/8 (box=nan, ...)": the first non-finite step of the epoch
        self.applied_before = 0  # optimizer steps taken before the epoch

    def before_epoch(self) -> None:
        self.first_bad = ""
        self.applied_before = self.trainer.state.steps_applied

    def _skip(self) -> None:
        self.trainer.parts.optimizer.zero_grad(set_to_none=True)
        self.trainer.bn_guard.restore()  # the forward pass already moved the running stats

    def loss_finite(self, values: list[float]) -> bool:
        """Whether the step's ``[total, *items]`` are finite; if not, count it, warn and
        drop the step."""
        t, st, m = self.trainer, self.trainer.state, self.trainer.meter
        if all(math.isfinite(v) for v in values):
            st.nonfinite_streak = 0
            return True
        st.nonfinite_streak += 1
        st.nonfinite_skipped += 1
        terms = describe_nonfinite(t.parts.item_names, values[1:])
        self.first_bad = self.first_bad or f"step {m.step + 1}/{m.steps} ({terms})"
        log.warning("epoch %d step %d: non-finite loss (%s); optimizer step skipped",
                    st.epoch + 1, m.step + 1, terms)
        self._skip()
        return False

    def grads_finite(self, total_norm: torch.Tensor | None = None) -> bool:
        """fp32 steps: whether every gradient is finite (a finite loss can back-propagate an
        inf; the fp16 scaler checks itself); if not, count and drop the step.

        ``total_norm``: the gradients' total 2-norm (a 0-d tensor) when the caller already
        has it (``clip_grad_norm_``'s return); it is finite iff every gradient is, short of
        an fp32 overflow of the sum of squares (|g| ~ 1e19), which a clip would turn into a
        zero step anyway. Without it the norms are computed here."""
        st = self.trainer.state
        finite = (bool(torch.isfinite(total_norm)) if total_norm is not None
                  else grads_finite(self.trainer.parts.model.parameters()))
        if finite:
            return True
        st.nonfinite_skipped += 1
        st.nonfinite_streak += 1
        log.warning("non-finite gradients (the loss was finite); optimizer step skipped")
        self._skip()
        return False

    def scaler_skipped(self, scale_before: float) -> bool:
        """fp16 AMP: the scaler skipped the step (inf/NaN gradients) iff it lowered the
        scale; the window then leaves no trace either (BatchNorm restored, EMA not blended)."""
        st, scaler = self.trainer.state, self.trainer.parts.amp.scaler
        if not (scaler.is_enabled() and scaler.get_scale() < scale_before):
            return False
        st.amp_skipped += 1
        self.trainer.bn_guard.restore()
        log.log(logging.WARNING if st.amp_skipped % 100 == 0 else logging.DEBUG,
                "AMP GradScaler skipped a step for inf/NaN gradients (%d so far); scale now %g",
                st.amp_skipped, scaler.get_scale())
        return True

    def scaler_calibrating(self) -> bool:
        """fp16 AMP: whether an epoch whose every optimizer step the GradScaler skipped is
        the scaler still finding its scale, not a diverged run; if so, say it in one line.

        The scaler starts at 2**16 and halves at each skipped step. At that scale fp16
        weight gradients of a freshly initialised YOLO overflow (any |gradient| above
        65504 / 2**16 = 1), so the first several optimizer steps are skipped; with
        gradient accumulation and a small set (coco128 at batch 16: 2 optimizer steps an
        epoch) that can take whole epochs. Gradients that are still non-finite once the
        scale is below 1 are non-finite unscaled: that run diverged (the caller raises)."""
        scaler = self.trainer.parts.amp.scaler
        if not scaler.is_enabled() or scaler.get_scale() < 1.0:
            return False
        st = self.trainer.state
        log.warning("epoch %d: the AMP GradScaler skipped every optimizer step of the epoch "
                    "while it finds its scale (now %g after %d skipped step(s); it halves at each): "
                    "training goes on. amp_dtype=bfloat16 needs no scaler", st.epoch + 1,
                    scaler.get_scale(), st.amp_skipped)
        return True

    def after_step(self, finite: bool) -> None:
        st = self.trainer.state
        if not finite and st.nonfinite_streak >= MAX_NONFINITE_STREAK:
            raise NonFiniteLossError(
                f"{st.nonfinite_streak} non-finite losses in a row at epoch {st.epoch + 1}: the run diverged; "
                f"try {self._ways_out()}")

    def after_train_epoch(self) -> None:
        t, m = self.trainer, self.trainer.meter
        if m.steps and t.state.steps_applied == self.applied_before and not t.stopping():
            if m.counted and self.scaler_calibrating():
                return
            why = (f"every loss was non-finite, the first at {self.first_bad}" if not m.counted else
                   "every step had non-finite gradients (skipped by the AMP GradScaler or the fp32 check)")
            raise NonFiniteLossError(f"epoch {t.state.epoch + 1}: no optimizer step was taken in {m.steps} "
                                     f"steps: {why}. The run diverged; try {self._ways_out()}")

    def _ways_out(self) -> str:
        """What to try after a divergence, as training keys with values: a tenth of ``lr0``,
        and ``amp=False`` only when AMP is on (on the CPU it never is)."""
        t = self.trainer
        lower = f"a lower lr0 (lr0={t.cfg.lr0 / 10:g})"
        return f"amp=False or {lower}" if t.parts.amp.enabled else lower
