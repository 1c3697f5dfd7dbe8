"""``--repeat N``: the trials' profiles averaged into one (``profile_repeat.json``).

:func:`aggregate` is shared by the profile CLI (``libreyolo profile run --repeat``) and
the tuner, which repeat one configuration's trial and compare the means.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from libreyolo_core.profiler.record import ProfileRecord

__all__ = ["REPEAT_SCALARS", "aggregate"]

#: Scalars averaged over repeat trials (docs/architecture.md, "Profiler").
REPEAT_SCALARS = (
    "step_ms",
    "gpu_util",
    "gpu_util_raw",
    "gpu_busy_ms_per_step",
    "mean_kernel_us",
    "kernels_per_step",
    "memcpy_ms_per_step",
    "host_overhead_ms_per_step",
    "launches_per_step",
    "dataload_ms",
    "dataload_frac",
    "compute_ms",
    "tensorcore_pct",
    "cuda_mallocs_per_step",
    "cpu_ops_ms_per_step",
    "ops_per_step",
    "peak_vram_mb",
)


def aggregate(trials: Sequence[ProfileRecord | Mapping[str, Any]], paths: Sequence[str]) -> ProfileRecord:
    """``profile_repeat.json``: the last trial's profile with means over the trials.

    ``img_per_s`` becomes the mean with ``img_per_s_std`` (population std), ``img_per_s_n``
    and ``img_per_s_trials``; every :data:`REPEAT_SCALARS` value becomes its mean; the bound
    is ``mixed`` when the trials disagree. Kernel/op lists come from the last trial.
    ``confidence`` combines the trials' (:func:`~.confidence.combine_confidence`) and
    ``load`` averages their loads (:func:`~.load.mean_load`, with the worst trial and each
    trial's own).
    """
    from libreyolo_core.profiler import verdict as V
    from libreyolo_core.profiler.artifacts import with_metrics
    from libreyolo_core.profiler.confidence import combine_confidence
    from libreyolo_core.profiler.load import mean_load

    profiles = [ProfileRecord.of(p) for p in trials]
    out = profiles[-1].to_dict()
    ips = [p.img_per_s for p in profiles if p.img_per_s is not None]
    if ips:
        out["img_per_s"] = round(statistics.fmean(ips), 3)
        out["img_per_s_std"] = round(statistics.pstdev(ips), 4)
        out["img_per_s_n"] = len(ips)
        out["img_per_s_trials"] = ips
    for key in REPEAT_SCALARS:
        vals = [
            getattr(p, key)
            for p in profiles
            if isinstance(getattr(p, key), int | float) and not isinstance(getattr(p, key), bool)
        ]
        if vals:
            mean = statistics.fmean(vals)
            out[key] = round(mean) if all(isinstance(v, int) for v in vals) else round(mean, 4)
    bounds = [p.bound for p in profiles]
    out["bound"] = V.combine(bounds)
    out["trial_bounds"] = bounds
    if out["bound"] == V.MIXED:
        out["bound_why"] = "repeat trials produced mixed bottleneck verdicts: " + ", ".join(
            f"trial {i + 1}: {b}" for i, b in enumerate(bounds)
        )
        out["levers"] = V.LEVERS[V.MIXED]
        out["lever"] = V.lever(V.MIXED, profiles[-1].config)
    else:
        out["bound_why"] = (
            f"all {len(bounds)} trials agree; last trial: {profiles[-1].bound_why}"
        )
    out["memory_pressure"] = out["bound"] == V.MEMORY
    out["confidence"] = combine_confidence([p.confidence for p in profiles], bounds).to_dict()
    out["load"] = mean_load([p.load.to_dict() if p.load is not None else None for p in profiles])
    out["aggregation"] = {
        "n": len(profiles),
        "profiles": list(paths),
        "representative_profile": paths[-1],
        "note": "means over trials (img/s std is the population std); kernel "
        "and op lists, phases and the trace come from the last trial",
    }
    return with_metrics(ProfileRecord.of(out))
