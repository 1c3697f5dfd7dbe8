"""One way into a training run: :func:`train_run` takes a
:class:`~libreyolo_core.weights.detector.Detector` and the run's
:class:`~libreyolo_core.config.TrainConfig`, resolved once by the caller, loads a resumed
run's checkpoint once, loads the dataset yaml once (checking a resumed run's classes there),
fits the class layers to the dataset, and trains in this process (one rank under torchrun)
or in one spawned DDP worker per device. It returns a
:class:`~libreyolo_core.records.train.TrainResult`.

Its callers: :meth:`LibreYOLO.train <libreyolo_core.facade.LibreYOLO.train>` (keys resolved
by :func:`train_config`, then :meth:`~libreyolo_core.facade.LibreYOLO.train_resolved`), the
engine CLI's ``libreyolo train`` (which resolves its keys itself, before building the model,
and calls ``train_resolved``) and the profiler's trial
(:func:`~libreyolo_core.profiler.trial.run_trial`), which so does not import the facade.
The preflight is the caller's (a function given as ``preflight_fn``): it runs trials
itself, so the engine does not import it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from libreyolo_core.config import TrainConfig, resolve_config
from libreyolo_core.distributed.context import torchrun_env
from libreyolo_core.distributed.device import parse_devices
from libreyolo_core.engine.checkpoint import load_checkpoint
from libreyolo_core.engine.ema import unwrap
from libreyolo_core.engine.resume import open_resume
from libreyolo_core.engine.run import load_run_data
from libreyolo_core.records.train import TrainResult
from libreyolo_core.weights.load import load_weights
from libreyolo_core.weights.transfer import transfer_weights

if TYPE_CHECKING:
    from libreyolo_core.engine.resume import Resume
    from libreyolo_core.weights.detector import Detector

__all__ = ["train_run", "train_config", "Preflight"]

#: the public API's logger: its records keep the name users configure (the facade's)
log = logging.getLogger("libreyolo_core.facade")

#: ``preflight(cfg, devices, resumed) -> PreflightResult | None``: run before training.
Preflight = Callable[[Any, list[str], bool], Any]


def train_config(det: Detector, data: str | Path | None, keys: Mapping[str, Any]) -> TrainConfig:
    """The run's config: ``keys`` (TrainConfig keys or aliases) for ``det``'s model, with
    ``data`` when given (a resumed run without it trains on the checkpoint's dataset).

    Raises:
        ConfigError: an unknown key, a bad value or a broken cross-field rule.
    """
    return resolve_config({"model": det.name, **({"data": str(data)} if data is not None else {}), **keys})


def train_run(det: Detector, cfg: TrainConfig, callbacks: dict[str, list[Callable]] | None = None,
              preflight_fn: Preflight | None = None) -> TrainResult:
    """Train ``det`` with ``cfg``; afterwards ``det`` holds the best checkpoint's weights (see
    :meth:`LibreYOLO.train <libreyolo_core.facade.LibreYOLO.train>`, which is
    :func:`train_config`, this function and the preflight).

    Args:
        det: the starting weights; updated in place (model, classes, checkpoint, size;
            ``imgsz`` becomes the run's: ``cfg.imgsz``, or a resumed checkpoint's).
        cfg: the resolved config (:func:`train_config`); with ``resume``, the run continues
            the checkpoint with the checkpoint's config (``data``, ``device``, ``workers``,
            ``epochs`` as given win) and, when it holds another model, ``det`` becomes it.
        callbacks: the trainer's callbacks by event name.
        preflight_fn: run once the devices are known (None: no preflight; not
            ``preflight``, which is a training key).

    Returns:
        The :class:`~libreyolo_core.records.train.TrainResult`: the best epoch's metrics
        (``mAP50``, ``mAP50-95``, ``precision``, ``recall``), ``best_epoch``, ``save_dir``,
        ``best_checkpoint``, ``last_checkpoint``, ...

    Raises:
        ValueError: no ``data`` and nothing to resume, or a yaml without ``train``. CheckpointError: a resume checkpoint
        that cannot be read, or whose class count differs from the dataset's.
        DataConfigError, DatasetError, DeviceError, MainGuardError, TrainingInterrupted: as
        :meth:`LibreYOLO.train <libreyolo_core.facade.LibreYOLO.train>`.
    """
    from libreyolo_core.engine.trainer import Trainer

    resumed = open_resume(cfg)  # read once: the trainer continues from it
    if resumed is not None:
        cfg = _adopt_resumed(det, resumed, cfg)
    data = load_run_data(cfg, resumed)  # another class count cannot resume: said before any work
    _fit_classes(det, cfg.seed, data.names)
    devices = parse_devices(cfg.device)
    checked = preflight_fn(cfg, devices, resumed is not None) if preflight_fn is not None else None
    if len(devices) > 1 and torchrun_env() is None:
        result = TrainResult.of(_train_spawned(det, cfg, devices, callbacks))
    else:
        trainer = Trainer(cfg, model=det.model, callbacks=callbacks, preflight=checked, resume=resumed,
                          data=data)
        result = trainer.train()
        det.model = unwrap(trainer.parts.model)
    best = Path(result.best_checkpoint)
    if best.is_file():
        det.model.load_state_dict(load_checkpoint(best)["model"])
        det.checkpoint = best
    # a resumed run trained at its checkpoint's imgsz (unless one was given), not the default
    det.imgsz = (resumed.config(cfg) if resumed is not None else cfg).imgsz
    det.model.eval()
    return result


def _adopt_resumed(det: Detector, resumed: Resume, cfg: TrainConfig) -> TrainConfig:
    """Make ``det`` the resumed checkpoint's model when it holds another one; ``cfg``, with
    the resumed run's dataset when it names none."""
    path, ckpt = resumed.path, resumed.ckpt
    if (ckpt["model_family"], ckpt["size"]) != (det.family.name, det.size):
        log.info("resume: %s holds a %s-%s; continuing that model", path, ckpt["model_family"],
                 ckpt["size"])
        det._adopt(load_weights(path))
    if cfg.data is None:
        cfg = cfg.model_copy(update={"data": ckpt.get("config", {}).get("data") or ""})
    return cfg


def _fit_classes(det: Detector, seed: int, names: dict[int, str]) -> None:
    """Give ``det`` the dataset's ``names``: fresh weights are built under the run's
    ``seed`` (so a seeded run repeats); loaded weights with another class count get fresh
    class layers under the seed, the rest (and the class-tower width) from the weights."""
    if det.checkpoint is None:
        torch.manual_seed(seed)
        det.model, det.nc = det.family.build_model(det.size, len(names)), len(names)
    elif len(names) != det.nc:
        source = det.model.state_dict()
        torch.manual_seed(seed)
        fresh = det.family.build_model(det.size, len(names), **det.family.arch_from_state(source))
        report = transfer_weights(fresh, source)
        log.info("class count %d -> %d: %s", det.nc, len(names), report.summary())
        det.model, det.nc = fresh, len(names)
    det.names = dict(names)


def _train_spawned(det: Detector, cfg: Any, devices: list[str], callbacks: Any) -> dict[str, Any]:
    """The spawn path: autobatch in this process, then one DDP worker per device
    (``devices`` as :func:`parse_devices` gives them; ``["cpu", "cpu"]`` runs Gloo)."""
    from libreyolo_core.distributed.autobatch import autobatch
    from libreyolo_core.distributed.spawn import (
        GUARD_MESSAGE,
        MainGuardError,
        in_spawned_bootstrap,
        spawn_train,
    )
    from libreyolo_core.engine.amp import resolve_amp

    if in_spawned_bootstrap():
        raise MainGuardError(GUARD_MESSAGE)
    if not det.family.spawn:
        raise RuntimeError(f"{det.family.title} cannot spawn DDP workers; launch one process per GPU with "
                           f"`torchrun --nproc_per_node={len(devices)} -m libreyolo_core.cli train ...`")
    world_size = len(devices)
    if cfg.batch == -1:
        first = torch.device(devices[0])
        try:
            det.model.to(first)
            amp = resolve_amp(cfg.amp, cfg.amp_dtype, first)
            batch = autobatch(det.model, cfg.imgsz, first, world_size, cfg.nbs, autocast=amp.autocast)
        finally:
            det.model.to("cpu")
        cfg = cfg.model_copy(update={"batch": batch})
    ids = None
    if devices[0].startswith("cuda"):
        ids = [int(d.split(":")[1]) for d in devices]
        # the workers see only the chosen GPUs, renumbered from 0
        cfg = cfg.model_copy(update={"device": ",".join(str(i) for i in range(world_size))})
    else:
        cfg = cfg.model_copy(update={"device": "cpu"})
    return spawn_train(cfg, world_size, model=det.model, nc=det.nc, callbacks=callbacks, cuda_ids=ids)
