"""Fixtures of the profiler tests: a small dataset, one real CPU profile run, a GPU trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

#: Step length and layout of the hand-made GPU trace (µs).
STEP_US = 10_000.0
T0 = 1_000.0


def _x(cat: str, name: str, ts: float, dur: float, **args) -> dict:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 1,
        "tid": 7 if cat != "kernel" else 0,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def make_gpu_trace() -> dict:
    """A small Chrome trace shaped like torch.profiler's on CUDA: 5 steps (#5..#9).

    Per step (offsets from the step start): phases dataload [0, 1000), forward [1000, 4000),
    backward [4000, 8000), optimizer [8000, 9000); kernels (launch -> kernel):
    TC gemm 1500 µs and elementwise 500 µs in forward, cudnn bn_bw 1000 µs and implicit-gemm
    wgrad 2000 µs in backward, multi_tensor_apply 200 µs in optimizer, and a reduce kernel
    100 µs launched in optimizer that runs after the next step has started. A 300 µs memcpy.
    Step index 2 (the first analysed step) also holds 6 cudaMalloc calls.
    The analysis window is steps 2 and 3, so per step: busy 5.3 ms, 6 kernels.
    """
    ev: list[dict] = []
    corr = 0

    def launch(ts: float, kname: str, kts: float, kdur: float, cat: str = "kernel") -> None:
        nonlocal corr
        corr += 1
        ev.append(
            _x(
                "cuda_runtime",
                "cudaLaunchKernel" if cat == "kernel" else "cudaMemcpyAsync",
                ts,
                5.0,
                correlation=corr,
            )
        )
        ev.append(_x(cat, kname, kts, kdur, correlation=corr))
        ev.append({"ph": "s", "cat": "ac2g", "id": corr, "ts": ts, "pid": 1, "tid": 7})

    for k in range(5):
        s = T0 + k * STEP_US
        ev.append(_x("user_annotation", f"ProfilerStep#{5 + k}", s, STEP_US - 10))
        for name, a, b in (
            ("dataload", 0, 1000),
            ("forward", 1000, 4000),
            ("backward", 4000, 8000),
            ("optimizer", 8000, 9000),
        ):
            ev.append(_x("user_annotation", f"step/{name}", s + a, b - a))
            ev.append(_x("gpu_user_annotation", f"step/{name}", s + a + 50, b - a))
        # nested CPU ops in forward: self times 100, 100, 200
        ev.append(_x("cpu_op", "aten::conv2d", s + 1100, 400))
        ev.append(_x("cpu_op", "aten::convolution", s + 1110, 300))
        ev.append(_x("cpu_op", "aten::cudnn_convolution", s + 1120, 200))
        ev.append(_x("cpu_op", "aten::silu_", s + 1600, 50))
        launch(s + 1010, "Memcpy HtoD (Pinned -> Device)", s + 1050, 300, cat="gpu_memcpy")
        launch(
            s + 1100,
            "void cutlass_80_tensorop_s1688gemm_128x128_32x3_nhwc<float>(Params)",
            s + 1200,
            1500,
        )
        launch(
            s + 1500,
            "void at::native::vectorized_elementwise_kernel<4, at::native::SiLU>"
            "(int, at::native::SiLU, at::detail::Array<char*, 2>)",
            s + 2800,
            500,
        )
        launch(
            s + 4100,
            "void cudnn::bn_bw_1C11_kernel_new<float, float, float2>(float)",
            s + 4200,
            1000,
        )
        launch(s + 4500, "sm80_xmma_wgrad_implicit_gemm_indexed_f32f32_nhwckrsc", s + 5300, 2000)
        launch(
            s + 8100,
            "void at::native::multi_tensor_apply_kernel<TensorListMetadata<3>>(int)",
            s + 8200,
            200,
        )
        launch(
            s + 8500,
            "void at::native::reduce_kernel<512, 1, ReduceOp<float>>(ReduceOp)",
            s + STEP_US + 100,
            100,
        )
        if k == 2:
            for j in range(6):
                ev.append(_x("cuda_runtime", "cudaMalloc", s + 1020 + j, 2.0))
    ev.append({"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}})
    return {"schemaVersion": 1, "traceEvents": ev}


@pytest.fixture
def gpu_trace() -> dict:
    return make_gpu_trace()


@pytest.fixture
def gpu_trace_file(tmp_path) -> Path:
    path = tmp_path / "gpu" / "profile_trace.json"
    path.parent.mkdir()
    path.write_text(json.dumps(make_gpu_trace()))
    return path


@pytest.fixture(scope="session")
def small_yaml(tmp_path_factory) -> Path:
    """24 synthetic training images at 128 px (6 batches of 4: an epoch holds a 2 + 4 window)."""
    from libreyolo_core.data.sample import generate_sample_dataset

    return generate_sample_dataset(
        tmp_path_factory.mktemp("prof_ds"), n_train=24, n_val=4, imgsz=128, seed=0
    )


@pytest.fixture(scope="session")
def profiled_run(small_yaml, tmp_path_factory) -> Path:
    """One real CPU profile run through ``libreyolo profile run`` (warmup 2, steps 4: the
    whole first epoch)."""
    from libreyolo_core.profiler.cli import main

    project = tmp_path_factory.mktemp("prof_runs")
    rc = main(
        [
            "run",
            str(small_yaml),
            "--imgsz",
            "128",
            "--batch",
            "4",
            "--workers",
            "0",
            "--warmup",
            "2",
            "--steps",
            "4",
            "--device",
            "cpu",
            "--project",
            str(project),
        ]
    )
    assert rc == 0
    return project / "prof"
