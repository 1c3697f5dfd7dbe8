"""``make gpu-check``: everything that needs a GPU, in one run, for the first GPU machine.

Checks, in order (each bounded by its own timeout; the whole run aims at under 8 minutes
on one GPU, and checks that would start past :data:`BUDGET_S` are reported as not run):

1. ``gpu_tests`` — every CUDA-only test, by path, with pytest (``-m gpu``): AMP fp16 with
   its GradScaler and bf16 without one (real training steps), CUDA-graph capture vs eager
   (same loss and gradients within tolerance), accumulation and re-capture after a region
   change, the fallback to eager on a capture failure, a capturable YOLOv9 forward, pinned
   memory batches, an Inductor-compiled training step under AMP. A skipped test counts as a failure here: on a GPU nothing should skip.
2. ``cuda_graph_yolo9-t`` and ``cuda_graph_yolox-t`` — ``bench/cuda_graph_step.py`` at batch
   8 with AMP: eager vs graphed step time and each mode's profiler verdict. The check
   passes when the bench prints its one result line; the speed-up and the project's goal
   (graph step >= 1.5x eager) are recorded next to it.
3. ``profile_launch_bound`` — the profiler on a launch-bound case (yolo9-t, imgsz 64,
   batch 1): the verdict must be ``host/launch``.
4. ``profile_compute_bound`` — the profiler on a compute-bound case (yolo9-s, imgsz 1280,
   batch 16, fp32, light augmentation, cached images): the verdict must be ``compute``.
5. ``ddp_nccl`` — ``bench/ddp_smoke.py`` under torchrun with one rank: NCCL, SyncBatchNorm,
   DDP gradients equal to the plain model's.
6. ``tensorrt_onnx`` — ``bench/tensorrt_check.py``: a TensorRT engine built from the checked
   ONNX export of yolox-n, its outputs against PyTorch on the GPU (``|trt - torch| / (1 +
   |torch|)`` <= 1e-3, TF32 off); passes as skipped where TensorRT is not installed.
7. ``gpu_loader`` — ``bench/gpu_loader.py``: img/s of the CPU loader (8 workers) against
   ``loader=gpu`` (nvjpeg decode, mosaic, affine, mixup, HSV, flips on the GPU), imgsz 640,
   batch 16; passes when the bench prints its line (the ratio is recorded).
8. ``profile_loader_cpu`` / ``profile_loader_gpu`` — the profiler on yolo9-t, imgsz 640,
   batch 16, mosaic + mixup, one loader worker: with the CPU loader the verdict must be
   ``dataloader``; with ``loader=gpu`` it must be ``compute`` or ``host/launch``.
9. ``compile_yolo9-t`` — ``bench/compile_step.py`` at batch 8 with AMP: the median step of
   eager, ``compile=True`` (Inductor, mode ``default``) and ``cuda_graph=True`` in one run,
   and the compile seconds. Passes when the compiled mode trains without falling back to
   eager; the speed-ups are recorded (no goal). Its compile takes a minute or more
   (``--only compile_yolo9-t`` runs it alone).
10. ``channels_last`` — ``bench/channels_last.py --device cuda --amp``: forward + backward of
    yolo9-t and yolox-t at 640, batch 16, in NCHW and in channels-last (the CUDA default);
    passes when the bench prints its line (the ratios are recorded, no goal).

Writes one JSON report (``--out``, default ``runs/gpu_check/gpu_check.json``: the machine,
torch, every check with ``ok``, ``seconds`` and its figures) and prints one summary line.
Datasets: coco128 when present (``$COCO128`` or ``../shared/datasets/coco128``) for the
CUDA-graph bench, else a generated synthetic set; the profiler checks always generate theirs.

A machine without a GPU gets a clean skip: ``no GPU: skipped``, exit 0 (the report says so).
Exit codes: 0 every check passed (or skipped: no GPU); 1 a check failed.

Usage: python bench/gpu_check.py [--out PATH] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: The whole run aims to stay under this (seconds); a check that would start later is not run.
BUDGET_S = 450.0

#: CUDA-only tests, by path (tests/core/test_gpu_check.py checks that every test file with a
#: CUDA-only test is listed here).
GPU_TESTS = (
    "tests/engine/test_gpu_training.py",
    "tests/engine/test_cuda_graph.py",
    "tests/engine/test_compile.py",
    "tests/models/test_yolo9_model.py",
    "tests/data/test_data_loader.py",
    "tests/data/test_gpu_loader.py",
)

#: The launch-bound profile: tiny images, one image per step: the GPU idles between kernels.
LAUNCH_BOUND = {"model": "yolo9-t", "imgsz": 64, "batch": 1, "workers": 2, "amp": True,
                "warmup": 5, "steps": 20, "images": 32}
#: The compute-bound profile: large images, fp32, light cheap augmentation, cached images.
#: (``mosaic``/``mixup``/``hsv_prob`` off and ``cache=ram``: a step's images cost a copy each,
#: so the loader cannot be what the step waits on.)
COMPUTE_BOUND = {"model": "yolo9-s", "imgsz": 1280, "batch": 16, "workers": 8, "amp": False,
                 "warmup": 3, "steps": 8, "images": 192, "cache": "ram", "mosaic": 0.0,
                 "mixup": 0.0, "hsv_prob": 0.0}
#: loader=gpu (bench/gpu_loader.py): the same mosaic + mixup training profiled with the CPU
#: loader on one worker (loader-bound) and with loader=gpu, whose worker only reads files
#: while the GPU decodes and augments: the verdict must leave ``dataloader``. Both decode
#: every image (``cache_recent_mb=0``: the 224 images at 640 would fit the CPU loader's
#: default store of recently decoded ones, which loader=gpu does not use).
LOADER_CPU = {"model": "yolo9-t", "imgsz": 640, "batch": 16, "workers": 1, "amp": True,
              "warmup": 3, "steps": 10, "images": 224, "loader": "cpu", "cache_recent_mb": 0}
LOADER_GPU = {**LOADER_CPU, "loader": "gpu"}
PROFILE_CASES: dict[str, tuple[dict[str, Any], str | tuple[str, ...]]] = {
    "launch_bound": (LAUNCH_BOUND, "host/launch"),
    "compute_bound": (COMPUTE_BOUND, "compute"),
    "loader_cpu": (LOADER_CPU, "dataloader"),
    "loader_gpu": (LOADER_GPU, ("compute", "host/launch")),
}


def _tail(text: str, n: int = 1500) -> str:
    return text[-n:] if text else ""


def _run(cmd: list[str], timeout: float, env: dict[str, str] | None = None
         ) -> tuple[int | None, str, str]:
    """``(exit code or None on timeout, stdout, stderr)`` of a child in the repo root, with
    this checkout first on ``PYTHONPATH`` (an editable install may point elsewhere)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    try:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, "PYTHONPATH": path, **(env or {})})
        return out.returncode, out.stdout, out.stderr
    except subprocess.TimeoutExpired as exc:
        def text(b: Any) -> str:
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")

        return None, text(exc.stdout), text(exc.stderr)


# -- the checks --------------------------------------------------------------------------------
def check_gpu_tests(work: Path) -> dict[str, Any]:
    """pytest -m gpu on :data:`GPU_TESTS`; ok when every selected test passed and none skipped."""
    import xml.etree.ElementTree as ET

    junit = work / "gpu_tests.xml"
    rc, out, err = _run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p",
                         "no:cacheprovider", f"--junitxml={junit}", *GPU_TESTS], timeout=240)
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failed: list[str] = []
    if junit.is_file():
        for suite in ET.parse(junit).getroot().iter("testsuite"):
            for k in counts:
                counts[k] += int(suite.get(k, 0))
            for case in suite.iter("testcase"):
                if any(child.tag in ("failure", "error", "skipped") for child in case):
                    failed.append(f"{case.get('classname')}::{case.get('name')}")
    ok = (rc == 0 and counts["tests"] > 0 and not counts["skipped"]
          and not counts["failures"] and not counts["errors"])
    return {"ok": ok, "exit_code": rc, **counts, "not_passed": failed,
            "detail": _tail(out) if not ok else out.strip().splitlines()[-1:]}


def _coco128_or_sample(work: Path) -> Path:
    src = Path(os.environ.get("COCO128", ROOT.parent / "shared" / "datasets" / "coco128"))
    if (src / "coco128.yaml").is_file():
        return Path()  # the bench copies coco128 itself
    return _sample(work / "graph_ds", n_train=128, imgsz=320)


def _sample(out: Path, n_train: int, imgsz: int) -> Path:
    from libreyolo_core.data.sample import generate_sample_dataset

    if (out / "data.yaml").is_file():
        return out / "data.yaml"
    return generate_sample_dataset(out, n_train=n_train, n_val=4, imgsz=imgsz, seed=0)


def check_cuda_graph(work: Path, model: str) -> dict[str, Any]:
    """``bench/cuda_graph_step.py --model MODEL --batch 8`` (AMP); its one result line."""
    data = _coco128_or_sample(work)
    cmd = [sys.executable, "bench/cuda_graph_step.py", "--model", model, "--batch", "8"]
    if data != Path():
        cmd += ["--data", str(data)]
    rc, out, err = _run(cmd, timeout=150)
    lines = [ln for ln in out.splitlines() if ln.startswith("cuda_graph_step ")]
    res: dict[str, Any] = {"ok": rc == 0 and len(lines) == 1, "exit_code": rc,
                           "line": lines[-1] if lines else None,
                           "dataset": "coco128" if data == Path() else "synthetic"}
    m = re.search(r"eager ([\d.]+) ms \[([^\]]*)\] \| cuda_graph ([\d.]+) ms \[([^\]]*)\] \| "
                  r"speed-up ([\d.]+)x", lines[-1]) if lines else None
    if m:
        res.update(eager_ms=float(m[1]), eager_verdict=m[2], graph_ms=float(m[3]),
                   graph_verdict=m[4], speedup=float(m[5]), goal=1.5,
                   goal_met=float(m[5]) >= 1.5)
    if not res["ok"]:
        res["detail"] = _tail(err)
    return res


def check_compile(work: Path, model: str) -> dict[str, Any]:
    """``bench/compile_step.py --model MODEL --batch 8`` (AMP): median step ms eager,
    ``compile=True`` and ``cuda_graph=True`` in one run, and the compile seconds. Passes when
    the bench prints its line (the compiled mode did not fall back to eager); the speed-ups
    are recorded, no goal is set."""
    data = _coco128_or_sample(work)
    cmd = [sys.executable, "bench/compile_step.py", "--model", model, "--batch", "8"]
    if data != Path():
        cmd += ["--data", str(data)]
    rc, out, err = _run(cmd, timeout=420)
    lines = [ln for ln in out.splitlines() if ln.startswith("compile_step ")]
    res: dict[str, Any] = {"ok": rc == 0 and len(lines) == 1, "exit_code": rc,
                           "line": lines[-1] if lines else None,
                           "dataset": "coco128" if data == Path() else "synthetic"}
    m = re.search(r"eager ([\d.]+) ms \| compile ([\d.]+) ms \(([\d.]+)x, compiled in ([\d.]+) s"
                  r".*\| cuda_graph ([\d.]+) ms \(([\d.]+)x\)", lines[-1]) if lines else None
    if m:
        res.update(eager_ms=float(m[1]), compile_ms=float(m[2]), compile_speedup=float(m[3]),
                   compile_s=float(m[4]), graph_ms=float(m[5]), graph_speedup=float(m[6]))
    if not res["ok"]:
        res["detail"] = _tail(err)
    return res


def check_profile(work: Path, name: str) -> dict[str, Any]:
    """One profile trial of :data:`PROFILE_CASES` ``name`` in a child process (bounded by a
    timeout); ok when its verdict is the expected one."""
    rc, out, err = _run([sys.executable, str(Path(__file__).resolve()), "--profile-case", name,
                         "--work", str(work)], timeout=180)
    line = next((ln for ln in reversed(out.splitlines()) if ln.startswith("{")), None)
    res: dict[str, Any] = json.loads(line) if line else {"ok": False}
    res["exit_code"] = rc
    if not res.get("ok"):
        res["detail"] = _tail(err)
    return res


def profile_case(work: Path, name: str) -> dict[str, Any]:
    """Run one profile case here (the child of :func:`check_profile`): a trial through
    :func:`libreyolo_core.profiler.trial.run_trial` on a generated dataset."""
    from libreyolo_core.profiler.trial import run_trial

    case, expect = PROFILE_CASES[name]
    keys = {k: v for k, v in case.items() if k not in ("model", "warmup", "steps", "images")}
    data = _sample(work / f"{name}_ds", n_train=case["images"], imgsz=min(case["imgsz"], 320))
    log = work / f"{name}.log"
    with open(log, "w", encoding="utf-8") as fh:
        r = run_trial(data, case["model"], project=work / "profiles", name=name,
                      warmup=case["warmup"], steps=case["steps"], stdout=fh, device="0", **keys)
    return {"ok": r.verdict in ((expect,) if isinstance(expect, str) else expect),
            "expect": expect, "verdict": r.verdict,
            "bound_why": r.bound_why, "step_ms": r.step_ms, "img_per_s": r.img_per_s,
            "gpu_util": r.gpu_util, "dataload_frac": r.dataload_frac,
            "reliable": r.reliable, "confidence": r.confidence and r.confidence.to_dict(),
            "case": case, "profile": str(r.profile_path)}


def check_gpu_loader(work: Path) -> dict[str, Any]:
    """``bench/gpu_loader.py`` on the GPU: img/s of the CPU loader (8 workers) and of
    ``loader=gpu`` (2 file-reading workers), imgsz 640, batch 16, mosaic + mixup; its one line."""
    cmd = [sys.executable, "bench/gpu_loader.py", "--device", "cuda", "--workers", "8",
           "--gpu-workers", "2"]  # coco128 when found, else its own synthetic set
    rc, out, err = _run(cmd, timeout=120)
    lines = [ln for ln in out.splitlines() if ln.startswith("gpu_loader ")]
    res: dict[str, Any] = {"ok": rc == 0 and len(lines) == 1, "exit_code": rc,
                           "line": lines[-1] if lines else None}
    m = re.search(r"\) ([\d.]+) img/s \| loader=gpu .*?\) ([\d.]+) img/s \(ratio ([\d.]+)x\)",
                  lines[-1]) if lines else None
    if m:
        res.update(cpu_img_s=float(m[1]), gpu_img_s=float(m[2]), ratio=float(m[3]))
    if not res["ok"]:
        res["detail"] = _tail(err)
    return res


def check_ddp(work: Path) -> dict[str, Any]:
    """``bench/ddp_smoke.py`` under torchrun, one rank (NCCL)."""
    rc, out, err = _run([sys.executable, "-m", "libreyolo_core.distributed.torchrun",
                         "--standalone", "--nproc_per_node=1", "bench/ddp_smoke.py"], timeout=120)
    line = next((ln for ln in reversed(out.splitlines()) if ln.startswith("{")), None)
    res: dict[str, Any] = json.loads(line) if line else {}
    res["ok"] = rc == 0 and bool(res.get("ok"))
    res["exit_code"] = rc
    if not res["ok"]:
        res["detail"] = _tail(err)
    return res


def check_tensorrt(work: Path) -> dict[str, Any]:
    """``bench/tensorrt_check.py``: a TensorRT engine built from our checked ONNX export,
    compared with PyTorch on the GPU; ok and ``skipped`` when TensorRT is not installed."""
    rc, out, err = _run([sys.executable, "bench/tensorrt_check.py"], timeout=240)
    line = next((ln for ln in reversed(out.splitlines()) if ln.startswith("{")), None)
    res: dict[str, Any] = json.loads(line) if line else {}
    res["ok"] = rc == 0 and bool(res.get("ok"))
    res["exit_code"] = rc
    if not res["ok"]:
        res["detail"] = _tail(err)
    return res


def check_channels_last() -> dict[str, Any]:
    """``bench/channels_last.py --device cuda --amp`` on yolo9-t and yolox-t at 640, batch
    16: median forward + backward ms in NCHW and channels-last, and the ratios."""
    cmd = [sys.executable, "bench/channels_last.py", "--device", "cuda", "--amp", "--batch", "16",
           "--models", "yolo9-t@640,yolox-t@640", "--steps", "10", "--warmup", "3"]
    rc, out, err = _run(cmd, timeout=180)
    lines = [ln for ln in out.splitlines() if ln.startswith("channels_last ")]
    res: dict[str, Any] = {"ok": rc == 0 and len(lines) == 1, "exit_code": rc,
                           "line": lines[-1] if lines else None}
    if lines:
        res["ratios"] = {m[1]: float(m[2]) for m in
                         re.finditer(r"(\S+)@\d+ b\d+ [\d.]+ -> [\d.]+ ms \(([\d.]+)x\)", lines[-1])}
    if not res["ok"]:
        res["detail"] = _tail(err)
    return res


def checks(work: Path) -> list[tuple[str, Callable[[], dict[str, Any]]]]:
    """The checks in run order: ``(name, fn)``."""
    return [
        ("gpu_tests", lambda: check_gpu_tests(work)),
        ("cuda_graph_yolo9-t", lambda: check_cuda_graph(work, "yolo9-t")),
        ("cuda_graph_yolox-t", lambda: check_cuda_graph(work, "yolox-t")),
        ("profile_launch_bound", lambda: check_profile(work, "launch_bound")),
        ("profile_compute_bound", lambda: check_profile(work, "compute_bound")),
        ("ddp_nccl", lambda: check_ddp(work)),
        ("tensorrt_onnx", lambda: check_tensorrt(work)),
        ("gpu_loader", lambda: check_gpu_loader(work)),
        ("profile_loader_cpu", lambda: check_profile(work, "loader_cpu")),
        ("profile_loader_gpu", lambda: check_profile(work, "loader_gpu")),
        ("compile_yolo9-t", lambda: check_compile(work, "yolo9-t")),
        ("channels_last", check_channels_last),
    ]


def _summary(report: dict[str, Any]) -> str:
    res = report["checks"]
    bad = [n for n, r in res.items() if not r.get("ok")]
    parts = [f"gpu_check {report['gpu']}: {len(res) - len(bad)}/{len(res)} checks passed in "
             f"{report['seconds']:.0f} s"]
    if bad:
        parts.append("failed: " + ", ".join(bad))
    speed = [f"{n.removeprefix('cuda_graph_')} {r['speedup']:.2f}x"
             for n, r in res.items() if n.startswith("cuda_graph_") and "speedup" in r]
    if speed:
        parts.append("graph speed-up " + ", ".join(speed) + " (goal >= 1.5x)")
    comp = [f"{n.removeprefix('compile_')} {r['compile_speedup']:.2f}x (graph "
            f"{r['graph_speedup']:.2f}x, compiled in {r['compile_s']:.0f} s)"
            for n, r in res.items() if n.startswith("compile_") and "compile_speedup" in r]
    if comp:
        parts.append("compile speed-up " + ", ".join(comp))
    verdicts = [f"{n.removeprefix('profile_')} -> {r.get('verdict')}"
                for n, r in res.items() if n.startswith("profile_") and "verdict" in r]
    if verdicts:
        parts.append("; ".join(verdicts))
    if "ratio" in res.get("gpu_loader", {}):
        parts.append(f"loader=gpu {res['gpu_loader']['ratio']:.2f}x the CPU loader's img/s")
    return "; ".join(parts) + f" -> {report['out']}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "runs" / "gpu_check" / "gpu_check.json"))
    ap.add_argument("--only", nargs="*", default=None, help="run only these checks (names)")
    ap.add_argument("--profile-case", choices=sorted(PROFILE_CASES), help=argparse.SUPPRESS)
    ap.add_argument("--work", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.profile_case:  # the child process of check_profile
        sys.path.insert(0, str(ROOT))
        print(json.dumps(profile_case(Path(args.work), args.profile_case), default=str))
        return 0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))

    import torch

    report: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(),
                              "host": platform.node(), "out": str(out)}
    if not torch.cuda.is_available():
        report.update(status="skipped", reason="no GPU", checks={})
        out.write_text(json.dumps(report, indent=1), encoding="utf-8")
        print("no GPU: skipped (make gpu-check needs a CUDA device; nothing was run)")
        return 0
    report.update(gpu=torch.cuda.get_device_name(0), gpus=torch.cuda.device_count(),
                  cuda=torch.version.cuda, status="ran", checks={})
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        for name, fn in checks(work):
            if args.only and name not in args.only:
                continue
            if time.perf_counter() - t0 > BUDGET_S:
                report["checks"][name] = {"ok": False, "detail": "not run: the time budget "
                                          f"({BUDGET_S:.0f} s) was spent"}
                continue
            print(f"gpu_check: {name} ...", file=sys.stderr, flush=True)
            start = time.perf_counter()
            try:
                res = fn()
            except Exception as exc:  # noqa: BLE001 - one failed check never stops the others
                res = {"ok": False, "detail": f"{type(exc).__name__}: {exc}"}
            res["seconds"] = round(time.perf_counter() - start, 1)
            report["checks"][name] = res
            print(f"gpu_check: {name} {'ok' if res.get('ok') else 'FAILED'} "
                  f"({res['seconds']} s)", file=sys.stderr, flush=True)
            report["seconds"] = round(time.perf_counter() - t0, 1)
            out.write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    report["seconds"] = round(time.perf_counter() - t0, 1)
    report["ok"] = all(r.get("ok") for r in report["checks"].values())
    out.write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    print(_summary(report), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
