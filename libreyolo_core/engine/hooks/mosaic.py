"""The switch that ends mosaic and mixup for the last ``no_aug_epochs`` epochs."""

from __future__ import annotations

import logging

from libreyolo_core.engine.hooks.base import HookBase
from libreyolo_core.records.events import CapturedRegionChangedEvent

__all__ = ["MosaicSwitchHook"]

log = logging.getLogger(__name__)


class MosaicSwitchHook(HookBase):
    """At epoch ``epochs - no_aug_epochs``: mosaic and mixup off, and the family's
    ``on_mosaic_disable(model, loss_fn)`` (YOLOX switches its L1 loss on); a network the
    hook changed invalidates a captured CUDA graph (``captured_region_changed`` event)."""

    def before_epoch(self) -> None:
        t = self.trainer
        close_at = max(t.cfg.epochs - t.cfg.no_aug_epochs, 0)
        if t.state.epoch >= close_at and t.parts.train_set.mosaic_enabled:
            self.close(t.state.epoch)

    def close(self, epoch: int) -> None:
        """Switch augmentation off from ``epoch`` (0-based) on."""
        t, parts = self.trainer, self.trainer.parts
        parts.train_set.close_mosaic()
        changed = t.family.on_mosaic_disable(parts.model, parts.loss_fn)
        left = t.cfg.epochs - epoch
        log.info("epoch %d: mosaic and mixup off for the last %s", epoch + 1,
                 "epoch" if left == 1 else f"{left} epochs")
        if changed:
            t.events.write(CapturedRegionChangedEvent(epoch=epoch + 1, reason="mosaic closed"))
            if parts.cuda_graph is not None:
                parts.cuda_graph.invalidate(f"{t.family.title} changed the network at mosaic close")
            if parts.compiled is not None:
                parts.compiled.invalidate(f"{t.family.title} changed the network at mosaic close")
