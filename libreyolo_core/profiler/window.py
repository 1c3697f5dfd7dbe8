"""The measurement window and the hooks the trainer calls while it is open.

Window (reference A.1/A.2): ``warmup`` steps are discarded, then ``steps`` steps are
measured (``steps`` clamped to at least 2). With gradient accumulation both are rounded
**up** to a multiple of the accumulation factor so the window holds whole optimizer steps.
A *step* is one micro-batch: one ``step_end()`` call. The window stays inside the first
epoch the run trains (the trainer passes one epoch's steps as ``steps_available``); a
dataset whose epoch is shorter gets :class:`ProfileWindowError` with three concrete ways
out. The machine's load over the measured steps is read too (:mod:`.load`).

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

from libreyolo_core.profiler.load import LoadSnapshot, WindowLoad, window_load
from libreyolo_core.profiler.load import snapshot as load_snapshot

__all__ = ["TrainingProfiler", "ProfileWindowError", "Window", "plan_window", "StepRecord",
           "quiet_kineto", "ways_out"]

log = logging.getLogger(__name__)

#: The headline figures of ``profile.json`` that :meth:`TrainingProfiler.finish` returns.
SUMMARY_FIGURES = ("step_ms", "img_per_s", "dataload_ms", "dataload_frac", "gpu_util",
                   "gpu_util_raw", "gpu_busy_ms_per_step", "host_overhead_ms_per_step",
                   "kernels_per_step", "ops_per_step", "cuda_mallocs_per_step", "peak_vram_mb",
                   "memory_pressure")


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
    """The first epoch cannot hold the profile window (warmup + steps).

    The window stays inside one epoch (LibreYOLO profiles epoch 0): a window spread over
    epoch boundaries would time the loader's restarts and a different augmentation state.
    The message names the three ways out with numbers (:func:`ways_out`).

    Attributes:
        needed: steps of the window (after accumulation rounding). available: steps of one
            epoch. batch: images per step. images: training images per epoch (``None`` when
            unknown). ways: the three ways out, one sentence each.
    """

    def __init__(self, needed: int, available: int, batch: int, *, images: int | None = None,
                 window: Window | None = None, nbs: int | None = None):
        self.needed, self.available, self.batch, self.images = needed, available, batch, images
        self.ways = ways_out(needed=needed, available=available, batch=batch, images=images,
                             window=window, nbs=nbs)
        what = (f" ({window.warmup} warm-up + {window.steps} measured)" if window is not None
                else " (warmup + steps)")
        epoch = (f"one epoch of {images} images at batch {batch} has {available}"
                 if images is not None else f"one epoch at batch {batch} has {available}")
        super().__init__(
            f"the profile window must fit inside the first epoch: it needs {needed} steps{what} "
            f"but {epoch}. Ways out: "
            + "; ".join(f"({i}) {w}" for i, w in enumerate(self.ways, 1))
        )


def _fit(available: int, warmup: int, steps: int, acc: int) -> tuple[int, int] | None:
    """The largest ``(warmup, steps)`` (multiples of ``acc``) that fits ``available`` steps,
    keeping the measured steps first; ``None`` when not even the minimum window fits."""
    room = (available // acc) * acc
    least = acc * math.ceil(MIN_STEPS / acc)
    if room < least:
        return None
    if room >= steps:
        return min(warmup, room - steps), steps
    w = min(warmup, acc * ((room // 5) // acc))
    return w, room - w


def _epoch_steps(images: int, batch: int) -> int:
    """Steps of one epoch on one device: full batches (the loader drops the partial last
    one), or the single partial batch of a dataset smaller than the batch."""
    return images // batch if images >= batch else 1


def ways_out(*, needed: int, available: int, batch: int, images: int | None,
             window: Window | None = None, nbs: int | None = None) -> list[str]:
    """The three ways out of a window that one epoch cannot hold, with numbers.

    Args:
        needed: steps of the window. available: steps of one epoch at ``batch``.
        images: training images of one epoch (``None``: the numbers that need it are left
            out). window: the planned window (its requested warmup/steps and accumulation).
        nbs: the nominal batch: with it, a smaller batch accumulates more micro-batches and
            the window grows (rounded to whole accumulation windows).

    Returns:
        ``[fewer steps, a smaller batch, a bigger dataset]``, one sentence each, with the
        ``libreyolo profile run`` flags and the training keys to pass.
    """
    from libreyolo_core.engine.optim import accumulate_steps

    acc = window.accumulate if window is not None else 1
    warm = window.warmup if window is not None else max(needed - MIN_STEPS, 0)
    steps = window.steps if window is not None else MIN_STEPS
    req_w, req_s = window.requested if window is not None else (warm, steps)

    def flags(w: int, s: int) -> str:
        return f"--warmup {w} --steps {s} (profile_warmup={w}, profile_steps={s})"

    fit = _fit(available, warm, steps, acc)
    if fit is not None:
        fewer = f"fewer steps: {flags(*fit)} fits the {available} steps of one epoch"
    else:
        least = acc * math.ceil(MIN_STEPS / acc)
        fewer = (f"fewer steps cannot help at batch {batch}: one epoch has {available} "
                 f"step{'s' if available != 1 else ''} and a window measures at least {least}")
    if images is None:
        smaller = f"a smaller --batch than {batch} (more steps per epoch)"
        bigger = f"a bigger dataset: at least {needed * batch} training images at batch {batch}"
        return [fewer, smaller, bigger]
    smaller = ""
    for b in range(batch - 1, 0, -1):
        acc_b = accumulate_steps(b, nbs) if nbs else acc
        need_b = plan_window(req_w, req_s, acc_b).total if nbs else needed
        have = _epoch_steps(images, b)
        if images < b:
            continue
        if have >= need_b:
            smaller = (f"a smaller batch: --batch {b} (batch={b}) gives {have} steps per "
                       f"epoch, enough for the {need_b}-step window")
            break
        fitted = _fit(have, req_w, req_s, acc_b)
        if fitted is not None:  # the profiler fits its window into that epoch itself
            smaller = (f"a smaller batch: --batch {b} (batch={b}) gives {have} steps per "
                       f"epoch, where the window is fitted to {fitted[0]} + {fitted[1]} steps")
            break
    if not smaller:
        smaller = (f"a smaller batch alone cannot: even --batch 1 gives only {images} "
                   f"step{'s' if images != 1 else ''} per epoch")
    least = acc * math.ceil(MIN_STEPS / acc)
    bigger = (f"a bigger dataset: at least {least * batch} training images at batch {batch} "
              f"for a fitted window, {needed * batch} for the whole {needed}-step one (this "
              f"one has {images})")
    return [fewer, smaller, bigger]


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
        steps_available: micro-batches of ONE epoch (``len(loader)``): the window stays
            inside the first epoch the run trains. ``None`` skips the check.
        images: training images of one epoch, and nbs: the nominal batch; both only make
            the numbers of :class:`ProfileWindowError`'s ways out concrete.
        meta: environment recorded in the artifacts (model, device, batch, imgsz, amp, ...).

    Besides the per-step times, the machine's load over the measured steps is read
    (:mod:`libreyolo_core.profiler.load`) at their start and at the window's end.

    A window that one epoch cannot hold is fitted into it, measured steps first (as a
    tune's is): one warning line says so, ``fitted`` and ``meta["window_fitted"]`` keep the
    sentence, and the verdict's confidence carries the ``short_window`` flag.

    Raises:
        ProfileWindowError: one epoch (``steps_available``) cannot hold even the smallest
            window (2 measured steps, in whole accumulation windows).
    """

    def __init__(
        self,
        cfg: Any,
        *,
        device: torch.device | str = "cpu",
        batch: int = 1,
        accumulate: int = 1,
        steps_available: int | None = None,
        images: int | None = None,
        nbs: int | None = None,
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
        self.fitted: str | None = None
        if steps_available is not None and steps_available < self.window.total:
            asked = self.window
            fit = _fit(int(steps_available), asked.warmup, asked.steps, asked.accumulate)
            if fit is None:
                raise ProfileWindowError(asked.total, int(steps_available), int(batch),
                                         images=images, window=asked, nbs=nbs)
            # as a tune does: the window shrinks to one epoch (measured steps first)
            self.window = Window(warmup=fit[0], steps=fit[1], half=max(1, fit[1] // 2),
                                 accumulate=asked.accumulate, requested=asked.requested)
            epoch = (f"one epoch of {images} images at batch {batch}" if images is not None
                     else f"one epoch at batch {batch}")
            self.fitted = (f"the profile window was fitted into the first epoch: warmup "
                           f"{fit[0]} + {fit[1]} measured steps (asked {asked.warmup} + "
                           f"{asked.steps}; {epoch} has {steps_available} steps)")
            log.warning("profile: %s; a short window makes a less certain verdict", self.fitted)
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.batch = int(batch)
        self.accumulate = max(int(accumulate), 1)
        self.want_trace = bool(getattr(cfg, "profile_trace", True))
        self.open_browser = bool(getattr(cfg, "profile_open", False))
        self.meta = dict(meta or {})
        if self.fitted is not None:
            self.meta["window_fitted"] = self.fitted
        self.records: list[StepRecord] = []
        self.done = False
        self._current = StepRecord(0, self._kind(0))
        self._fetch_start: float | None = None
        self._torch_prof: Any = None  # torch.profiler.profile while the trace runs
        self._trace_dir: str | None = None
        self._trace_file: str | None = None
        self.trace_error: str | None = None
        self.peak_vram_mb: float | None = None
        self._summary: dict[str, Any] | None = None
        self._load_start: LoadSnapshot | None = None
        self.load: WindowLoad | None = None

    # -- window bookkeeping -------------------------------------------------------------
    def _kind(self, index: int) -> str:
        w = self.window
        if index < w.warmup:
            return "warmup"
        return "unsynced" if index < w.warmup + w.half else "synced"

    @property
    def position(self) -> tuple[int, int]:
        """``(steps done, warmup + steps)``: where the window is, for progress reports."""
        return len(self.records), self.window.total

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

        In the synced half the device is synchronised before and after ``next()`` (as around
        every phase), so device work the loader has queued (``loader=gpu``: decode and
        augmentation) counts as data loading there, not as the next phase's; the unsynced
        half times what the step waits for.
        Once the window is over the generator passes batches straight through.
        """
        it = iter(loader)
        while True:
            if self.done:
                yield from it
                return
            if not self.records and self._fetch_start is None:
                self._start_window()
            if self.synced:
                self._sync()  # the previous step's device work is not the loader's
            t0 = time.perf_counter()
            with self._label("dataload"):
                try:
                    batch = next(it)
                except StopIteration:
                    if self.records:
                        log.warning("profiler: the loader ended after %d of the window's %d "
                                    "steps; the window goes on in the next pass, so its figures "
                                    "include a loader restart",
                                    len(self.records), self.window.total)
                    return
                if self.synced:
                    self._sync()
            self._fetch_start = t0
            self._current.dataload_ms += (time.perf_counter() - t0) * 1e3
            yield batch

    def _start_window(self) -> None:
        if self.cuda:
            with contextlib.suppress(Exception):
                torch.cuda.reset_peak_memory_stats(self.device)
        self._start_trace()
        if self.window.warmup == 0:
            self._load_start = load_snapshot()

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
        if len(self.records) == self.window.warmup and self._load_start is None:
            self._load_start = load_snapshot()  # the measured steps begin
        if len(self.records) >= self.window.total:
            self._close()
            return True
        self._current = StepRecord(len(self.records), self._kind(len(self.records)))
        return False

    def _close(self) -> None:
        self.done = True
        if self._load_start is not None and self.load is None:
            self.load = window_load(self._load_start, load_snapshot())
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
        headline = {k: getattr(profile, k) for k in SUMMARY_FIGURES}
        self._summary = {
            "verdict": profile.bound,
            "bound_why": profile.bound_why,
            "lever": profile.lever.to_dict() if profile.lever is not None else None,
            **headline,
            "window": profile.window.to_dict(),
            "confidence": profile.confidence.to_dict() if profile.confidence is not None else None,
            "load": profile.load.to_dict() if profile.load is not None else None,
            "artifacts": artifacts,
        }
        return self._summary
