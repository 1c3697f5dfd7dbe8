"""Preflight: a short profile before training that says how long the run will take.

``train(..., preflight=True)`` (``libreyolo train ... preflight=True``, a service job's
``params.preflight``) first runs a profile trial of the same configuration
(:func:`~libreyolo_core.profiler.trial.run_trial`, no trace, the window fitted into one
epoch) for each augmentation phase of the run (:func:`phases_of`: the epochs with mosaic
and mixup, then the last ``no_aug_epochs`` without, which load faster), times a few
validation batches, and turns the figures into a :class:`PreflightEstimate`:

- ``step_ms``: the mean measured step (every measured step on a CPU, where no step is
  synchronised; the unsynced half on a GPU, as the verdict uses); ``img_per_s`` from it;
- ``epoch_s`` = ``steps_per_epoch x step_ms`` + the extra wait of an epoch's first batch
  (the trial's first fetch minus a measured step's fetch: the loader starts empty); a
  no-mosaic step measured slower than the mosaic one (less loading, the same compute: the
  load changed between the trials) takes the mosaic step, with a note;
- ``val_s``: one validation pass, scaled from the first :data:`VAL_BATCHES` batches of a
  fresh (untrained) model (one that has not learnt yet keeps more boxes above ``conf`` for
  NMS, so this leans long);
- ``total_s`` = set-up (dataset, model: the trial's own, until its first event) +
  the epochs of each phase x its ``epoch_s`` + validations x ``val_s``;
- ``peak_memory_mb``: on CUDA the largest allocation of the window
  (``torch.cuda.max_memory_allocated``); on a CPU the process's resident-set high-water
  mark (``getrusage``), which the loader workers add to;
- cost: with a GPU-hour price (:data:`PRICE_ENV`; the service's ``gpu_hour_price`` setting
  sets it for its jobs) ``gpu_hours x price`` on a GPU; a CPU run uses no GPU hours.

The estimate is measured on one device; several ranks (DDP) are not estimated. It is a
snapshot: on a machine whose load changes (other jobs on the same CPU cores) the epochs
that follow can be slower or faster, and the ETA of the run's progress then follows the
epochs it measures (:mod:`libreyolo_core.engine.eta`).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from libreyolo_core.engine.signals import install_sigterm
from libreyolo_core.profiler.record import ProfileRecord
from libreyolo_core.records.events import RunStartEvent

__all__ = ["PreflightEstimate", "Phase", "phases_of", "estimate", "run_preflight", "gpu_hour_price", "PRICE_ENV",
           "CURRENCY_ENV", "VAL_BATCHES"]

log = logging.getLogger(__name__)

#: Environment variable holding the price of one GPU hour (a number); the service's
#: ``gpu_hour_price`` setting sets it for its engines.
PRICE_ENV = "LIBREYOLO_GPU_HOUR_PRICE"
#: Its currency (default ``USD``).
CURRENCY_ENV = "LIBREYOLO_CURRENCY"
#: The preflight window asked for (fitted into one epoch): discarded + measured steps.
WARMUP, STEPS = 3, 12
#: Validation batches timed (the first includes the loader's start).
VAL_BATCHES = 3
#: Training keys that describe the run, not the speed of one step: not passed to the trial.
_NOT_FOR_TRIAL = ("model", "data", "project", "name", "exist_ok", "resume", "preflight",
                  "profile", "profile_then_stop", "profile_steps", "profile_warmup",
                  "profile_trace", "profile_open", "val", "epochs", "no_aug_epochs")


@dataclass(frozen=True)
class PreflightEstimate:
    """What a run will cost, from a short profile of its own configuration.

    Attributes (times in seconds, memory in MiB):
        img_per_s, step_ms: throughput and the mean measured step.
        batch, train_images, steps_per_epoch: the epoch the estimate is for (one device:
            full batches, the partial last one dropped).
        epoch_s: training time of one epoch; first_fetch_s: the part of it spent waiting
            for an epoch's first batch.
        val_s: one validation pass (``None`` when the run does not validate);
            val_batches: the batches timed; validations: how many the run does.
        epochs: the run's epochs. setup_s: set-up before the first step (scan, model,
            loaders, RAM cache). total_s: the whole run (the ETA at the start).
        peak_memory_mb, memory_kind: the peak and what it is (``cuda max allocated`` or
            ``process RSS high-water mark``).
        device: ``cpu``/``cuda``/``mps``. gpus: GPUs the cost counts (1 on CUDA, 0 else).
        gpu_hours, price_per_gpu_hour, currency, cost: ``None`` where they do not apply
            (a CPU run, no price configured).
        verdict, reliable: the trial's bottleneck verdict and whether it was reliable.
        window: ``{"warmup", "steps"}`` of the trial. phases: one row per augmentation
            phase (:func:`phases_of`): ``name``, ``epochs``, ``step_ms``, ``img_per_s``,
            ``first_fetch_s``, ``epoch_s``; the headline figures are the first's.
        measured_s: what the preflight took.
        notes: caveats in words. trial_dir: the trial's files (profile.json, timeline).
    """

    img_per_s: float
    step_ms: float
    batch: int
    train_images: int
    steps_per_epoch: int
    epoch_s: float
    first_fetch_s: float
    val_s: float | None
    val_batches: int
    validations: int
    epochs: int
    setup_s: float
    total_s: float
    peak_memory_mb: float | None
    memory_kind: str | None
    device: str
    gpus: int
    gpu_hours: float | None
    price_per_gpu_hour: float | None
    currency: str | None
    cost: float | None
    verdict: str | None
    reliable: bool | None
    window: dict[str, int] = field(default_factory=dict)
    phases: tuple[dict[str, Any], ...] = ()
    measured_s: float = 0.0
    notes: tuple[str, ...] = ()
    trial_dir: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``preflight.json``, the ``preflight`` event, the job result)."""
        d = asdict(self)
        d["notes"], d["phases"] = list(self.notes), [dict(p) for p in self.phases]
        return d

    def to_json(self) -> str:
        """:meth:`to_dict` as indented JSON."""
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PreflightEstimate:
        """Back from :meth:`to_dict` (unknown keys ignored).

        Raises:
            TypeError: a required field is missing.
        """
        keys = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        keys["notes"] = tuple(keys.get("notes") or ())
        keys["phases"] = tuple(dict(p) for p in keys.get("phases") or ())
        return cls(**keys)

    def moved_to(self, trial_dir: str | Path) -> PreflightEstimate:
        """The same estimate with its trial files at ``trial_dir``."""
        return replace(self, trial_dir=str(trial_dir))

    def summary_line(self) -> str:
        """``preflight: 41.2 img/s, epoch 25 s, 3 epochs + 3 validations: ETA 1 min 32 s,
        peak memory 1,204 MiB (process RSS high-water mark)[, cost 0.42 USD]``."""
        more = "".join(f"; {p['name']}: {p['img_per_s']:.1f} img/s, epoch {fmt_s(p['epoch_s'])}"
                       for p in self.phases[1:])
        text = (f"preflight: {self.img_per_s:.1f} img/s, epoch {fmt_s(self.epoch_s)}{more}, "
                f"{self.epochs} epoch{'s' if self.epochs != 1 else ''}"
                + (f" + {self.validations} validation{'s' if self.validations != 1 else ''}"
                   f" of {fmt_s(self.val_s)}" if self.val_s is not None and self.validations
                   else "")
                + f": ETA {fmt_s(self.total_s)}")
        if self.peak_memory_mb is not None:
            text += f", peak memory {self.peak_memory_mb:,.0f} MiB ({self.memory_kind})"
        if self.cost is not None:
            text += f", cost {self.cost:.2f} {self.currency}"
        return text


def fmt_s(seconds: float | None) -> str:
    """``42 s``, ``3 min 5 s``, ``2 h 01 min``; ``n/a`` for ``None``."""
    if seconds is None:
        return "n/a"
    s = int(round(seconds))
    if s < 60:
        return f"{max(seconds, 0):.0f} s" if seconds >= 10 else f"{max(seconds, 0):.1f} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


def gpu_hour_price(environ: Mapping[str, str] | None = None) -> tuple[float | None, str]:
    """``(price, currency)`` from :data:`PRICE_ENV` / :data:`CURRENCY_ENV`; ``(None, ...)``
    when no price is set. A value that is not a positive number is ignored with a warning."""
    env = os.environ if environ is None else environ
    raw, currency = env.get(PRICE_ENV, "").strip(), env.get(CURRENCY_ENV, "").strip() or "USD"
    if not raw:
        return None, currency
    try:
        price = float(raw)
    except ValueError:
        price = -1.0
    if not price > 0:
        log.warning("%s=%r is not a positive number: no cost estimate", PRICE_ENV, raw)
        return None, currency
    return price, currency


def _step_ms(profile: ProfileRecord) -> float:
    """The mean measured step: every measured step on a CPU (none is synchronised there),
    the unsynced half elsewhere (``profile.step_ms``).

    Raises:
        ValueError: no step time recorded.
    """
    if profile.device_type == "cpu":
        walls = [float(s["wall_ms"]) for s in profile.steps
                 if s.get("kind") != "warmup" and s.get("wall_ms")]
        if walls:
            return statistics.fmean(walls)
    if profile.step_ms is None:
        raise ValueError("the trial's profile records no step_ms")
    return float(profile.step_ms)


def _first_fetch_s(profile: ProfileRecord) -> float:
    """How much longer the window's first batch waited than a measured step's did."""
    steps = profile.steps
    measured = [float(s.get("dataload_ms") or 0.0) for s in steps if s.get("kind") != "warmup"]
    if not steps or not measured:
        return 0.0
    return max(float(steps[0].get("dataload_ms") or 0.0) - statistics.fmean(measured), 0.0) / 1e3


@dataclass(frozen=True)
class Phase:
    """One stretch of epochs that loads data the same way: with mosaic/mixup (the first
    ``epochs - no_aug_epochs``) or without (the last ``no_aug_epochs``).

    Attributes:
        name: ``"mosaic"`` or ``"no mosaic"``. epochs: how many epochs it lasts.
        profile: the trial's ``profile.json`` for it (a mapping is parsed into the record).
    """

    name: str
    epochs: int
    profile: ProfileRecord

    def __post_init__(self) -> None:
        object.__setattr__(self, "profile", ProfileRecord.of(self.profile))


def phases_of(epochs: int, no_aug_epochs: int, mosaic: float, mixup: float) -> list[tuple[str, int]]:
    """``[(name, epochs)]`` of a run: ``mosaic`` for the first ``epochs - no_aug_epochs``,
    ``no mosaic`` for the rest (the trainer's ``close_mosaic``); one phase when mosaic and
    mixup are both off anyway."""
    if mosaic <= 0 and mixup <= 0:
        return [("no mosaic", epochs)]
    aug = max(epochs - no_aug_epochs, 0)
    return [(n, e) for n, e in (("mosaic", aug), ("no mosaic", epochs - aug)) if e > 0]


def estimate(phases: list[Phase], *, train_images: int, batch: int, validations: int,
             val_s: float | None, setup_s: float, peak_memory_mb: float | None = None,
             memory_kind: str | None = None, price: float | None = None,
             currency: str = "USD", val_batches: int = 0, measured_s: float = 0.0,
             trial_dir: str | None = None, notes: tuple[str, ...] = ()) -> PreflightEstimate:
    """Turn the trials' ``profile.json`` into a :class:`PreflightEstimate` (see the module
    docstring for each figure).

    Args:
        phases: the run's phases in order, each with its trial's profile (``steps``,
            ``step_ms``, ``device_type``, ``bound``, ``confidence``, ``window``); the first
            gives the headline figures (the run's first epoch).
        train_images: training images of one epoch. batch: images per step.
        validations: how many validations the run does.
        val_s: one validation pass (``None``: the run does not validate).
        setup_s: set-up before the first step.
        peak_memory_mb, memory_kind: the measured peak and what it is.
        price, currency: price of one GPU hour (``None``: no cost).

    Raises:
        ValueError: no phase, or ``batch`` / ``train_images`` below 1.
    """
    if not phases:
        raise ValueError("estimate needs at least one phase")
    if batch < 1 or train_images < 1:
        raise ValueError(f"batch={batch} and train_images={train_images} must be >= 1")
    steps = train_images // batch if train_images >= batch else 1
    rows: list[dict[str, Any]] = []
    more = list(notes)
    by_name = {ph.name: _step_ms(ph.profile) for ph in phases}
    for ph in phases:
        step_ms = by_name[ph.name]
        if ph.name == "no mosaic" and "mosaic" in by_name and step_ms > by_name["mosaic"]:
            # the same compute with less loading cannot be slower: the load changed between
            # the two trials, and the mosaic trial's step is the bound
            more.append(f"the no-mosaic trial measured a slower step ({step_ms:.0f} ms) than the "
                        f"mosaic one ({by_name['mosaic']:.0f} ms), which loads more: the machine's "
                        "load changed between them; the mosaic step is used for both")
            step_ms = by_name["mosaic"]
        first = _first_fetch_s(ph.profile)
        rows.append({"name": ph.name, "epochs": ph.epochs, "step_ms": round(step_ms, 3),
                     "img_per_s": round(batch * 1e3 / step_ms, 3), "first_fetch_s": round(first, 3),
                     "epoch_s": round(steps * step_ms / 1e3 + first, 3)})
    epochs = sum(r["epochs"] for r in rows)
    total = setup_s + sum(r["epochs"] * r["epoch_s"] for r in rows) \
        + (validations * val_s if val_s is not None else 0.0)
    head = phases[0].profile
    device = str(head.device_type or "cpu")
    gpus = 1 if device == "cuda" else 0
    hours = total / 3600.0 * gpus if gpus else None
    cost = round(hours * price, 4) if hours is not None and price is not None else None
    if price is not None and not gpus:
        more.append(f"a {device.upper()} run uses no GPU hours: no cost at "
                    f"{price:g} {currency} per GPU hour")
    for ph in phases:
        trial_conf = ph.profile.confidence
        if trial_conf is not None and not trial_conf.reliable:
            more.append(f"the {ph.name} trial was not reliable ("
                        + "; ".join(trial_conf.reasons) + "): the estimate may be off")
    conf, w = head.confidence, head.window
    return PreflightEstimate(
        img_per_s=rows[0]["img_per_s"], step_ms=rows[0]["step_ms"], batch=batch,
        train_images=train_images, steps_per_epoch=steps, epoch_s=rows[0]["epoch_s"],
        first_fetch_s=rows[0]["first_fetch_s"],
        val_s=None if val_s is None else round(val_s, 3), val_batches=val_batches,
        validations=validations, epochs=epochs, setup_s=round(setup_s, 3),
        total_s=round(total, 3),
        peak_memory_mb=None if peak_memory_mb is None else round(peak_memory_mb, 1),
        memory_kind=memory_kind, device=device, gpus=gpus,
        gpu_hours=None if hours is None else round(hours, 6),
        price_per_gpu_hour=price if gpus else None, currency=currency if gpus and price else None,
        cost=cost, verdict=head.bound, reliable=conf.reliable if conf is not None else None,
        window={"warmup": int(w.warmup or 0), "steps": int(w.steps or 0)},
        phases=tuple(rows), measured_s=round(measured_s, 3), notes=tuple(more),
        trial_dir=trial_dir,
    )


class _StopFlag:
    """SIGTERM while the preflight runs (main thread): remembered, so that a stop that lands
    between or after the trials' windows still ends the run before training begins (the
    trials' own handler calls this one too)."""

    def __init__(self) -> None:
        self.set = False
        self.restore = install_sigterm(self._handler)  # restore(): the previous handler back

    def _handler(self) -> None:
        self.set = True

    def check(self) -> None:
        """Raise TrainingInterrupted when SIGTERM came."""
        if self.set:
            from libreyolo_core.engine.trainer import TrainingInterrupted

            raise TrainingInterrupted("SIGTERM", None)


class _Take:
    """The first ``n`` batches of a loader, with ``len() == n`` (validation progress)."""

    def __init__(self, loader: Any, n: int):
        self.loader, self.n = loader, n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[Any]:
        for i, batch in enumerate(self.loader):
            if i >= self.n:
                break
            yield batch


def time_validation(cfg: Any, device: Any, batches: int = VAL_BATCHES) -> tuple[float, int] | None:
    """Seconds of one validation pass of ``cfg``'s run, from its first ``batches`` batches.

    The loader is the trainer's (the val split, else train; ``min(workers, 2)`` workers,
    ``cache`` as configured) and the network a fresh one of the run's family, size and
    class count. ``(first batch incl. loader start) + (batches left) x (time per later
    batch) + (the metric computation, scaled by batches)``. ``None`` when the run does not
    validate.
    """
    if not cfg.val:
        return None
    import torch

    from libreyolo_core.data.config import load_data_config
    from libreyolo_core.data.dataset import YOLODataset
    from libreyolo_core.data.loader import build_dataloader
    from libreyolo_core.data.scan import scan_split
    from libreyolo_core.engine.amp import resolve_amp
    from libreyolo_core.eval.validate import validate
    from libreyolo_core.models.registry import parse_model_name

    dc = load_data_config(cfg.data)
    report = scan_split(dc, "val" if dc.val else "train", cache_dir=cfg.cache_dir)
    ds = YOLODataset(report, cfg.imgsz, augment=False, cache=cfg.cache,
                     seed=cfg.seed, rank=0, cache_dir=cfg.cache_dir)
    from libreyolo_core.data.workers import resolved_workers

    loader = build_dataloader(ds, cfg.batch, min(resolved_workers(cfg.workers), 2), shuffle=False,
                              seed=cfg.seed)
    total = len(loader)
    n = max(1, min(batches, total))
    family, size = parse_model_name(cfg.model)
    net = family.build_model(size, len(dc.names)).to(device)
    amp = resolve_amp(cfg.amp, cfg.amp_dtype, device)
    marks: list[float] = []

    def on_batch(k: int, m: int) -> None:  # noqa: ARG001
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        marks.append(time.perf_counter())

    t0 = time.perf_counter()
    try:
        validate(net, family, _Take(loader, n), device, len(dc.names), conf=cfg.conf,
                 iou=cfg.iou, max_det=cfg.max_det, amp=amp, on_batch=on_batch)
        end = time.perf_counter()
    finally:
        del net, loader
        gc.collect()
    if not marks:
        return None
    first = marks[0] - t0
    per = (marks[-1] - marks[0]) / (len(marks) - 1) if len(marks) > 1 else first
    metric_s = (end - marks[-1]) * total / n
    return first + per * (total - 1) + metric_s, n


def _peak_memory(profile: ProfileRecord) -> tuple[float | None, str | None]:
    if profile.peak_vram_mb is not None:
        return float(profile.peak_vram_mb), "cuda max allocated"
    try:
        import resource

        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        scale = 1024.0 if sys.platform != "darwin" else 1024.0 * 1024.0  # KiB on Linux
        return kib / scale, "process RSS high-water mark"
    except (ImportError, OSError):
        return None, None


def run_preflight(model: str, cfg: Any, *, workdir: str | Path | None = None,
                  stdout: TextIO | None = None) -> PreflightEstimate | None:
    """Profile ``cfg``'s run briefly and estimate it (see the module docstring).

    Args:
        model: the model to build (a name such as ``yolo9-t``, or a weights file).
        cfg: the run's resolved TrainConfig (its user keys are the trial's).
        workdir: where the trial's run directory goes (default: a new temporary folder);
            the trainer moves it into ``<run>/preflight/``.
        stdout: where the trial's printed lines go (default: discarded).

    Returns:
        The estimate, or ``None`` (with a logged reason) when one epoch is too short for a
        measured window or the batch is picked at run time (``batch=-1``).

    Raises:
        TrainingInterrupted: SIGTERM while the preflight ran (``last_checkpoint`` is None:
            nothing was trained yet).
        whatever the trial raises for a bad configuration (the same error the run would
        meet).
    """
    from libreyolo_core.data.config import load_data_config
    from libreyolo_core.distributed.device import select_device
    from libreyolo_core.engine.eta import validations_left
    from libreyolo_core.engine.events import read_events
    from libreyolo_core.engine.optim import accumulate_steps
    from libreyolo_core.engine.trainer import TrainingInterrupted
    from libreyolo_core.profiler.trial import run_trial
    from libreyolo_core.profiler.window import _fit

    if cfg.batch == -1:
        log.warning("preflight skipped: batch=-1 (autobatch) is picked when training starts")
        return None
    t0 = time.perf_counter()
    wall0 = time.time()
    images = len(load_data_config(cfg.data).train or ())
    available = images // cfg.batch if images >= cfg.batch else 1
    fit = _fit(available, WARMUP, STEPS, accumulate_steps(cfg.batch, cfg.nbs))
    if fit is None:
        log.warning("preflight skipped: one epoch of %d images at batch %d has %d step(s), too "
                    "few for a measured window", images, cfg.batch, available)
        return None
    warmup, steps = fit
    root = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="libreyolo-preflight-"))
    keys = {k: getattr(cfg, k) for k in cfg.model_fields_set if k not in _NOT_FOR_TRIAL}
    plan = phases_of(cfg.epochs, cfg.no_aug_epochs, cfg.mosaic, cfg.mixup)
    log.info("preflight: profiling %d + %d steps of this configuration (%s) before training",
             warmup, steps, " and ".join(name for name, _ in plan))
    sink = stdout if stdout is not None else open(os.devnull, "w")  # noqa: SIM115
    done: list[Phase] = []
    first_dir, setup_s = None, 0.0
    stop = _StopFlag()
    try:
        for i, (name, n) in enumerate(plan):
            stop.check()
            aug = {} if name == "mosaic" else {"mosaic": 0.0, "mixup": 0.0}
            result = run_trial(cfg.data, model, project=root, name="trial" if i == 0 else "trial_no_mosaic",
                               warmup=warmup, steps=steps, epochs=cfg.epochs, stdout=sink,
                               profile_trace=False, **{**keys, **aug})
            done.append(Phase(name, n, ProfileRecord.of(result.profile)))
            if i == 0:
                first_dir = result.run_dir
                starts = [e for e in read_events(result.run_dir / "events.jsonl")
                          if isinstance(e, RunStartEvent)]
                setup_s = max(float(starts[0].time) - wall0, 0.0) if starts else 0.0
        stop.check()
    except TrainingInterrupted:
        shutil.rmtree(root, ignore_errors=True)
        raise TrainingInterrupted("SIGTERM during the preflight", None) from None
    finally:
        stop.restore()
        if stdout is None:
            sink.close()
    for extra in root.glob("trial_*"):  # the later phases' files join the first's
        if first_dir is not None and extra.is_dir():
            extra.rename(first_dir / extra.name)
    peak, kind = _peak_memory(done[0].profile)
    device = select_device(cfg.device)
    timed = time_validation(cfg, device)
    price, currency = gpu_hour_price()
    est = estimate(
        done, train_images=images, batch=cfg.batch,
        validations=validations_left(0, cfg.epochs, cfg.eval_interval, cfg.val),
        val_s=timed[0] if timed else None, setup_s=setup_s, peak_memory_mb=peak,
        memory_kind=kind, price=price, currency=currency, val_batches=timed[1] if timed else 0,
        measured_s=time.perf_counter() - t0, trial_dir=str(first_dir),
        notes=(("validation timed on a fresh model, whose NMS keeps more boxes than a "
                "trained one's: it leans long",) if timed else ()),
    )
    return est
