"""Verdict rules on synthetic figures: the four verdicts in order, the CPU rule, mixed."""

from __future__ import annotations

import pytest

from libreyolo_core.profiler import verdict as V


def gpu(**kw) -> dict:
    fig = {
        "device_type": "cuda",
        "step_ms": 100.0,
        "dataload_ms": 5.0,
        "dataload_frac": 0.05,
        "gpu_util": 0.5,
        "gpu_util_raw": 0.5,
        "gpu_busy_ms_per_step": 50.0,
        "cuda_mallocs_per_step": 0.0,
    }
    fig.update(kw)
    return fig


def test_constants_in_one_place():
    assert (V.DATALOADER_FRAC, V.COMPUTE_UTIL, V.MALLOCS_PER_STEP, V.UTIL_RAW_OVER) == (
        0.20,
        0.80,
        5.0,
        1.05,
    )
    assert V.VERDICTS == ("memory-pressure", "dataloader", "compute", "host/launch")
    assert set(V.LEVERS) == {*V.VERDICTS, "mixed"}


def test_host_launch():
    bound, why = V.decide(gpu())
    assert bound == "host/launch"
    assert "50%" in why and "50.0 ms busy / 100.0 ms step" in why and "80%" in why


def test_compute():
    bound, why = V.decide(gpu(gpu_util=0.85, gpu_util_raw=0.85, gpu_busy_ms_per_step=85.0))
    assert bound == "compute" and "85%" in why


def test_dataloader_beats_compute():
    bound, why = V.decide(gpu(dataload_ms=30.0, dataload_frac=0.30, gpu_util=0.9, gpu_util_raw=0.9))
    assert bound == "dataloader" and "30%" in why and "30.0 of 100.0 ms" in why


def test_dataloader_threshold_is_inclusive():
    assert V.decide(gpu(dataload_frac=0.20))[0] == "dataloader"
    assert V.decide(gpu(dataload_frac=0.1999))[0] == "host/launch"


@pytest.mark.parametrize(
    "kw",
    [
        dict(cuda_mallocs_per_step=5.0),
        dict(gpu_util=1.0, gpu_util_raw=1.2, gpu_busy_ms_per_step=120.0),
    ],
)
def test_memory_pressure_overrides_everything(kw):
    bound, why = V.decide(gpu(dataload_frac=0.5, **kw))  # would be dataloader otherwise
    assert bound == "memory-pressure" and "unreliable" in why


def test_util_raw_at_threshold_is_not_pressure():
    assert V.decide(gpu(gpu_util=1.0, gpu_util_raw=1.05))[0] == "compute"


def test_cpu_rule():
    cpu = {
        "device_type": "cpu",
        "step_ms": 100.0,
        "dataload_ms": 25.0,
        "dataload_frac": 0.25,
        "gpu_util": None,
    }
    bound, why = V.decide(cpu)
    assert bound == "dataloader" and "not applicable" in why
    bound, why = V.decide(
        {**cpu, "dataload_ms": 5.0, "dataload_frac": 0.05, "cuda_mallocs_per_step": 99}
    )  # no memory rule on CPU
    assert bound == "compute" and "not applicable" in why


def test_gpu_without_trace_uses_the_two_way_rule():
    bound, why = V.decide(gpu(gpu_util=None, gpu_util_raw=None))
    assert bound == "compute" and "no trace" in why


def test_combine():
    assert V.combine(["compute", "compute"]) == "compute"
    assert V.combine(["compute", "dataloader"]) == "mixed"


def test_lever_is_the_keys_to_try_with_values():
    from libreyolo_core.config import TrainConfig
    from libreyolo_core.profiler.verdict import lever

    run = {"batch": 16, "workers": 2, "amp": True, "cuda_graph": False, "device": "cuda"}
    assert lever(V.DATALOADER, run, cpu_count=16)["params"] == {"workers": 4, "cache": "ram"}
    busy = lever(V.DATALOADER, {**run, "workers": 16}, cpu_count=16)
    assert busy["params"] == {"cache": "ram"} and "16 cores" in busy["why"]
    assert lever(V.MEMORY, run)["params"] == {"batch": 8}
    assert lever(V.HOST, run)["params"] == {"batch": 32, "cuda_graph": True}
    assert any(a.startswith("compile=True") for a in lever(V.HOST, run)["also"])
    compiled = lever(V.HOST, {**run, "compile": "default"})  # compile wins over cuda_graph
    assert compiled["params"] == {"batch": 32}
    assert any(a.startswith("compile=reduce-overhead") for a in compiled["also"])
    assert not any("compile" in a for a in lever(V.HOST, {**run, "device": "cpu"})["also"])
    assert lever(V.COMPUTE, {**run, "amp": False})["params"] == {"amp": True}
    cpu = lever(V.COMPUTE, {**run, "device": "cpu"})
    assert cpu["params"] == {} and "train on a GPU (device=0; a service job: gpus=1)" in cpu["also"]
    assert lever(V.MIXED, run)["params"] == {}
    for bound in (*V.VERDICTS, V.MIXED):  # every suggestion is a valid training config
        out = lever(bound, run, cpu_count=8)
        assert set(out) == {"verdict", "params", "why", "also"} and out["why"]
        TrainConfig(**out["params"])
