"""The tune's run: profile the baseline and each candidate ``repeat`` times
(:func:`~libreyolo_core.profiler.trial.run_trial`), judge them, write ``tune.json`` after
every configuration (:func:`run_tune`). The package docstring describes the steps.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from libreyolo_core.engine.signals import install_sigterm
from libreyolo_core.profiler.tune.levers import TuneOptions, candidate_levers, judgement
from libreyolo_core.profiler.tune.record import (
    TUNE_NAME,
    Configuration,
    TuneState,
    format_tune,
    tune_event,
    tune_record,
)
from libreyolo_core.records.events import (
    ArtifactEvent,
    EngineEvent,
    ProgressEvent,
    RunEndEvent,
    RunStartEvent,
    TuneCandidateEvent,
)
from libreyolo_core.records.tune import TuneRecord

__all__ = ["TuneInterrupted", "run_tune"]

#: Training keys the tune never passes to a trial (the trial sets its own).
_RESERVED = ("model", "data", "project", "name", "exist_ok", "resume", "preflight", "profile",
             "profile_then_stop", "profile_steps", "profile_warmup", "profile_open", "val")


class TuneInterrupted(RuntimeError):
    """SIGTERM stopped the tune; ``tune.json`` holds what was measured (``path``)."""

    def __init__(self, message: str, path: str | os.PathLike[str] | None = None):
        super().__init__(message)
        self.path = None if path is None else str(path)


class _Stop(Exception):
    """Internal: the budget is spent."""


class _Tuner:
    """A tune in progress: its :class:`TuneState`, the trials' durations (for the budget
    and the ETA), where its lines and events go."""

    def __init__(self, state: TuneState, run_dir: Path, out: TextIO,
                 emit: Callable[[EngineEvent], Any]):
        self.state, self.run_dir, self.out, self.emit = state, run_dir, out, emit
        self.opt = state.opt
        self.t0 = time.monotonic()
        self.durations: list[float] = []
        self.stop_requested = False
        self.planned = state.opt.repeat
        self.trace = False

    # -- helpers ----------------------------------------------------------------------
    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def record(self) -> TuneRecord:
        """The ``tune.json`` record of what is measured so far."""
        return tune_record(self.state, time.monotonic() - self.t0)

    def _check_budget(self) -> None:
        if self.stop_requested:
            raise TuneInterrupted("SIGTERM")
        if self.opt.budget_s is None:
            return
        elapsed = time.monotonic() - self.t0
        mean = statistics.fmean(self.durations) if self.durations else 0.0
        if elapsed + mean > self.opt.budget_s:
            raise _Stop(f"the time budget of {self.opt.budget_s:g} s would run out during the "
                        f"next trial ({elapsed:.0f} s spent, a trial takes ~{mean:.0f} s)")

    def _progress(self, cfg: Configuration, index: int, k: int) -> None:
        mean = statistics.fmean(self.durations) if self.durations else None
        done = self.state.done_trials()
        left = self.planned - done
        self.emit(ProgressEvent(
            phase="tuning", candidate=cfg.label, candidate_index=index,
            candidates=max(len(self.state.configs) - 1, 0), trial=k, trials=self.opt.repeat,
            trials_done=done, trials_planned=self.planned,
            **({"eta_s": round(mean * left, 1)} if mean is not None else {})))

    def _reused(self, stamp: Path, want: dict[str, Any], cfg: Configuration, k: int) -> Any:
        """The trial an earlier attempt finished with the same inputs, or ``None``."""
        from libreyolo_core.profiler.trial import NoProfileError, TrialResult

        with contextlib.suppress(OSError, ValueError, NoProfileError):
            if json.loads(stamp.read_text(encoding="utf-8")) == json.loads(json.dumps(want)):
                result = TrialResult.from_run_dir(stamp.parent)
                self.say(f"  {cfg.label}: trial {k}/{self.opt.repeat} reused from an earlier "
                         f"attempt: {result.img_per_s:.1f} img/s")
                return result
        return None

    def _trial(self, cfg: Configuration, index: int, k: int) -> Any:
        """Run (or reuse) trial ``k`` of ``cfg``."""
        from libreyolo_core.engine.trainer import TrainingInterrupted
        from libreyolo_core.profiler.trial import run_trial

        self._check_budget()
        name = f"{cfg.name}_{k}"
        trials = self.run_dir / "trials"
        trials.mkdir(parents=True, exist_ok=True)
        keys = {**self.state.base, **cfg.changes, "profile_trace": self.trace}
        stamp = trials / name / "trial.json"
        window = self.state.window
        want = {"model": self.state.model, "data": self.state.data, "keys": keys,
                "window": list(window)}
        reused = self._reused(stamp, want, cfg, k)
        if reused is not None:
            return reused
        self._progress(cfg, index, k)
        t = time.monotonic()
        engine_log = logging.getLogger("libreyolo_core")
        level = engine_log.level
        engine_log.setLevel(logging.WARNING)  # a trial's info lines go to its own log
        try:
            with open(trials / f"{name}.log", "w", encoding="utf-8") as log:
                result = run_trial(self.state.data, self.state.model, project=trials, name=name,
                                   warmup=window[0], steps=window[1], stdout=log, **keys)
        except TrainingInterrupted:
            import shutil

            shutil.rmtree(trials / name / "weights", ignore_errors=True)  # the stop's last.pt
            raise TuneInterrupted(f"SIGTERM during {cfg.label}, trial {k}") from None
        finally:
            engine_log.setLevel(level)
        self.durations.append(time.monotonic() - t)
        stamp.write_text(json.dumps(want), encoding="utf-8")
        self.say(f"  {cfg.label}: trial {k}/{self.opt.repeat}: {result.img_per_s:.1f} img/s, "
                 f"step {result.step_ms:.0f} ms, {result.verdict}"
                 + ("" if result.reliable is not False else " (unreliable window)"))
        return result

    def _skip(self, cfg: Configuration, why: str) -> None:
        cfg.skipped = why
        self.planned -= self.opt.repeat - len(cfg.results)
        cfg.results.clear()

    def measure(self, cfg: Configuration, index: int) -> None:
        """Profile ``cfg`` ``repeat`` times and aggregate (skips on a window that does not
        fit its epoch or a configuration the engine refuses)."""
        from libreyolo_core.profiler.window import ProfileWindowError

        self.say(f"{'baseline' if index == 0 else f'candidate {index}'}: {cfg.label}")
        for k in range(1, self.opt.repeat + 1):
            try:
                cfg.results.append(self._trial(cfg, index, k))
            except ProfileWindowError as exc:
                if index == 0:
                    raise
                w = self.state.window
                self._skip(cfg, f"skipped: the {w[0]} + {w[1]}-step window does not fit one "
                                f"epoch at batch {exc.batch} ({exc.available} steps)")
                return
            except (TuneInterrupted, _Stop):
                raise
            except Exception as exc:  # noqa: BLE001 - a candidate the engine refuses
                if index == 0:
                    raise
                self._skip(cfg, f"skipped: the trial failed ({type(exc).__name__}: {exc})"[:500])
                return
        self.summarise(cfg)

    def summarise(self, cfg: Configuration) -> None:
        """Aggregate ``cfg``'s trials so far into ``profile_repeat.json`` and its epoch time
        (also for a configuration a stop cut short: what was measured is kept)."""
        from libreyolo_core.profiler.artifacts import write_json
        from libreyolo_core.profiler.repeat import aggregate

        profiles = [r.profile for r in cfg.results]
        paths = [str(r.profile_path) for r in cfg.results]
        cfg.aggregate = agg = aggregate(profiles, paths)
        (self.run_dir / "trials" / cfg.name).mkdir(parents=True, exist_ok=True)
        write_json(self.run_dir / "trials" / cfg.name / "profile_repeat.json", agg.to_dict())
        cfg.batch = int(agg.config.get("batch") or 0)
        if cfg.batch and agg.step_ms:
            images = self.state.images
            steps = images // cfg.batch if images >= cfg.batch else 1
            cfg.epoch_s = round(steps * agg.step_ms / 1e3, 3)

    def summarise_partial(self) -> None:
        """After a stop: every configuration with measured trials but no aggregate gets one
        from the trials it has (its row's ``n`` says how many), so ``tune.json`` keeps the
        numbers; fewer trials than ``repeat`` are never judged significant."""
        for cfg in self.state.configs:
            if cfg.results and cfg.aggregate is None and cfg.skipped is None:
                self.summarise(cfg)
                self.state.notes.append(f"{cfg.label}: {len(cfg.results)} of {self.opt.repeat} "
                                        "trials measured before the stop")

    def judge(self, cfg: Configuration, base: Configuration) -> None:
        """Apply the rule to a measured candidate, say the call and emit its row."""
        assert base.aggregate is not None and cfg.aggregate is not None
        comp, j = judgement(base.aggregate, cfg.aggregate, min_gain=self.opt.min_gain)
        cfg.comparison, cfg.judgement = comp.to_dict(), j
        sig = {True: "significant", False: "not significant", None: "no call"}[j.significant]
        self.say(f"  -> {cfg.img_per_s:.1f} ± {cfg.aggregate.img_per_s_std or 0:.1f}"
                 f" img/s vs {base.img_per_s:.1f}: {sig}, "
                 f"{'RECOMMENDABLE' if j.recommendable else 'not recommended'}: {j.note}")
        self.emit(TuneCandidateEvent(**cfg.row().to_dict()))

    def measure_and_judge(self, cfg: Configuration, index: int) -> None:
        """:meth:`measure` a candidate, then :meth:`judge` it when it was measured."""
        self.measure(cfg, index)
        if cfg.aggregate is not None:
            self.judge(cfg, self.state.configs[0])


def _resolved(model: str, base: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """The baseline's resolved training keys and whether its family allows CUDA graphs."""
    from libreyolo_core.config import resolve_config
    from libreyolo_core.facade import is_weights_path
    from libreyolo_core.models.registry import parse_model_name

    name = model
    if is_weights_path(model):
        from libreyolo_core.weights.load import load_weights

        w = load_weights(model)
        name = f"{w.family}-{w.size}"
    cfg = resolve_config({**base, "model": name})
    return cfg.model_dump(mode="json"), bool(parse_model_name(name)[0].cuda_graph)


def _fit_window(cfgs: Mapping[str, Any], images: int, opt: TuneOptions) -> tuple[int, int]:
    """The window of every trial, fitted into one epoch of the baseline.

    Raises:
        ProfileWindowError: one epoch cannot hold even the smallest window.
    """
    from libreyolo_core.engine.optim import accumulate_steps
    from libreyolo_core.profiler.window import ProfileWindowError, _fit, plan_window

    batch = int(cfgs.get("batch") or 16)
    available = images // batch if images >= batch else 1
    fit = _fit(available, opt.warmup, opt.steps, accumulate_steps(batch, cfgs.get("nbs")))
    if fit is None:
        raise ProfileWindowError(opt.warmup + opt.steps, images // max(batch, 1), batch,
                                 images=images, window=plan_window(opt.warmup, opt.steps))
    return fit


def run_tune(data: str | Path, model: str = "yolo9-t", *, run_dir: str | Path,
             base: Mapping[str, Any] | None = None, options: TuneOptions | None = None,
             stdout: TextIO | None = None, events: Any = None) -> dict[str, Any]:
    """Tune ``model`` on ``data`` (the package docstring): the baseline, the candidates, the
    rule.

    Args:
        data: dataset yaml. model: a model name or weights file.
        run_dir: the tune's folder (``tune.json``, ``trials/``); created, reused.
        base: the baseline's training keys (``batch``, ``imgsz``, ``workers``, ``device``...).
        options: :class:`TuneOptions`.
        stdout: where the progress lines go (default: this process's stdout).
        events: an :class:`~libreyolo_core.engine.events.EventLog` for the service (``None``:
            no events).

    Returns:
        The ``tune.json`` dict (:class:`~libreyolo_core.records.tune.TuneRecord`'s JSON):
        ``schema``, ``status`` (``complete``, ``budget``), ``device``, ``verdict``,
        ``baseline`` and ``candidates`` (rows: ``label``, ``params``, ``img_per_s``,
        ``img_per_s_std``, ``n``, ``step_ms``, ``verdict``, ``significant``, ``gain``,
        ``recommendable``, ``note``, ``epoch_s``...), ``recommended`` (a row, or ``None``),
        ``recommended_params`` (the whole parameter set to train with), ``answer``,
        ``also``, ``expected_epoch_s``, ``baseline_epoch_s``, ``options``, ``notes``,
        ``trials_run``, ``elapsed_s``.

    Raises:
        TuneInterrupted: SIGTERM; ``tune.json`` was written first (``status: cancelled``).
        ProfileWindowError: one epoch of the baseline cannot hold even the smallest window.
        ValueError: an unknown key in ``base``; whatever the baseline's training raises.
    """
    from libreyolo_core.data.config import load_data_config

    opt = options or TuneOptions()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    base_keys = {k: v for k, v in dict(base or {}).items() if k not in _RESERVED and v is not None}
    emit = events.write if events is not None else (lambda event: event)
    state = TuneState(model=str(model), data=str(data), base=base_keys, opt=opt)
    tuner = _Tuner(state, run_dir, stdout or sys.stdout, emit)
    resolved, graphs_ok = _resolved(str(model), base_keys)
    train = load_data_config(data).train
    if train is None:
        raise ValueError(f"{data}: the dataset has no train split to tune on")
    state.images = len(train)
    fit = _fit_window(resolved, state.images, opt)
    if fit != (opt.warmup, opt.steps):
        state.notes.append(f"the window was fitted into one epoch: warmup {fit[0]}, steps "
                           f"{fit[1]} (asked {opt.warmup} + {opt.steps})")
    state.window = fit
    cuda = str(resolved.get("device", "auto")) not in ("cpu", "mps") and _cuda_available()
    tuner.trace = cuda  # a GPU verdict needs the trace's utilisation; a CPU one does not
    restore = install_sigterm(functools.partial(_on_sigterm, tuner), chain=False)
    emit(RunStartEvent(config=base_keys, run_dir=str(run_dir.resolve()), tune=opt.to_dict()))
    state.configs.append(Configuration("baseline", "baseline", {},
                                       why="the configuration as given"))
    status, error = "succeeded", None
    try:
        _tune_loop(tuner, run_dir, resolved, graphs_ok)
    except _Stop as stop:
        tuner.summarise_partial()
        state.status = "budget"
        state.notes.append(f"stopped: {stop}")
        tuner.say(f"stopped: {stop}")
    except TuneInterrupted as exc:
        tuner.summarise_partial()
        state.status, status = "cancelled", "interrupted"
        state.notes.append(f"cancelled: {exc}")
        _finish(tuner, run_dir, status, None)
        raise TuneInterrupted(str(exc), run_dir / TUNE_NAME) from None
    except BaseException as exc:
        status, error = "failed", f"{type(exc).__name__}: {exc}"
        emit(RunEndEvent(status=status, error=error))
        raise
    finally:
        restore()
    res = _finish(tuner, run_dir, status, error)
    tuner.say(format_tune(res))
    return res.to_dict()


def _write(tuner: _Tuner, run_dir: Path) -> TuneRecord:
    """Write ``tune.json`` with what is measured so far."""
    from libreyolo_core.profiler.artifacts import write_json

    res = tuner.record()
    write_json(run_dir / TUNE_NAME, res.to_dict())
    return res


def _finish(tuner: _Tuner, run_dir: Path, status: str, error: str | None) -> TuneRecord:
    """The last ``tune.json`` and the closing events (artifact, ``tune``, ``run_end``)."""
    res = _write(tuner, run_dir)
    tuner.emit(ArtifactEvent(path=TUNE_NAME, kind="tune"))
    tuner.emit(tune_event(res))
    tuner.emit(RunEndEvent(status=status, error=error))
    return res


def _tune_loop(tuner: _Tuner, run_dir: Path, resolved: dict[str, Any], graphs_ok: bool) -> None:
    """Steps 1-5 of the package docstring: the baseline, its levers, each candidate, the
    combination; ``tune.json`` is written after each configuration.

    Raises:
        _Stop: the budget is spent. TuneInterrupted: SIGTERM.
    """
    state, opt = tuner.state, tuner.opt
    baseline = state.configs[0]
    tuner.say(f"tune: {opt.repeat} trials per configuration, window {state.window[0]} + "
              f"{state.window[1]} steps, at most {opt.max_candidates} candidates"
              + (f", budget {opt.budget_s:g} s" if opt.budget_s else ""))
    tuner.measure(baseline, 0)
    agg = baseline.aggregate
    assert agg is not None  # the baseline raises rather than skips
    device = agg.device_type or "cpu"
    verdicts = [b for b in agg.trial_verdicts or [] if b]
    levers = candidate_levers(verdicts, resolved, device_type=device,
                              bf16_supported=device == "cuda" and _bf16(),
                              cuda_graph_supported=graphs_ok)
    if len(levers) > opt.max_candidates:
        state.notes.append(f"{len(levers)} levers apply; the cap of {opt.max_candidates} "
                           "left out: " + ", ".join(lv.label for lv in levers[opt.max_candidates:]))
        levers = levers[:opt.max_candidates]
    for lv in levers:
        state.configs.append(Configuration(lv.name, lv.label, dict(lv.params), lv.side_effect,
                                           lv.group, lv.why))
    tuner.planned = opt.repeat * len(state.configs)
    tuner.say(f"baseline verdict: {agg.verdict}; candidates: "
              + (", ".join(lv.label for lv in levers) or "none on this device"))
    _write(tuner, run_dir)
    for i, cfg in enumerate(list(state.configs[1:]), 1):
        tuner.measure_and_judge(cfg, i)
        _write(tuner, run_dir)
    combo = _combination(state.configs[1:])
    if combo is not None and len(state.configs) - 1 < opt.max_candidates:
        state.configs.append(combo)
        tuner.planned += opt.repeat
        tuner.measure_and_judge(combo, len(state.configs) - 1)
    elif combo is not None:
        state.notes.append(f"the combination {combo.label} was not profiled: the cap of "
                           f"{opt.max_candidates} candidates is reached")


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


def _bf16() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    except Exception:  # noqa: BLE001
        return False


def _on_sigterm(tuner: _Tuner) -> None:
    """SIGTERM during a tune: the loop stops before the next trial (``tune.json`` is kept)."""
    tuner.stop_requested = True
    print("SIGTERM received: the tune stops before the next trial", file=sys.stderr, flush=True)


def _combination(configs: Sequence[Configuration]) -> Configuration | None:
    """The union of the recommendable speed-only candidates (the best of each group), when
    two or more groups have one."""
    best: dict[str, Configuration] = {}
    for c in configs:
        if c.side_effect is None and c.recommendable and (
                c.group not in best or c.img_per_s > best[c.group].img_per_s):
            best[c.group] = c
    if len(best) < 2:
        return None
    parts = list(best.values())
    changes: dict[str, Any] = {}
    for c in parts:
        changes.update(c.changes)
    return Configuration("combined", " + ".join(c.label for c in parts), changes,
                         why="the recommendable speed-only levers together")
