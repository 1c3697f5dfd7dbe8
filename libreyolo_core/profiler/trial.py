"""One profile trial: a short real training run that stops after the window, as data.

``libreyolo profile run`` calls :func:`run_trial` once per ``--repeat``; anything else that
needs a measured verdict (a tuning loop trying several settings) calls it the same way and
reads the typed :class:`TrialResult`: the verdict, the headline figures and how sure the
verdict is (:class:`~libreyolo_core.profiler.confidence.Confidence`, with the machine's load).
"""

from __future__ import annotations

import contextlib
import gc
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from libreyolo_core.profiler.confidence import Confidence
from libreyolo_core.profiler.load import WindowLoad
from libreyolo_core.profiler.record import ProfileRecord

__all__ = ["TrialResult", "NoProfileError", "run_trial", "trial_overrides", "result_json"]


class NoProfileError(RuntimeError):
    """A trial ended without writing ``profile.json`` (the window never filled)."""


@dataclass(frozen=True)
class TrialResult:
    """What one trial measured.

    Attributes:
        run_dir: the trial's run directory. profile_path: its ``profile.json``.
        trace_path: ``profile_trace.json.gz`` (``None`` without a trace).
        verdict: ``dataloader``, ``compute``, ``host/launch`` or ``memory-pressure``.
        bound_why: the sentence with the figures that decided it. lever: the lever as data.
        img_per_s, step_ms (ms), dataload_frac (0-1), gpu_util (0-1, ``None`` on CPU): the
            headline figures of the unsynced steps.
        confidence: how sure the verdict is (``None`` only for a profile from an older
            version). load: the machine's load during the window (``None`` when the OS
            gave no reading).
        profile: the whole ``profile.json``.
    """

    run_dir: Path
    profile_path: Path
    trace_path: Path | None
    verdict: str | None
    bound_why: str | None
    lever: dict[str, Any]
    img_per_s: float | None
    step_ms: float | None
    dataload_frac: float | None
    gpu_util: float | None
    confidence: Confidence | None
    load: WindowLoad | None
    profile: dict[str, Any] = field(repr=False)

    @property
    def reliable(self) -> bool | None:
        """``confidence.reliable`` (``None`` when no confidence was recorded)."""
        return None if self.confidence is None else self.confidence.reliable

    @classmethod
    def from_run_dir(cls, run_dir: Path) -> TrialResult:
        """Read a finished trial back from its run directory.

        Raises:
            NoProfileError: the directory holds no ``profile.json``.
        """
        from libreyolo_core.profiler.analysis import TRACE_NAME

        path = Path(run_dir) / "profile.json"
        if not path.is_file():
            raise NoProfileError(f"{run_dir}: no profile.json")
        p = json.loads(path.read_text(encoding="utf-8"))
        rec = ProfileRecord.of(p)
        trace = path.with_name(TRACE_NAME)
        return cls(
            run_dir=Path(run_dir), profile_path=path,
            trace_path=trace if trace.is_file() else None,
            verdict=rec.bound, bound_why=rec.bound_why,
            lever=rec.lever.to_dict() if rec.lever is not None else {},
            img_per_s=rec.img_per_s, step_ms=rec.step_ms,
            dataload_frac=rec.dataload_frac, gpu_util=rec.gpu_util, confidence=rec.confidence,
            load=WindowLoad.from_dict(rec.load.to_dict() if rec.load is not None else None), profile=p,
        )


def trial_overrides(*, project: str | Path, name: str, warmup: int = 5, steps: int = 20,
                    epochs: int | None = None, **train_keys: Any) -> dict[str, Any]:
    """The ``train()`` keywords of a profile trial: the window, ``profile_then_stop``,
    ``no_aug_epochs=0`` (epoch 0 augments as real training does), no validation, no
    browser, no preflight; ``train_keys`` (batch, imgsz, workers, amp, device, ...) pass through, and
    ``None`` values are left out. ``epochs`` only shapes the LR schedule (default
    ``warmup + steps + 5``): the window stays inside the first epoch."""
    keys = {k: v for k, v in train_keys.items() if v is not None}
    return {
        **keys,
        "epochs": epochs or warmup + steps + 5,
        "profile": True,
        "profile_then_stop": True,
        "profile_steps": steps,
        "profile_warmup": warmup,
        "profile_open": False,
        "preflight": False,
        "no_aug_epochs": 0,
        "val": False,
        "project": str(project),
        "name": name,
        "exist_ok": True,
    }


def run_trial(data: str | Path, model: str = "yolo9-t", *, project: str | Path,
              name: str = "prof", warmup: int = 5, steps: int = 20, epochs: int | None = None,
              stdout: TextIO | None = None, **train_keys: Any) -> TrialResult:
    """Run one profile trial of ``model`` on ``data`` and read its result back.

    Args:
        data: dataset yaml. model: a model name (``yolo9-t``) or a weights file.
        project, name: the run directory is ``project/name`` (reused if it exists).
        warmup, steps: the window (discarded + measured steps, inside the first epoch).
        epochs: the schedule's length (see :func:`trial_overrides`).
        stdout: where the run's printed lines go (default: this process's stdout).
        train_keys: any other training keys (``batch``, ``imgsz``, ``workers``, ``amp``,
            ``device``, ``cache``, ``cuda_graph``, ...).

    Raises:
        ProfileWindowError: the first epoch cannot hold the window (its message names the
            three ways out); nothing is written.
        NoProfileError: the run ended without a profile.
        whatever training raises otherwise (a bad key, a data error).
    """
    from libreyolo_core.engine.train_run import train_config, train_run
    from libreyolo_core.weights.detector import Detector

    overrides = trial_overrides(project=project, name=name, warmup=warmup, steps=steps,
                                epochs=epochs, **train_keys)
    with contextlib.redirect_stdout(stdout or sys.stdout):
        det = Detector(str(model))
        train_run(det, train_config(det, data, overrides))
    run_dir = Path(project) / name
    try:
        return TrialResult.from_run_dir(run_dir)
    except NoProfileError:
        raise NoProfileError(
            f"no profile was produced in {run_dir}: the warmup + steps window never filled"
        ) from None
    finally:
        gc.collect()
        with contextlib.suppress(Exception):
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def result_json(result: TrialResult | ProfileRecord | Mapping[str, Any]) -> dict[str, Any]:
    """The small JSON a caller prints for a trial or an aggregate profile (``--json``)."""
    p = ProfileRecord.of(result.profile if isinstance(result, TrialResult) else result)
    d = p.to_dict()
    return {
        "img_per_s": p.img_per_s,
        "img_per_s_std": p.img_per_s_std,
        "img_per_s_n": p.img_per_s_n if "img_per_s_n" in p.model_fields_set else 1,
        "bound": p.bound,
        "gpu_util": p.gpu_util,
        "reliable": p.confidence.reliable if p.confidence is not None else None,
        "confidence": d.get("confidence"),
        "load": d.get("load"),
    }
