"""Autobatch (``batch=-1``): the largest batch that fits a share of one GPU's memory,
then the global batch of a DDP job (docs/architecture.md, Multi-device).

Method (Ultralytics' and LibreYOLO's ``autobatch``): run real train-mode
forward + backward passes at batch 1, 2, 4, ... on zero images, record the peak memory
of each, fit ``memory = a * batch + c`` and take the largest power of two strictly below
the batch that would fill ``fraction`` of the device. Needs CUDA (memory statistics);
anywhere else it logs that and returns the default.

Fallbacks say what they did (one WARNING line with every probe's memory and the choice):
too few probes or a non-increasing fit fall back to ``min(default, largest probe that
fitted)``; the fitted batch never exceeds :data:`MAX_EXTRAPOLATION` times the largest probe
that fitted; when not even batch 1 fits, :class:`AutobatchError` says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from torch import nn

__all__ = ["DEFAULT_BATCH", "MAX_EXTRAPOLATION", "AutobatchError", "choose_batch", "nothing_fits", "probe_batch", "fit_batch",
           "global_batch", "autobatch"]

log = logging.getLogger(__name__)

#: Per-device batch used when autobatch cannot measure (no CUDA); after probing, a fallback
#: never exceeds the largest probe that fitted.
DEFAULT_BATCH = 16
#: The fitted batch is at most this many times the largest probe that fitted.
MAX_EXTRAPOLATION = 4


class AutobatchError(RuntimeError):
    """Not even batch 1 fits on the device (or probing failed before any probe fitted)."""


def nothing_fits(device: str, total: float, free: float | None, stopped: str, imgsz: int) -> str:
    """The error of an autobatch that found no batch: the device, its memory (total and
    free, bytes), why probing stopped, and the ways out (a fixed ``batch=``)."""
    mem = f"{total / 2**30:.1f} GiB" + (f", {free / 2**30:.1f} GiB free" if free is not None else "")
    return (f"autobatch: not even batch 1 fits on {device} ({mem}; {stopped}). Set a fixed "
            f"batch= instead of batch=-1 (batch=1 with a smaller imgsz than {imgsz}), use a "
            "smaller model, or free the GPU (other processes hold "
            + (f"{(total - free) / 2**30:.1f} GiB of it)" if free is not None else "part of it)"))


def choose_batch(sizes: list[int], memory: list[float], total: float, fraction: float = 0.60,
                 default: int = DEFAULT_BATCH) -> tuple[int, str]:
    """Per-device batch from probe points, and why (for the log line).

    Args:
        sizes: batch sizes that fitted (ascending).
        memory: peak bytes of each (same length).
        total: device memory in bytes.
        fraction: share of ``total`` to fill (0.60).
        default: the fallback's upper bound when the points cannot be fitted.

    Returns:
        ``(batch, reason)``: the largest power of two strictly below
        ``(fraction * total - c) / a``, at least 1 and at most :data:`MAX_EXTRAPOLATION`
        times ``max(sizes)`` (and 1024); with fewer than two points or a non-positive
        slope, ``min(default, max(sizes))``.

    Raises:
        AutobatchError: ``sizes`` is empty (nothing fitted).
    """
    if not sizes:
        raise AutobatchError(f"autobatch: not even batch 1 fits in the device's {total / 2**30:.1f} GiB; "
                             "lower imgsz, use a smaller model, or free the GPU")
    largest = max(sizes)
    if len(sizes) < 2 or len(sizes) != len(memory):
        batch = min(default, largest)
        return batch, (f"fallback: only {len(sizes)} probe fitted, so no fit; min(default {default}, "
                       f"largest probe that fitted {largest}) = {batch}")
    x = torch.tensor(sizes, dtype=torch.float64)
    y = torch.tensor(memory, dtype=torch.float64)
    design = torch.stack((x, torch.ones_like(x)), 1)
    a, c = torch.linalg.lstsq(design, y[:, None]).solution[:, 0].tolist()
    if a <= 0:
        batch = min(default, largest)
        return batch, (f"fallback: memory did not grow with the batch (slope {a / 2**20:.3g} MiB/image); "
                       f"min(default {default}, largest probe that fitted {largest}) = {batch}")
    raw = (fraction * total - c) / a
    fit = f"fit {c / 2**30:.2f} GiB + {a / 2**20:.1f} MiB/image fills {fraction:.0%} at {raw:.1f}"
    if raw <= 1:
        return 1, f"{fit}: batch 1"
    power = 1
    while power * 2 < raw and power * 2 <= 1024:
        power *= 2
    cap = largest * MAX_EXTRAPOLATION
    if power > cap:
        while power > cap:
            power //= 2
        return power, (f"{fit}; capped at {power} = at most {MAX_EXTRAPOLATION}x the largest probe "
                       f"that fitted ({largest})")
    return power, f"{fit}: the largest power of two below, {power}"


def fit_batch(sizes: list[int], memory: list[float], total: float, fraction: float = 0.60,
              default: int = DEFAULT_BATCH) -> int:
    """The batch of :func:`choose_batch` without its reason."""
    return choose_batch(sizes, memory, total, fraction, default)[0]


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
    parts = [_output_sum(o) for o in out if isinstance(o, torch.Tensor | list | tuple | dict)]
    return torch.stack(parts).sum() if parts else torch.zeros(())


def probe_batch(
    model: nn.Module,
    imgsz: int,
    device: torch.device,
    autocast: Callable[[], AbstractContextManager] | None = None,
    fraction: float = 0.60,
    max_probe: int = 64,
    default: int = DEFAULT_BATCH,
) -> int:
    """Measure the per-device batch for ``model`` at ``imgsz`` on ``device``.

    Probes batch sizes 1, 2, 4, ... up to ``max_probe`` in train mode (BatchNorm running
    statistics and gradients are restored afterwards); stops at an out-of-memory error or
    above 90 % of the device. ``autocast`` is a context factory (the run's AMP setting).

    Returns:
        The batch of :func:`choose_batch`, or ``default`` on a non-CUDA device (logged).
        A probe failing with another error than out-of-memory ends the probing: the
        points so far are used (none: :class:`AutobatchError`).

    Raises:
        AutobatchError: not even batch 1 fits (or the first probe failed).
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
    stopped = f"probed up to max_probe={max_probe}"
    images: torch.Tensor | None = None
    out: object = None
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
                stopped = f"batch {batch} ran out of memory"
                break
            finally:
                model.zero_grad(set_to_none=True)
                out = images = None
            sizes.append(batch)
            memory.append(float(peak))
            log.info("autobatch: batch %d uses %.2f GiB of %.1f GiB", batch, peak / 2**30, total / 2**30)
            if peak > 0.9 * total:
                stopped = f"batch {batch} used over 90 % of the device"
                break
            batch *= 2
    except Exception as exc:  # noqa: BLE001 - use the probes that fitted, say why it stopped
        stopped = f"batch {batch} failed ({type(exc).__name__}: {str(exc)[:200]})"
        if not sizes:
            raise AutobatchError(f"autobatch: the first probe failed ({stopped}); set batch= explicitly") from exc
    finally:
        model.load_state_dict(buffers, strict=False)
        model.train(was_training)
        torch.cuda.empty_cache()
    measured = ", ".join(f"{b}: {m / 2**30:.2f} GiB" for b, m in zip(sizes, memory, strict=True))
    try:
        chosen, why = choose_batch(sizes, memory, total, fraction, default)
    except AutobatchError:
        free = torch.cuda.mem_get_info(device)[0] if hasattr(torch.cuda, "mem_get_info") else None
        raise AutobatchError(nothing_fits(f"{device} ({torch.cuda.get_device_name(device)})",
                                          total, free, stopped, imgsz)) from None
    log.warning("autobatch on %s (%.1f GiB): measured {%s}; %s; chose batch %d per device (%s)",
                device, total / 2**30, measured, stopped, chosen, why)
    return chosen


def autobatch(
    model: nn.Module,
    imgsz: int,
    device: torch.device,
    world_size: int,
    nbs: int | None,
    autocast: Callable[[], AbstractContextManager] | None = None,
) -> int:
    """``batch=-1`` resolved: :func:`probe_batch` on ``device`` (up to ``nbs`` or 64 images),
    then :func:`global_batch` for ``world_size`` devices; logs the choice. Run it once per
    job (the spawn parent, or rank 0 under torchrun, which broadcasts the result)."""
    per_device = probe_batch(model, imgsz, device, autocast=autocast, max_probe=nbs or 64)
    batch = global_batch(per_device, world_size, nbs)
    log.info("autobatch: global batch %d (%d per device x world_size %d%s)", batch, per_device, world_size,
             f", capped by nbs={nbs}" if nbs else "")
    return batch
