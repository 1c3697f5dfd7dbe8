"""Experiment trackers: TensorBoard event files and MLflow runs, as rank 0's trainer hooks.

:class:`TensorBoardHook` writes ``events.out.tfevents.*`` into the run folder with
``torch.utils.tensorboard.SummaryWriter`` (so ``tensorboard --logdir runs/`` shows every run):
``train/<term>_loss`` per step, and per epoch ``train/<term>_loss`` (epoch mean, tag
``epoch/...``), ``metrics/{precision,recall,mAP50,mAP50-95}`` of validated epochs, ``lr/pg0``,
the validation pictures found under ``<run_dir>/val/*.png`` and the PR curve of
``<run_dir>/val/report.json`` (``pr_curve``: ``{"recall": [...], "precision": {class:
[...]}, "mAP50": x}``) when those files exist (they are the report's; skipped otherwise).

:class:`MlflowHook` logs to the tracking server of ``cfg.mlflow`` (else
``$MLFLOW_TRACKING_URI``): the resolved config as parameters, every epoch's losses,
metrics and lr with the epoch as step, the artifacts (``weights/best.pt``, ``best.onnx`` of ``export=[onnx]``,
``results.csv``, ``val/``) at the end, and tags ``libreyolo.job_id`` / ``libreyolo.user``
from ``$LIBREYOLO_JOB_ID`` / ``$LIBREYOLO_USER`` when set. The run id goes into
``<run_dir>/mlflow.json`` (``{"tracking_uri", "run_id", "experiment_id"}``) so that a
publish can register the model version. Every MLflow call runs on a background thread
behind a bounded queue, with HTTP retries off and a short timeout: a slow server never
slows a step.

A tracker never fails training: the first error is one warning, then that tracker is
dropped for the rest of the run (:class:`TrackerHook`). A tracker library that is not
installed is one line saying what to install.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from libreyolo_core.engine import fence
from libreyolo_core.engine.hooks.base import HookBase, TrainerView

__all__ = ["TrackerHook", "TensorBoardHook", "MlflowHook", "tracker_hooks", "read_pr_curve",
           "TENSORBOARD_INSTALL", "MLFLOW_INSTALL"]

log = logging.getLogger(__name__)

#: seconds between two checks of the attempt fence by a tracker's per-step logging (its
#: other calls check every time)
FENCE_STEP_CHECK_S = 1.0
TENSORBOARD_INSTALL = "TensorBoard logging needs tensorboard: pip install 'libreyolo-service[tensorboard]'"
MLFLOW_INSTALL = "MLflow logging needs mlflow: pip install 'libreyolo-service[mlflow]'"
METRICS = ("precision", "recall", "mAP50", "mAP50-95")


def read_pr_curve(run_dir: Path) -> dict[str, Any] | None:
    """``pr_curve`` of ``<run_dir>/val/report.json``, or None when the file or key is
    missing or malformed."""
    path = Path(run_dir) / "val" / "report.json"
    try:
        curve = json.loads(path.read_text(encoding="utf-8")).get("pr_curve")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(curve, dict) or not isinstance(curve.get("precision"), dict):
        return None
    return curve


class TrackerHook(HookBase):
    """A hook whose every point runs guarded: the first exception is one warning naming
    the tracker, then the tracker is off for the rest of the run (never raised)."""

    tracker = "tracker"
    trainer: Any  # the trainer's optional parts (outcome, meter, run_dir) are set when called

    def __init__(self) -> None:
        self.dead = False
        self._fence_checked = -math.inf  # time.monotonic() of the last per-step fence check

    def guard(self, fn: Callable[[], None], step: bool = False) -> None:
        """Call ``fn`` unless the tracker is off; its error turns the tracker off. Under the
        service the attempt fence is checked first (:func:`libreyolo_core.engine.fence.check`:
        a given-up attempt logs nothing more, its files in the run folder included); per
        step (``step``) at most every :data:`FENCE_STEP_CHECK_S`, the fence file being on
        shared storage."""
        if self.dead:
            return
        now = time.monotonic()
        if not step or now - self._fence_checked >= FENCE_STEP_CHECK_S:
            self._fence_checked = now
            fence.check(f"{self.tracker} logging")
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - a tracker never fails training
            self.drop(exc)

    def drop(self, exc: BaseException) -> None:
        if not self.dead:
            self.dead = True
            log.warning("%s: %s: %s; no more %s logging for this run", self.tracker,
                        type(exc).__name__, exc, self.tracker)
        self.close()

    def close(self) -> None:
        """Release what the tracker holds (called once when it is dropped or done)."""

    def before_train(self) -> None:
        self.guard(self.open)

    def after_step(self, finite: bool) -> None:
        self.guard(lambda: self.on_step(finite), step=True)

    def after_epoch(self) -> None:
        self.guard(self.on_epoch)

    def after_train(self) -> None:
        self.guard(self.on_end)
        fence.check(f"{self.tracker} logging")  # closing flushes what it queued
        try:  # a dropped tracker closes too: what it holds (a thread, settings) goes with the run
            self.close()
        except Exception as exc:  # noqa: BLE001
            if not self.dead:
                self.drop(exc)

    def open(self) -> None: ...
    def on_step(self, finite: bool) -> None: ...
    def on_epoch(self) -> None: ...
    def on_end(self) -> None: ...


class TensorBoardHook(TrackerHook):
    """TensorBoard event files in the run folder (module docstring)."""

    tracker = "tensorboard"

    def __init__(self) -> None:
        super().__init__()
        self.writer: Any = None
        self._sums: list[float] | None = None
        self._counted = 0
        self._logged_pngs: dict[str, float] = {}
        self._pr_logged: float | None = None

    def open(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        t = self.trainer
        self.writer = SummaryWriter(log_dir=str(t.run_dir), flush_secs=30)
        self.writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in
                                                 t.cfg.model_dump(mode="json").items()), 0)

    def on_step(self, finite: bool) -> None:
        t, m = self.trainer, self.trainer.meter
        if m is None or self.writer is None:
            return
        sums = m.sums.tolist()
        if self._sums is None or m.counted < self._counted:  # a new epoch's meter
            self._sums, self._counted = [0.0] * len(sums), 0
        if finite and m.counted > self._counted:
            step = t.state.epoch * m.steps + m.step
            for name, now, before in zip(m.item_names, sums, self._sums, strict=True):
                self.writer.add_scalar(f"train/{name}_loss", now - before, step)
            self.writer.add_scalar("lr/step", m.lr, step)
        self._sums, self._counted = sums, m.counted

    def on_epoch(self) -> None:
        t, out = self.trainer, self.trainer.outcome
        epoch = out.epoch + 1
        self._sums, self._counted = None, 0
        for name, value in out.losses.items():
            if math.isfinite(value):
                self.writer.add_scalar(f"epoch/{name}_loss", value, epoch)
        self.writer.add_scalar("lr/pg0", out.lr, epoch)
        if out.validated:
            for key in METRICS:
                value = t.state.metrics.get(key)
                if value is not None and math.isfinite(value):
                    self.writer.add_scalar(f"metrics/{key}", value, epoch)
        self._val_files(epoch)
        self.writer.flush()

    def on_end(self) -> None:
        if self.writer is None:  # never opened: the run ended in set-up, before its run folder
            return
        self._val_files(max(self.trainer.state.epoch, 1))

    def _val_files(self, step: int) -> None:
        """The report's PNGs and PR curve under ``<run_dir>/val/``, each time they change."""
        import numpy as np
        from PIL import Image

        val = Path(self.trainer.run_dir) / "val"
        if not val.is_dir():
            return
        for png in sorted(val.glob("*.png")):
            mtime = png.stat().st_mtime
            if self._logged_pngs.get(png.name) == mtime:
                continue
            with Image.open(png) as im:
                pixels = np.asarray(im.convert("RGB"))
            self.writer.add_image(f"val/{png.stem}", pixels, step, dataformats="HWC")
            self._logged_pngs[png.name] = mtime
        report = val / "report.json"
        if report.is_file() and report.stat().st_mtime != self._pr_logged:
            curve = read_pr_curve(self.trainer.run_dir)
            if curve is not None:
                self._pr_curve(curve, step)
            self._pr_logged = report.stat().st_mtime

    def _pr_curve(self, curve: dict[str, Any], step: int) -> None:
        """One TensorBoard PR curve per class (``pr_curve/<class>``) from the report's
        precision-at-recall arrays; TensorBoard's count arrays are not known and are zero."""
        import numpy as np

        recall = np.asarray(curve.get("recall", []), dtype=np.float64)
        for name, prec in curve["precision"].items():
            precision = np.asarray(prec, dtype=np.float64)
            if precision.shape != recall.shape or recall.size < 2:
                continue
            order = np.argsort(-recall, kind="stable")  # thresholds ascending: recall falls
            zeros = np.zeros(recall.size)
            self.writer.add_pr_curve_raw(f"pr_curve/{name}", zeros, zeros, zeros, zeros,
                                         precision[order], recall[order], step,
                                         num_thresholds=int(recall.size))
        if isinstance(curve.get("mAP50"), int | float):
            self.writer.add_scalar("metrics/pr_curve_mAP50", float(curve["mAP50"]), step)

    def close(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            finally:
                self.writer = None


def _flat_params(config: dict[str, Any]) -> dict[str, str]:
    """The resolved config as MLflow parameters (values as text, at most 6000 characters)."""
    return {k: (json.dumps(v) if isinstance(v, list | dict | tuple) else str(v))[:6000]
            for k, v in config.items()}


class MlflowHook(TrackerHook):
    """One MLflow run per training run (module docstring). Calls go through a background
    thread; the queue holds at most ``max_pending`` calls (more are dropped, with the
    tracker's one warning)."""

    tracker = "mlflow"

    def __init__(self, uri: str, max_pending: int = 1000, end_timeout_s: float = 60.0):
        super().__init__()
        self.uri, self.end_timeout_s = uri, end_timeout_s
        self.calls: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=max_pending)
        self.thread: threading.Thread | None = None
        self.client: Any = None
        self.run_id: str | None = None
        self._env_set: list[str] = []

    # -- the background thread ----------------------------------------------------------
    def _work(self) -> None:
        while True:
            call = self.calls.get()
            if call is None:
                return
            if self.dead:
                continue
            try:
                call()
            except Exception as exc:  # noqa: BLE001
                self.drop(exc)

    def _submit(self, call: Callable[[], None]) -> None:
        if self.dead:
            return
        try:
            self.calls.put_nowait(call)
        except queue.Full:
            self.drop(RuntimeError(f"the tracking server at {self.uri} is not keeping up"))

    # -- hook points ---------------------------------------------------------------------
    def open(self) -> None:
        # a server that is down answers at once instead of after minutes of retries
        for key, value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0"), ("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")):
            if key not in os.environ:  # the user's own settings win; ours go at close()
                os.environ[key] = value
                self._env_set.append(key)
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            self.dead = True
            log.warning(MLFLOW_INSTALL)
            return
        t = self.trainer
        self.client = MlflowClient(tracking_uri=self.uri)
        config = t.cfg.model_dump(mode="json")
        tags = {"libreyolo.model": str(config.get("model")), "libreyolo.run_dir": str(t.run_dir)}
        for env, tag in (("LIBREYOLO_JOB_ID", "libreyolo.job_id"), ("LIBREYOLO_USER", "libreyolo.user")):
            if os.environ.get(env):
                tags[tag] = os.environ[env]
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME", "libreyolo")
        run_name = os.environ.get("LIBREYOLO_JOB_ID") or Path(t.run_dir).name

        def start() -> None:
            from mlflow.entities import Param

            found = self.client.get_experiment_by_name(experiment)
            exp_id = found.experiment_id if found else self.client.create_experiment(experiment)
            run = self.client.create_run(exp_id, run_name=run_name, tags=tags)
            self.run_id = run.info.run_id
            (Path(t.run_dir) / "mlflow.json").write_text(json.dumps(
                {"tracking_uri": self.uri, "run_id": self.run_id, "experiment_id": exp_id}),
                encoding="utf-8")
            params = [Param(k, v) for k, v in _flat_params(config).items()]
            for i in range(0, len(params), 100):  # MLflow's batch limit
                self.client.log_batch(self.run_id, params=params[i: i + 100])

        self.thread = threading.Thread(target=self._work, name="mlflow-tracker", daemon=True)
        self.thread.start()
        self._submit(start)

    def on_epoch(self) -> None:
        from mlflow.entities import Metric

        t, out = self.trainer, self.trainer.outcome
        epoch, now = out.epoch + 1, int(time.time() * 1000)
        values = {f"train/{k}_loss": v for k, v in out.losses.items()}
        values["lr/pg0"] = out.lr
        values["epoch_time_s"] = out.epoch_time_s
        if out.validated:
            values.update({f"metrics/{k}": t.state.metrics[k] for k in METRICS if k in t.state.metrics})
        metrics = [Metric(k, float(v), now, epoch) for k, v in values.items() if math.isfinite(float(v))]
        self._submit(lambda: self.client.log_batch(self.run_id, metrics=metrics))

    def on_end(self) -> None:
        t = self.trainer
        run_dir = Path(t.run_dir)
        status = {"succeeded": "FINISHED", "early_stopped": "FINISHED", "interrupted": "KILLED"}.get(str(getattr(t, "status", "")),
                                                                         "FAILED")

        def finish() -> None:
            for name in ("best.pt", "best.onnx", "best.onnx.json"):
                if (run_dir / "weights" / name).is_file():
                    self.client.log_artifact(self.run_id, str(run_dir / "weights" / name), "weights")
            for name in ("results.csv", "mlflow.json"):
                if (run_dir / name).is_file():
                    self.client.log_artifact(self.run_id, str(run_dir / name))
            if (run_dir / "val").is_dir():
                self.client.log_artifacts(self.run_id, str(run_dir / "val"), "val")
            self.client.set_terminated(self.run_id, status)

        self._submit(finish)

    def close(self) -> None:
        thread, self.thread = self.thread, None
        if thread is not None and threading.current_thread() is not thread:
            try:
                self.calls.put(None, timeout=1.0)
            except queue.Full:
                pass
            else:
                thread.join(self.end_timeout_s)  # the run's end waits for the artifacts, bounded
        if thread is None or threading.current_thread() is not thread:
            for key in self._env_set:
                os.environ.pop(key, None)
            self._env_set = []


def tracker_hooks(trainer: TrainerView) -> list[HookBase]:
    """Rank 0's tracker hooks for ``trainer.cfg``: TensorBoard unless ``tensorboard=False``
    (one line when the library is missing) and MLflow when a tracking URI is configured."""
    cfg = trainer.cfg
    hooks: list[HookBase] = []
    if getattr(cfg, "tensorboard", False):
        try:
            import tensorboard  # noqa: F401  (torch.utils.tensorboard needs it)
        except ImportError:
            log.warning(TENSORBOARD_INSTALL)
        else:
            hooks.append(TensorBoardHook())
    uri = getattr(cfg, "mlflow", None) or os.environ.get("MLFLOW_TRACKING_URI")
    if uri and str(uri).lower() not in ("off", "false", "0", "none"):
        hooks.append(MlflowHook(str(uri)))
    return hooks
