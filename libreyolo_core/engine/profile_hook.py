"""The training profiler of a run (``profile=True``), built with the run's parts.

:func:`build_profiler` is called by :func:`~libreyolo_core.engine.run.prepare_run`, before
the run directory is opened, so a window that does not fit one epoch fails the set-up. The
hook that drives the window is :class:`~libreyolo_core.engine.hooks.profile.ProfilerHook`.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

__all__ = ["build_profiler"]

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
              "loader": cfg.loader, "cache_recent_fits": parts.train_set.recent_fits(),
              "cuda_graph": cfg.cuda_graph, "compile": cfg.compile, "world_size": 1, "torch": torch.__version__},
    )
