"""The tune's rules on synthetic repeat aggregates: which levers a verdict names on which
device, and when a candidate is recommended (never noise, never what the load explains)."""

from __future__ import annotations

import pytest

from libreyolo_core.profiler import verdict as V
from libreyolo_core.profiler.cli import aggregate
from libreyolo_core.profiler.tune import (
    NO_LEVER,
    TuneOptions,
    candidate_levers,
    format_tune,
    judge,
    load_bound,
)

CPU_CONFIG = {"batch": 32, "workers": 0, "cache": False, "mosaic": 1.0, "mixup": 1.0,
              "amp": True, "amp_dtype": "float16", "cuda_graph": False}


def side(ips: list[float], other: list[float] | None, bound: str = "dataloader",
         reliable: bool = True, flags: tuple[str, ...] = ()) -> dict:
    """A repeat aggregate of len(ips) trials: img/s and other processes' CPU share each."""
    profiles = []
    for i, v in enumerate(ips):
        load = None if other is None else {
            "other_cpu_frac": other[i], "other_cpu_cores": 2 * other[i], "cpu_count": 2,
            "wall_s": 1.0, "loadavg_1m": 1.0, "source": "test"}
        profiles.append({"img_per_s": v, "step_ms": 32_000 / v, "bound": bound,
                         "device_type": "cpu", "config": {"batch": 32},
                         "confidence": {"reliable": reliable and not flags, "flags": list(flags),
                                        "reasons": list(flags), "steps": 5,
                                        "step_ms_cv": 0.3 if "noisy_steps" in flags else 0.02},
                         "load": load})
    return aggregate(profiles, [f"p{i}" for i in range(len(ips))])


def test_cpu_dataloader_levers_loader_first_then_what_changes_training():
    levers = candidate_levers(["dataloader"], CPU_CONFIG, device_type="cpu", cpu_count=2)
    assert [lv.name for lv in levers] == ["workers", "cache", "light_aug", "batch_up"]
    assert levers[0].params == {"workers": 2} and levers[1].params == {"cache": "ram"}
    assert levers[2].params == {"mixup": 0.0} and levers[2].side_effect
    assert levers[3].params == {"batch": 64} and levers[3].side_effect
    assert all(lv.side_effect is None for lv in levers[:2])


def test_a_cpu_never_tries_amp_bf16_cuda_graphs_or_compile():
    fp32 = {**CPU_CONFIG, "amp": False}
    for verdict in V.VERDICTS:
        names = {lv.name for lv in candidate_levers([verdict], fp32, device_type="cpu",
                                                     bf16_supported=True)}
        assert not names & {"amp", "bf16", "cuda_graph", "compile"}, verdict
    assert candidate_levers(["compute"], fp32, device_type="cpu") == []  # no lever on a CPU


def test_gpu_levers_exist_only_where_the_device_has_them():
    cfg = {**CPU_CONFIG, "amp": False, "workers": 8, "cache": "ram"}
    compute = candidate_levers(["compute"], cfg, device_type="cuda", bf16_supported=True)
    assert [lv.name for lv in compute] == ["amp", "bf16", "compile"]
    assert compute[1].params == {"amp": True, "amp_dtype": "bfloat16"}
    assert compute[2].params == {"compile": True} and compute[2].side_effect is None
    assert [lv.name for lv in candidate_levers(["compute"], cfg, device_type="cuda")] == \
        ["amp", "compile"]
    host = candidate_levers(["host/launch"], cfg, device_type="cuda")
    assert [lv.name for lv in host] == ["cuda_graph", "compile", "batch_up"]
    # alternatives (compile wins when both are set): never combined by the tune
    assert host[0].group == host[1].group
    assert [lv.name for lv in candidate_levers(["host/launch"], cfg, device_type="cuda",
                                               cuda_graph_supported=False)] == ["compile", "batch_up"]
    assert [lv.name for lv in candidate_levers(["host/launch"], {**cfg, "compile": "default"},
                                               device_type="cuda")] == ["cuda_graph", "batch_up"]
    memory = candidate_levers(["memory-pressure"], cfg, device_type="cuda")
    assert [(lv.name, lv.params) for lv in memory] == [("batch_down", {"batch": 16})]
    # trials that disagree: the levers of both verdicts, each once
    mixed = candidate_levers(["dataloader", "compute"], cfg, device_type="cuda", cpu_count=16)
    assert [lv.name for lv in mixed] == ["workers", "amp", "compile", "light_aug", "batch_up"]


def test_a_clear_gain_on_a_quiet_machine_is_recommended():
    base, cand = side([30.0, 31.0, 29.5], [0.02, 0.03, 0.02]), side([60.0, 62.0, 61.0], [0.03, 0.02, 0.02])
    comp, v = judge(base, cand, min_gain=0.05)
    assert comp.significance["significant"] is True and comp.environment.may_explain is False
    assert v["recommendable"] and v["separated"] and v["gain"] == pytest.approx(1.0, abs=0.03)
    assert v["note"].startswith("faster beyond noise")


@pytest.mark.parametrize("cand_ips, words", [
    ([31.5, 29.0, 30.5], "not significant"),  # noise: within 2 x SE
    ([31.2, 31.4, 31.3], "below the 5% minimum"),  # significant, but a 4% gain
    ([28.0, 29.0, 28.5], "slower than the baseline"),
])
def test_noise_small_gains_and_losses_are_never_recommended(cand_ips, words):
    base = side([30.0, 30.1, 29.9], [0.02] * 3)
    _, v = judge(base, side(cand_ips, [0.02] * 3), min_gain=0.05)
    assert not v["recommendable"] and words in v["note"], v["note"]


def test_overlapping_trials_are_not_recommended_even_when_significant():
    base = side([30.0, 30.0, 40.0], [0.02] * 3)  # one lucky baseline trial
    _, v = judge(base, side([50.0, 51.0, 39.0], [0.02] * 3), min_gain=0.05)
    assert not v["separated"] and not v["recommendable"]
    assert "the trials overlap" in v["note"]


def test_a_gain_the_load_may_explain_is_not_recommended():
    # the baseline ran while other processes took 60% of the CPU, the candidate on a quiet
    # machine: 1.6x more CPU for it could make a 40% gain out of nothing
    base, cand = side([30.0, 30.5, 30.2], [0.60, 0.62, 0.61]), side([42.0, 42.5, 42.3], [0.0, 0.0, 0.0])
    comp, v = judge(base, cand, min_gain=0.05)
    assert comp.significance["beyond_noise"] is True and comp.environment.may_explain is True
    assert comp.significance["significant"] is None  # #28.6: the load may explain it
    assert load_bound(base, cand) == pytest.approx(30.5 / 0.38, rel=1e-3)
    assert v["environment_explains"] and not v["recommendable"] and v["significant"] is None
    assert "the load may explain it" in v["note"]


def test_a_gain_the_load_cannot_explain_is_recommended_and_says_why():
    # both sides loaded (the environment note says so), but the candidate ran under as much
    # load and is twice as fast: a process never runs faster for having less CPU
    base, cand = side([30.0, 30.5, 30.2], [0.55, 0.50, 0.52]), side([60.0, 61.0, 62.0], [0.56, 0.60, 0.55])
    comp, v = judge(base, cand, min_gain=0.05)
    assert comp.environment.may_explain is True
    assert v["recommendable"] and not v["environment_explains"]
    assert "the load does not explain the gain" in v["note"] and "The machine was loaded" in v["note"]


def test_an_unknown_load_is_not_a_reason_to_recommend():
    base, cand = side([30.0, 30.1, 29.9], None), side([60.0, 61.0, 62.0], None)
    comp, v = judge(base, cand, min_gain=0.05)
    assert comp.environment.may_explain is None and load_bound(base, cand) is None
    assert v["recommendable"]  # the trials alone decide; the note names no load


def test_options_are_checked_and_named():
    assert TuneOptions.from_mapping({"repeat": 2, "budget_s": None}).budget_s == 1800.0
    with pytest.raises(ValueError, match="repeat=1"):
        TuneOptions(repeat=1)
    with pytest.raises(ValueError, match="unknown tune option"):
        TuneOptions.from_mapping({"trials": 3})
    for bad in (-5.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="budget_s=.*finite number > 0"):
            TuneOptions(budget_s=bad)


def test_the_table_and_the_answer_read_as_text():
    res = {"baseline": {"name": "baseline", "label": "baseline", "img_per_s": 30.0,
                        "img_per_s_std": 0.5, "n": 3, "step_ms": 1000.0, "verdict": "compute"},
           "candidates": [{"name": "batch_up", "label": "batch 32 -> 64", "img_per_s": 30.4,
                           "img_per_s_std": 1.0, "n": 3, "step_ms": 2100.0, "verdict": "compute",
                           "significant": False, "gain": 0.013, "note": "not significant"}],
           "answer": f"{NO_LEVER}: 1 candidate tried", "expected_epoch_s": 4.0,
           "baseline_epoch_s": 4.0, "train_images": 128}
    text = format_tune(res)
    assert "batch 32 -> 64" in text and "30.4 ± 1.0 (3)" in text and " no " in text
    assert f"answer: {NO_LEVER}" in text and "expected epoch time: 4.0 s" in text
