"""The measurement window and the hooks the trainer calls while it is open.

Window (reference A.1/A.2): ``warmup`` steps are discarded, then ``steps`` steps are
measured (``steps`` clamped to at least 2). With gradient accumulation both are rounded
**up** to a multiple of the accumulation factor so the window holds whole optimizer steps.
A *step* is one micro-batch: one ``step_end()`` call.

The first ``half = max(1, steps // 2)`` measured steps run without extra synchronisation:
their wall time (from the start of the blocking ``next(loader)`` to ``step_end``) and data
wait drive the verdict and img/s. The remaining steps bracket every phase with
``torch.cuda.synchronize()`` (CUDA only) to attribute time to phases ("composition").

A ``torch.profiler`` trace covers the window (schedule ``wait=0, warmup=warmup,
active=steps``), with every phase labelled ``step/<phase>``. A trace failure logs one
warning and the window goes on without a trace; it never breaks training.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = ["TrainingProfiler", "ProfileWindowError", "Window", "plan_window", "StepRecord",
           "quiet_kineto"]

log = logging.getLogger(__name__)


def quiet_kineto(cuda: bool) -> None:
    """Keep torch.profiler's C++ side (Kineto) from printing lines that look like errors.

    On a CPU run Kineto still probes for a GPU and writes ``ERROR: ... gpuGetDeviceCount
    failed with code 35`` and ``USDT: ... profiler_start`` / ``profiler_stop`` markers to
    stderr; none of them is a problem, so they are silenced (``KINETO_LOG_LEVEL=6``, read
    when the first profiler starts; a value the user set wins). On a GPU run Kineto's own
    errors matter and stay; its USDT markers are explained once in the log instead.
    """
    if not cuda:
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    elif "KINETO_LOG_LEVEL" not in os.environ:
        log.info("profiler: the 'USDT: ... profiler_start/profiler_stop' lines on stderr are "
                 "torch.profiler's window markers, not errors")

_NULL = contextlib.nullcontext()
MIN_STEPS = 2


class ProfileWindowError(ValueError):
    """The run has fewer steps than the profile window needs (warmup + steps)."""

    def __init__(self, needed: int, available: int, batch: int):
        self.needed, self.available, self.batch = needed, available, batch
        super().__init__(
            f"the profile window needs {needed} steps (warmup + steps) but the run only has "
            f"{available} at batch {batch}. Ways out: a bigger dataset, fewer --steps "
            "(profile_steps), or a smaller --batch"
        )


@dataclass(frozen=True)
class Window:
    """Planned window. All counts are micro-batches.

    Attributes:
        warmup: steps discarded. steps: steps measured. half: unsynced measured steps (the
        rest are synced). accumulate: the accumulation factor used for rounding.
        requested: ``(warmup, steps)`` as asked before clamping/rounding.
    """

    warmup: int
    steps: int
    half: int
    accumulate: int = 1
    requested: tuple[int, int] = (0, 0)

    @property
    def total(self) -> int:
        """Steps from the first fetch to the end of the window."""
        return self.warmup + self.steps


def plan_window(warmup: int, steps: int, accumulate: int = 1) -> Window:
    """Clamp ``steps`` to >= 2 and round both up to a multiple of ``accumulate`` (if > 1)."""
    acc = max(int(accumulate), 1)
    w, s = max(int(warmup), 0), max(int(steps), MIN_STEPS)
    if acc > 1:
        w, s = acc * math.ceil(w / acc), acc * math.ceil(s / acc)
    return Window(
        warmup=w, steps=s, half=max(1, s // 2), accumulate=acc, requested=(int(warmup), int(steps))
    )


@dataclass
class StepRecord:
    """Wall-clock figures of one micro-batch, milliseconds.

    ``kind`` is ``warmup``, ``unsynced`` or ``synced``; ``wall_ms`` runs from the start of
    the blocking ``next(loader)`` to ``step_end``; ``dataload_ms`` is the time blocked in
    ``next``; ``phases`` the time inside each ``phase(name)`` block (synced ones include
    their synchronisation).
    """

    index: int
    kind: str
    wall_ms: float = 0.0
    dataload_ms: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)


class TrainingProfiler:
    """Profile a window of real training steps, then write the artifacts (``finish``).

    Args:
        cfg: the run's TrainConfig (``profile_warmup``, ``profile_steps``, ``profile_trace``,
            ``profile_open`` are read).
        device: the training device; synchronisation happens only on CUDA.
        batch: images per micro-batch. accumulate: micro-batches per optimizer step.
        steps_available: micro-batches the run will perform (``len(loader) * epochs left``).
        meta: environment recorded in the artifacts (model, device, batch, imgsz, amp, ...).

    Raises:
        ProfileWindowError: ``steps_available`` cannot fill ``warmup + steps``.
    """

    def __init__(
        self,
        cfg: Any,
        *,
        device: torch.device | str = "cpu",
        batch: int = 1,
        accumulate: int = 1,
        steps_available: int | None = None,
        meta: dict[str, Any] | None = None,
    ):
        self.window = plan_window(
            getattr(cfg, "profile_warmup", 5), getattr(cfg, "profile_steps", 20), accumulate
        )
        if accumulate > 1 and self.window.requested != (self.window.warmup, self.window.steps):
            log.info(
                "profile window rounded up to whole accumulation windows (x%d): warmup %d, "
                "steps %d",
                accumulate,
                self.window.warmup,
                self.window.steps,
            )
        if steps_available is not None and steps_available < self.window.total:
            raise ProfileWindowError(self.window.total, int(steps_available), int(batch))
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.batch = int(batch)
        self.accumulate = max(int(accumulate), 1)
        self.want_trace = bool(getattr(cfg, "profile_trace", True))
        self.open_browser = bool(getattr(cfg, "profile_open", False))
        self.meta = dict(meta or {})
        self.records: list[StepRecord] = []
        self.done = False
        self._current = StepRecord(0, self._kind(0))
        self._fetch_start: float | None = None
        self._torch_prof = None
        self._trace_dir: str | None = None
        self._trace_file: str | None = None
        self.trace_error: str | None = None
        self.peak_vram_mb: float | None = None
        self._summary: dict[str, Any] | None = None

    # -- window bookkeeping -------------------------------------------------------------
    def _kind(self, index: int) -> str:
        w = self.window
        if index < w.warmup:
            return "warmup"
        return "unsynced" if index < w.warmup + w.half else "synced"

    @property
    def synced(self) -> bool:
        """Whether the current step brackets its phases with synchronisation."""
        return self._current.kind == "synced" and not self.done

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    # -- torch.profiler -----------------------------------------------------------------
    def _start_trace(self) -> None:
        if not self.want_trace or self._torch_prof is not None or self.trace_error:
            return
        try:
            from torch.profiler import ProfilerActivity, profile, schedule

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            quiet_kineto(self.cuda)
            self._trace_dir = tempfile.mkdtemp(prefix="libreyolo-trace-")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._torch_prof = profile(
                    activities=acts,
                    schedule=schedule(
                        wait=0, warmup=self.window.warmup, active=self.window.steps, repeat=1
                    ),
                    on_trace_ready=self._trace_ready,
                    record_shapes=False,
                    with_stack=False,
                    profile_memory=False,
                )
                self._torch_prof.start()
        except Exception as exc:  # noqa: BLE001 - a trace failure never breaks training
            self._trace_failed(exc)

    def _trace_ready(self, prof: Any) -> None:
        path = os.path.join(self._trace_dir or tempfile.gettempdir(), "profile_trace.json")
        prof.export_chrome_trace(path)
        self._trace_file = path

    def _trace_failed(self, exc: BaseException) -> None:
        self.trace_error = f"{type(exc).__name__}: {exc}"
        log.warning("profiler trace disabled (%s); the window goes on without it", self.trace_error)
        prof, self._torch_prof = self._torch_prof, None
        if prof is not None:
            with contextlib.suppress(Exception):
                prof.stop()

    def _label(self, name: str):
        if self._torch_prof is None:
            return _NULL
        return torch.profiler.record_function(f"step/{name}")

    # -- hooks the trainer calls --------------------------------------------------------
    def wrap_loader(self, loader: Iterable) -> Iterator:
        """Yield ``loader``'s batches, timing each blocking ``next()`` as ``step/dataload``.

        Once the window is over the generator passes batches straight through.
        """
        it = iter(loader)
        while True:
            if self.done:
                yield from it
                return
            if not self.records and self._fetch_start is None:
                self._start_window()
            t0 = time.perf_counter()
            with self._label("dataload"):
                try:
                    batch = next(it)
                except StopIteration:
                    return
            self._fetch_start = t0
            self._current.dataload_ms += (time.perf_counter() - t0) * 1e3
            yield batch

    def _start_window(self) -> None:
        if self.cuda:
            with contextlib.suppress(Exception):
                torch.cuda.reset_peak_memory_stats(self.device)
        self._start_trace()

    @contextlib.contextmanager
    def _timed(self, name: str):
        sync = self.synced
        if sync:
            self._sync()
        t0 = time.perf_counter()
        try:
            with self._label(name):
                yield
        finally:
            if sync:
                self._sync()
            ms = (time.perf_counter() - t0) * 1e3
            self._current.phases[name] = self._current.phases.get(name, 0.0) + ms

    def phase(self, name: str):
        """Context manager around one phase (``to_device``, ``forward``, ``backward``, ...).

        Times the block (with synchronisation before and after in the synced half, on CUDA)
        and labels it ``step/<name>`` in the trace; after the window a shared null context.
        """
        if self.done:
            return _NULL
        return self._timed(name)

    def step_end(self) -> bool:
        """Close the current micro-batch; True on the call that completes warmup + steps.

        Later calls (the window is over) return False and cost nothing.
        """
        if self.done:
            return False
        now = time.perf_counter()
        rec = self._current
        start = self._fetch_start if self._fetch_start is not None else now
        rec.wall_ms = (now - start) * 1e3
        self.records.append(rec)
        self._fetch_start = None
        if self._torch_prof is not None:
            try:
                self._torch_prof.step()
            except Exception as exc:  # noqa: BLE001
                self._trace_failed(exc)
        if len(self.records) >= self.window.total:
            self._close()
            return True
        self._current = StepRecord(len(self.records), self._kind(len(self.records)))
        return False

    def _close(self) -> None:
        self.done = True
        if self.cuda:
            with contextlib.suppress(Exception):
                self.peak_vram_mb = torch.cuda.max_memory_allocated(self.device) / 2**20
        prof, self._torch_prof = self._torch_prof, None
        if prof is not None:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    prof.stop()
            except Exception as exc:  # noqa: BLE001
                self.trace_error = f"{type(exc).__name__}: {exc}"
                log.warning("profiler trace could not be finished (%s)", self.trace_error)

    # -- results --------------------------------------------------------------------------
    def measured(self, kind: str) -> list[StepRecord]:
        """Records of the ``unsynced`` or ``synced`` measured steps."""
        return [r for r in self.records if r.kind == kind]

    def finish(self, run_dir: str | Path) -> dict[str, Any]:
        """Analyse the window, write the four artifacts into ``run_dir``, print the report.

        Returns:
            ``{"verdict", "bound_why", <headline figures>, "artifacts": {relpath: kind}}``.
        """
        from libreyolo_core.profiler.analysis import TRACE_NAME, write_trace_gz
        from libreyolo_core.profiler.artifacts import write_artifacts
        from libreyolo_core.profiler.report import format_summary

        if self._summary is not None:  # already finished: the files are written
            return self._summary
        if not self.done:
            self._close()
        run_dir = Path(run_dir)
        trace_path = None
        if self._trace_file and os.path.isfile(self._trace_file):
            try:
                run_dir.mkdir(parents=True, exist_ok=True)
                trace_path = write_trace_gz(self._trace_file, run_dir / TRACE_NAME)
            except OSError as exc:
                log.warning("could not write the trace into %s (%s)", run_dir, exc)
                trace_path = None
            finally:
                with contextlib.suppress(OSError):
                    os.remove(self._trace_file)
        elif self.want_trace and not self.trace_error:
            self.trace_error = "the trace was not produced"
        if self._trace_dir:
            shutil.rmtree(self._trace_dir, ignore_errors=True)
        profile, artifacts = write_artifacts(self, run_dir, trace_path)
        print(format_summary(profile), flush=True)
        if self.open_browser:
            with contextlib.suppress(Exception):
                import webbrowser

                webbrowser.open((run_dir / "timeline.html").resolve().as_uri())
        headline = {
            k: profile.get(k)
            for k in (
                "step_ms",
                "img_per_s",
                "dataload_ms",
                "dataload_frac",
                "gpu_util",
                "gpu_util_raw",
                "gpu_busy_ms_per_step",
                "host_overhead_ms_per_step",
                "kernels_per_step",
                "ops_per_step",
                "cuda_mallocs_per_step",
                "peak_vram_mb",
                "memory_pressure",
            )
        }
        self._summary = {
            "verdict": profile["bound"],
            "bound_why": profile["bound_why"],
            "lever": profile.get("lever"),
            **headline,
            "window": profile["window"],
            "artifacts": artifacts,
        }
        return self._summary
