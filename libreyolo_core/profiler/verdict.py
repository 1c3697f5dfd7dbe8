"""The four verdicts, their thresholds (all in one place) and the sentence that explains one.

Order of the rules (LibreYOLO's newer profiler; docs/architecture.md, Profiler):

1. ``memory-pressure`` — ``cuda_mallocs_per_step >= MALLOCS_PER_STEP`` or
   ``gpu_util_raw > UTIL_RAW_OVER`` (allocator thrash: the busy time overlaps itself, so
   utilisation and img/s are unreliable).
2. ``dataloader`` — ``dataload_frac >= DATALOADER_FRAC`` (share of the *unsynced* step spent
   blocked in ``next(loader)``).
3. ``compute`` — ``gpu_util >= COMPUTE_UTIL`` (device kernel time / unsynced step time).
4. ``host/launch`` — otherwise: the device is only partly busy, kernels arrive too slowly.

On a CPU-only run device utilisation is not applicable: the verdict is ``dataloader`` when
the data-wait share reaches :data:`DATALOADER_FRAC`, else ``compute``. Without a trace on a
GPU run the same two-way rule applies (utilisation unknown). Repeat trials that disagree
aggregate to ``mixed``.

The phase split of the synced half is never an input here: per-phase synchronisation gives
loader workers slack and hides starvation.

How sure a verdict is (:mod:`libreyolo_core.profiler.confidence`) uses the thresholds of the
second block below: the spread of the unsynced steps (:data:`NOISY_STEP_CV`,
:data:`MARGIN_SE`, :data:`MIN_SPREAD_STEPS`) and the machine's load during the window
(:data:`LOADED_OTHER_FRAC`); ``compare`` adds :data:`LOAD_DIFF_FRAC`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "DATALOADER_FRAC",
    "COMPUTE_UTIL",
    "MALLOCS_PER_STEP",
    "UTIL_RAW_OVER",
    "VERDICTS",
    "LEVERS",
    "MIXED",
    "decide",
    "combine",
    "lever",
    "NOISY_STEP_CV",
    "MARGIN_SE",
    "MIN_SPREAD_STEPS",
    "LOADED_OTHER_FRAC",
    "LOAD_DIFF_FRAC",
]

#: Data-wait share of the unsynced step at or above which the run is loader-bound.
DATALOADER_FRAC = 0.20
#: Device utilisation (kernel time / unsynced step) at or above which the device is saturated.
COMPUTE_UTIL = 0.80
#: ``cudaMalloc``/``cudaFree`` calls per step at or above which the allocator is thrashing.
MALLOCS_PER_STEP = 5.0
#: Raw utilisation above this means overlapping busy time: memory pressure.
UTIL_RAW_OVER = 1.05

# -- how sure a verdict is ------------------------------------------------------------------
#: Coefficient of variation (sample std / mean) of the unsynced step times above which the
#: window is too noisy to trust: a quiet machine repeats a training step within a few %.
NOISY_STEP_CV = 0.20
#: A data-wait share closer to :data:`DATALOADER_FRAC` than this many standard errors (of
#: the per-step shares) is a close call: another window could land on the other side. The
#: data wait's own CV is reported but not judged: with several workers a loader-bound step
#: waits in bursts (long waits, then none), so a high CV is normal there.
MARGIN_SE = 2.0
#: Fewer unsynced steps than this cannot show their spread (``--steps`` at least twice it).
MIN_SPREAD_STEPS = 3
#: Other processes taking this share of the machine's CPU time or more during the window
#: (``load.other_cpu_frac``): they competed with the loader workers and the host side.
LOADED_OTHER_FRAC = 0.25
#: ``compare``: the two sides' ``other_cpu_frac`` differing by this much or more means they
#: ran in different environments.
LOAD_DIFF_FRAC = 0.15

MEMORY, DATALOADER, COMPUTE, HOST = "memory-pressure", "dataloader", "compute", "host/launch"
MIXED = "mixed"
#: The verdicts in the order their rules are checked.
VERDICTS = (MEMORY, DATALOADER, COMPUTE, HOST)

#: Which lever to pull for each verdict (printed by the report and the timeline).
LEVERS: dict[str, str] = {
    MEMORY: "lower batch or activation memory, stay away from the OOM edge; "
    "utilisation and img/s are unreliable here",
    DATALOADER: "more workers, cache=ram/disk, lighter augmentation, larger batch",
    COMPUTE: "AMP / bf16 on a GPU (amp=True; a CPU run: move to a GPU), accept it, or a "
    "smaller model",
    HOST: "larger micro-batch, fewer per-step syncs (.item()), cuda_graph=True, op fusion",
    MIXED: "repeat trials produced mixed bottleneck verdicts: profile again with more steps",
}


_COMPILE_ADVICE = "compile=True (torch.compile: fused kernels; the first step compiles for a minute or more)"


def lever(verdict: str, config: Mapping[str, Any], *,
          cpu_count: int | None = None) -> dict[str, Any]:
    """The lever of a verdict as data: the training keys to change and the values to try.

    Args:
        verdict: one of :data:`VERDICTS` or :data:`MIXED`.
        config: the profiled run's settings (``batch``, ``workers``, ``amp``, ``cuda_graph``,
            ``compile``, ``device``, ``model``); missing ones take TrainConfig's defaults.
        cpu_count: CPU cores of the host (default ``os.cpu_count()``), the ceiling for
            ``workers``.

    Returns:
        ``{"verdict", "params": {training key: value to try}, "why": sentence, "also":
        [advice that is not a training key]}``. ``params`` is empty when no key helps
        (a CPU compute-bound run, mixed trials): ``also`` says what does. The values are
        the next thing to try, not a promise: profile again after changing them.
    """
    import os

    batch = int(config.get("batch") or 16)
    cpu = str(config.get("device", "cpu")).startswith("cpu")
    params: dict[str, Any] = {}
    also: list[str] = []
    if verdict == MEMORY:
        params["batch"] = max(1, batch // 2)
        why = "the allocator thrashes: halve the batch to leave memory headroom"
        also.append("a smaller imgsz also lowers activation memory")
    elif verdict == DATALOADER:
        why = _dataloader_lever(config, cpu_count or os.cpu_count() or 1, params, also)
    elif verdict == COMPUTE:
        why = _compute_lever(config, cpu, params, also)
    elif verdict == HOST:
        why = _host_lever(config, batch, cpu, params, also)
    else:  # MIXED or unknown
        why = "repeat trials disagreed: profile again with more steps before changing anything"
        also.append("libreyolo profile run DATA --steps 40 --repeat 3")
    return {"verdict": verdict, "params": params, "why": why, "also": also}


def _dataloader_lever(config: Mapping[str, Any], cores: int, params: dict[str, Any],
                      also: list[str]) -> str:
    """More loader workers (up to ``cores``) and cached images; fills ``params`` and
    ``also``, returns why."""
    workers_set = config.get("workers")
    workers = int(workers_set if workers_set is not None else 4)
    if workers < 0:  # automatic: what this machine gives a run
        from libreyolo_core.data.workers import resolved_workers

        workers = resolved_workers(workers)
    more = min(max(2 * workers, workers + 2), max(cores, 1))
    if more > workers:
        params["workers"] = more
    params["cache"] = "ram"
    also.append("lighter augmentation (mosaic, mixup) costs less per image")
    return ("the step waits for data: "
            + (f"more loader workers ({workers} -> {more}, the host has {cores} cores) and "
               if more > workers else f"the {cores} cores are all loading already; ")
            + "cached decoded images")


def _compute_lever(config: Mapping[str, Any], cpu: bool, params: dict[str, Any],
                   also: list[str]) -> str:
    """AMP when it is off on a GPU, else advice only; fills ``params`` and ``also``,
    returns why."""
    if cpu:
        also += ["train on a GPU (device=0; a service job: gpus=1)",
                 "a smaller model or imgsz"]
        return "the CPU is busy computing: no training key makes it faster"
    if not config.get("amp", True):
        params["amp"] = True
        return "the device is saturated in fp32: AMP puts gemm/conv on Tensor Cores"
    also += ["a smaller model or imgsz", "more GPUs"]
    if not config.get("compile"):
        also.append(_COMPILE_ADVICE)
    return "the device is saturated with AMP on: this run is as fast as this model gets here"


def _host_lever(config: Mapping[str, Any], batch: int, cpu: bool, params: dict[str, Any],
                also: list[str]) -> str:
    """A larger micro-batch and a CUDA graph; fills ``params`` and ``also``, returns why."""
    params["batch"] = batch * 2
    compiled = bool(config.get("compile"))  # compile wins over cuda_graph
    if not cpu and not config.get("cuda_graph") and not compiled:
        params["cuda_graph"] = True
    also.append("fewer per-step host syncs (.item()) in custom callbacks")
    if not cpu:
        also.append("compile=reduce-overhead (CUDA graphs of the compiled network)" if compiled
                    else _COMPILE_ADVICE)
    return ("the device idles between kernels: a larger micro-batch gives each launch more "
            "work" + (", a CUDA graph replays the step in one launch"
                      if "cuda_graph" in params else ""))


def _pct(x: float) -> str:
    return f"{100.0 * x:.0f}%"


def decide(fig: Mapping[str, Any]) -> tuple[str, str]:
    """Pick the verdict for one profile and say why, with the figures that decided it.

    Args:
        fig: headline figures. Always read: ``step_ms`` and ``dataload_ms`` (unsynced means,
            milliseconds) and ``dataload_frac`` (0-1). On a device run (``device_type`` other
            than ``"cpu"``) also ``gpu_util``, ``gpu_util_raw``, ``gpu_busy_ms_per_step`` and
            ``cuda_mallocs_per_step``; a ``None`` utilisation means no trace was analysed.

    Returns:
        ``(bound, bound_why)``: one of :data:`VERDICTS` and a sentence quoting the figures
        and the threshold crossed (or not crossed).
    """
    step = float(fig.get("step_ms") or 0.0)
    data = float(fig.get("dataload_ms") or 0.0)
    frac = float(fig.get("dataload_frac") or 0.0)
    data_txt = f"data wait is {_pct(frac)} of the unsynced step ({data:.1f} of {step:.1f} ms)"
    cpu = str(fig.get("device_type", "cpu")) == "cpu"
    util = fig.get("gpu_util")
    if cpu or util is None:
        scope = (
            "CPU run: device utilisation is not applicable; "
            if cpu
            else "no trace analysed, utilisation unknown; "
        )
        if frac >= DATALOADER_FRAC:
            return DATALOADER, (
                f"{scope}{data_txt}, at or above the {_pct(DATALOADER_FRAC)} dataloader threshold"
            )
        return COMPUTE, (
            f"{scope}{data_txt}, below the {_pct(DATALOADER_FRAC)} dataloader "
            "threshold, so the step is spent computing"
        )
    util = float(util)
    util_raw = fig.get("gpu_util_raw")
    raw = float(util_raw if util_raw is not None else util)
    mallocs = float(fig.get("cuda_mallocs_per_step") or 0.0)
    busy = float(fig.get("gpu_busy_ms_per_step") or 0.0)
    if mallocs >= MALLOCS_PER_STEP or raw > UTIL_RAW_OVER:
        reasons = []
        if mallocs >= MALLOCS_PER_STEP:
            reasons.append(
                f"{mallocs:.1f} cudaMalloc/cudaFree calls per step (threshold {MALLOCS_PER_STEP:g})"
            )
        if raw > UTIL_RAW_OVER:
            reasons.append(
                f"raw utilisation {_pct(raw)} above {_pct(UTIL_RAW_OVER)} "
                f"({busy:.1f} ms busy / {step:.1f} ms step)"
            )
        return MEMORY, (
            "allocator thrash: " + " and ".join(reasons) + "; utilisation and img/s are unreliable"
        )
    if frac >= DATALOADER_FRAC:
        return DATALOADER, f"{data_txt}, at or above the {_pct(DATALOADER_FRAC)} threshold"
    util_txt = f"GPU busy {_pct(util)} of the step ({busy:.1f} ms busy / {step:.1f} ms step)"
    if util >= COMPUTE_UTIL:
        return COMPUTE, (
            f"{util_txt}, at or above the {_pct(COMPUTE_UTIL)} compute threshold; {data_txt}"
        )
    return HOST, (
        f"{util_txt}, below the {_pct(COMPUTE_UTIL)} compute threshold, and {data_txt} "
        f"(below {_pct(DATALOADER_FRAC)}): kernels are fed too slowly"
    )


def combine(bounds: Sequence[str | None]) -> str | None:
    """The verdict of several repeat trials: theirs when they agree, else ``mixed``."""
    unique = set(bounds)
    if len(unique) == 1:
        return bounds[0]
    return MIXED
