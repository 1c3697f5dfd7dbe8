"""Trace mining on a hand-made GPU trace (no GPU here) and on CPU op names."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from libreyolo_core.profiler.analysis import (
    analysis_window,
    analyze_trace,
    categorize,
    friendly_kernel_name,
    is_tensorcore,
    self_times,
)
from libreyolo_core.profiler.artifacts import build_profile
from libreyolo_core.profiler.cli import main
from libreyolo_core.profiler.timeline import (
    MAX_CPU_EVENTS,
    MAX_GPU_EVENTS,
    render_timeline,
    timeline_data,
)

HARNESS = Path(__file__).with_name("js_harness.js")


@pytest.mark.parametrize(
    "name, cat",
    [
        ("void cudnn::bn_bw_1C11_kernel_new<float>(float)", "reduction / norm"),
        ("void nchwToNhwcKernel<float>(int)", "layout / copy"),
        ("sm80_xmma_fprop_implicit_gemm_f32", "gemm / conv"),
        ("void at::native::CatArrayBatchedCopy<float>(int)", "layout / copy"),
        ("void at::native::vectorized_elementwise_kernel<4>(int)", "elementwise"),
        ("void at::native::multi_tensor_apply_kernel<3>(int)", "other"),
        ("aten::convolution_backward", "gemm / conv"),
        ("aten::addmm", "gemm / conv"),
        ("aten::native_batch_norm", "reduction / norm"),
        ("aten::sum", "reduction / norm"),
        ("aten::cat", "layout / copy"),
        ("aten::copy_", "layout / copy"),
        ("aten::add_", "elementwise"),
        ("aten::_foreach_mul_", "elementwise"),
        ("aten::max_pool2d_with_indices", "other"),
    ],
)
def test_categories(name, cat):
    assert categorize(name) == cat


def test_kernel_names():
    raw = "void at::native::vectorized_elementwise_kernel<4, at::native::SiLU>(int, float)"
    assert friendly_kernel_name(raw) == "vectorized_elementwise_kernel"
    assert friendly_kernel_name("sm80_xmma_wgrad") == "sm80_xmma_wgrad"
    assert is_tensorcore("cutlass_80_tensorop_s1688gemm_128x128") and not is_tensorcore(
        "sm80_xmma_wgrad"
    )


def test_self_times_subtract_nested_ops():
    ops = [
        {"name": "a", "ts": 0, "dur": 400, "tid": 1},
        {"name": "b", "ts": 10, "dur": 300, "tid": 1},
        {"name": "c", "ts": 20, "dur": 200, "tid": 1},
        {"name": "d", "ts": 500, "dur": 50, "tid": 1},
        {"name": "e", "ts": 15, "dur": 100, "tid": 2},
    ]
    got = {e["name"]: (s, d) for e, s, d in self_times(ops)}
    assert got == {"a": (100, 0), "b": (100, 1), "c": (200, 2), "d": (50, 0), "e": (100, 0)}


def test_window_skips_two_cold_steps(gpu_trace):
    events = [e for e in gpu_trace["traceEvents"] if e["ph"] == "X"]
    start, end, steps = analysis_window(events)
    assert (start, end, steps) == (21_000.0, 41_000.0, 2)
    short = [e for e in events if e["name"] not in ("ProfilerStep#8", "ProfilerStep#9")]
    assert analysis_window(short)[2] == 3  # fewer than 4 markers: the whole span


def test_gpu_trace_mining(gpu_trace):
    a = analyze_trace(gpu_trace)
    assert a["has_gpu"] and a["window"]["steps"] == 2
    assert a["gpu_busy_ms_per_step"] == pytest.approx(5.3)
    assert a["kernels_per_step"] == 6 and a["unique_kernels"] == 6
    assert a["mean_kernel_us"] == pytest.approx(5300 / 6, rel=1e-3)
    assert a["memcpy_ms_per_step"] == pytest.approx(0.3)
    assert a["cuda_mallocs_per_step"] == pytest.approx(3.0)
    assert a["tensorcore_pct"] == pytest.approx(100 * 1500 / 5300, rel=1e-3)
    cats = {c["name"]: c["ms_per_step"] for c in a["categories"]}
    assert cats == pytest.approx(
        {"gemm / conv": 3.5, "reduction / norm": 1.1, "elementwise": 0.5, "other": 0.2}
    )
    phases = {r["phase"]: r for r in a["phases"]}
    assert list(phases) == ["forward", "backward", "optimizer"]
    assert phases["forward"]["gpu_ms_per_step"] == pytest.approx(2.0)
    assert phases["backward"]["gpu_ms_per_step"] == pytest.approx(3.0)
    # the reduce kernel runs during the next step but was launched in optimizer
    assert phases["optimizer"]["gpu_ms_per_step"] == pytest.approx(0.3)
    assert {r["kernel"] for r in a["kernels_by_phase"]["optimizer"]} == {
        "multi_tensor_apply_kernel",
        "reduce_kernel",
    }
    top = a["kernels"][0]
    assert top["kernel"] == "sm80_xmma_wgrad_implicit_gemm_indexed_f32f32_nhwckrsc"
    assert top["ms_per_step"] == pytest.approx(2.0) and top["count_per_step"] == 1
    assert top["pct_of_gpu"] == pytest.approx(100 * 2000 / 5300, rel=1e-3)
    assert len(top["raw_name"]) <= 90
    ops = {r["op"]: r["ms_per_step"] for r in a["ops"]}
    assert ops["aten::cudnn_convolution"] == pytest.approx(0.2)
    assert ops["aten::conv2d"] == pytest.approx(0.1) and a["ops_per_step"] == 4


def test_gpu_profile_verdict_and_timeline(gpu_trace, tmp_path):
    a = analyze_trace(gpu_trace)
    real = {
        "step_ms": 10.0,
        "dataload_ms": 1.0,
        "dataload_frac": 0.1,
        "compute_ms": 9.0,
        "img_per_s": 800.0,
    }
    p = build_profile(
        meta={"model": "YOLOv9-t", "batch": 8, "amp": False},
        window={"warmup": 5},
        real=real,
        composition_ms={"forward": 3.0},
        analysis=a,
        device_type="cuda",
        peak_vram_mb=123.4,
    )
    assert p.bound == "host/launch" and p.gpu_util == pytest.approx(0.53)
    assert p.host_overhead_ms_per_step == pytest.approx(10 - 5.3 - 1)
    assert p.launches_per_step == 6 and len(p.top_kernels) == 6
    assert any("fp32" in n for n in p.notes)
    assert p.metrics["backward_gpu_ms"] == pytest.approx(3.0)
    html = render_timeline(p.to_dict(), gpu_trace)
    assert not re.search(r"https?://", html)
    tl = timeline_data(gpu_trace)
    assert set(tl["lanes"]) == {
        "phase · CPU",
        "CPU ops",
        "phase · GPU",
        "GPU kernels",
        "GPU memcpy",
    }
    assert len(tl["flows"]) == 30 and len(tl["steps"]) == 5
    if shutil.which("node"):
        (tmp_path / "t.html").write_text(html)
        out = subprocess.run(
            ["node", str(HARNESS), str(tmp_path / "t.html")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("ok 5")


def test_timeline_caps_events():
    ev = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": f"aten::op{i % 50}",
            "ts": i * 100.0,
            "dur": 30.0 + i % 7,
            "tid": 1,
        }
        for i in range(4000)
    ]
    ev += [
        {
            "ph": "X",
            "cat": "kernel",
            "name": f"k{i % 9}",
            "ts": i * 10.0,
            "dur": 3.0 + i % 5,
            "tid": 0,
        }
        for i in range(6000)
    ]
    tl = timeline_data({"traceEvents": ev})
    assert len(tl["lanes"]["CPU ops"]) == MAX_CPU_EVENTS
    assert len(tl["lanes"]["GPU kernels"]) == MAX_GPU_EVENTS
    assert len(tl["names"]) == 59  # a names table, not one string per event


def test_readers_on_a_raw_gpu_trace(gpu_trace_file, capsys):
    assert main(["kernels", str(gpu_trace_file), "--json", "--phase", "backward"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["kernel"] for r in rows] == [
        "sm80_xmma_wgrad_implicit_gemm_indexed_f32f32_nhwckrsc",
        "bn_bw_1C11_kernel_new",
    ]
    assert main(["kernels", str(gpu_trace_file), "--json", "--tensorcore"]) == 0
    assert len(json.loads(capsys.readouterr().out)["rows"]) == 1
    assert (
        main(["kernels", str(gpu_trace_file), "--json", "--category", "gemm", "--sort", "name"])
        == 0
    )
    names = [r["kernel"] for r in json.loads(capsys.readouterr().out)["rows"]]
    assert names == [
        "cutlass_80_tensorop_s1688gemm_128x128_32x3_nhwc",
        "sm80_xmma_wgrad_implicit_gemm_indexed_f32f32_nhwckrsc",
    ]
    assert main(["kernels", str(gpu_trace_file), "--grep", "BN_BW", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["rows"]) == 1
    assert main(["kernels", str(gpu_trace_file), "--phase", "nope"]) == 2
    assert "valid phases: dataload, forward, backward, optimizer" in capsys.readouterr().err
    assert main(["summary", str(gpu_trace_file)]) == 0
    out = capsys.readouterr().out
    assert "GPU util" in out and "verdict: host/launch" in out
    bad = gpu_trace_file.with_name("bad.json")
    bad.write_text('{"hello": 1}')
    assert main(["summary", str(bad)]) == 1


@pytest.mark.parametrize("fits", [True, False, None])
def test_a_set_that_fits_the_recent_store_is_noted(fits):
    """Only a set whose every image fits ``cache_recent_mb`` loads faster after the first
    epoch (False: it does not fit; None: no store)."""
    from libreyolo_core.profiler.artifacts import _notes

    notes = _notes("cpu", {"cache_recent_fits": fits}, None, None)
    assert any("later epochs decode none" in n for n in notes) is bool(fits)
