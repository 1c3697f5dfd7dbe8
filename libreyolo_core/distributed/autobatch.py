"""Autobatch (``batch=-1``): the largest batch that fits a share of one GPU's memory,
then the global batch of a DDP job (reference D.5, spec-training §4).

Method (Ultralytics' and LibreYOLO's ``autobatch``): run real train-mode
forward + backward passes at batch 1, 2, 4, ... on zero images, record the peak memory
of each, fit ``memory = a * batch + c`` and take the largest power of two strictly below
the batch that would fill ``fraction`` of the device. Needs CUDA (memory statistics);
anywhere else it logs that and returns the default.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

__all__ = ["DEFAULT_BATCH", "probe_batch", "fit_batch", "global_batch", "autobatch"]

log = logging.getLogger(__name__)

#: Per-device batch used when autobatch cannot measure (no CUDA, too few points, errors).
DEFAULT_BATCH = 16


def fit_batch(sizes: list[int], memory: list[float], total: float, fraction: float = 0.60,
              default: int = DEFAULT_BATCH) -> int:
    """Per-device batch from probe points.

    Args:
        sizes: probed batch sizes.
        memory: peak bytes of each probe (same length).
        total: device memory in bytes.
        fraction: share of ``total`` to fill (0.60).
        default: returned when fewer than two points or a non-positive slope.

    Returns:
        The largest power of two strictly below ``(fraction * total - c) / a``, clamped
        to ``[1, 1024]``.
    """
    if len(sizes) < 2 or len(sizes) != len(memory):
        return default
    x = torch.tensor(sizes, dtype=torch.float64)
    y = torch.tensor(memory, dtype=torch.float64)
    design = torch.stack((x, torch.ones_like(x)), 1)
    a, c = torch.linalg.lstsq(design, y[:, None]).solution[:, 0].tolist()
    if a <= 0:
        return default
    raw = (fraction * total - c) / a
    if raw <= 1:
        return 1
    power = 1
    while power * 2 < raw and power * 2 <= 1024:
        power *= 2
    return power


def global_batch(per_device: int, world_size: int, nbs: int | None) -> int:
    """The global batch of ``world_size`` devices that each fit ``per_device`` images.

    With ``nbs`` the global batch is capped at ``nbs`` and rounded down to a multiple of
    ``world_size`` (more GPUs: fewer accumulation steps, not a bigger per-device batch);
    never below ``world_size``.
    """
    total = max(per_device, 1) * world_size
    if nbs:
        if world_size > nbs:
            log.warning("autobatch: world_size=%d exceeds nbs=%d; the global batch is %d", world_size,
                        nbs, world_size)
        total = min(total, nbs) // world_size * world_size
    return max(total, world_size)


def _output_sum(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out.float().sum()
    if isinstance(out, dict):
        out = list(out.values())
    return sum(_output_sum(o) for o in out if isinstance(o, torch.Tensor | list | tuple | dict))


def probe_batch(
    model: nn.Module,
    imgsz: int,
    device: torch.device,
    autocast: Callable[[], object] | None = None,
    fraction: float = 0.60,
    max_probe: int = 64,
    default: int = DEFAULT_BATCH,
) -> int:
    """Measure the per-device batch for ``model`` at ``imgsz`` on ``device``.

    Probes batch sizes 1, 2, 4, ... up to ``max_probe`` in train mode (BatchNorm running
    statistics and gradients are restored afterwards); stops at an out-of-memory error or
    above 90 % of the device. ``autocast`` is a context factory (the run's AMP setting).

    Returns:
        The fitted batch (see :func:`fit_batch`), or ``default`` on a non-CUDA device or
        when probing fails (both logged).
    """
    if device.type != "cuda":
        log.warning("autobatch (batch=-1) needs a CUDA device to measure memory; %s has none, "
                    "using batch=%d per device", device, default)
        return default
    total = torch.cuda.get_device_properties(device).total_memory
    buffers = {k: v.clone() for k, v in model.state_dict().items() if not v.dtype.is_floating_point
               or "running" in k}
    was_training = model.training
    model.train()
    sizes: list[int] = []
    memory: list[float] = []
    batch = 1
    try:
        while batch <= max_probe:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            try:
                images = torch.zeros(batch, 3, imgsz, imgsz, device=device)
                with autocast() if autocast is not None else torch.autocast(device.type, enabled=False):
                    out = model(images)
                _output_sum(out).backward()
                peak = torch.cuda.max_memory_allocated(device)
            except torch.cuda.OutOfMemoryError:
                break
            finally:
                model.zero_grad(set_to_none=True)
                out = images = None
            sizes.append(batch)
            memory.append(float(peak))
            log.info("autobatch: batch %d uses %.2f GiB of %.1f GiB", batch, peak / 2**30, total / 2**30)
            if peak > 0.9 * total:
                break
            batch *= 2
    except Exception as exc:  # noqa: BLE001 - a failed probe must not fail the run
        log.warning("autobatch probe failed (%s); using batch=%d per device", exc, default)
        return default
    finally:
        model.load_state_dict(buffers, strict=False)
        model.train(was_training)
        torch.cuda.empty_cache()
    chosen = fit_batch(sizes, memory, total, fraction, default)
    log.info("autobatch: batch %d per device (%.0f %% of %.1f GiB)", chosen, fraction * 100, total / 2**30)
    return chosen


def autobatch(
    model: nn.Module,
    imgsz: int,
    device: torch.device,
    world_size: int,
    nbs: int | None,
    autocast: Callable[[], object] | None = None,
) -> int:
    """``batch=-1`` resolved: :func:`probe_batch` on ``device`` (up to ``nbs`` or 64 images),
    then :func:`global_batch` for ``world_size`` devices; logs the choice. Run it once per
    job (the spawn parent, or rank 0 under torchrun, which broadcasts the result)."""
    per_device = probe_batch(model, imgsz, device, autocast=autocast, max_probe=nbs or 64)
    batch = global_batch(per_device, world_size, nbs)
    log.info("autobatch: global batch %d (%d per device x world_size %d%s)", batch, per_device, world_size,
             f", capped by nbs={nbs}" if nbs else "")
    return batch
