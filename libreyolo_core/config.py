"""TrainConfig: the one schema of every training hyperparameter.

Pydantic v2, importable without torch: the service validates job requests with it. Each
field carries its default, type, range and meaning; cross-field rules live in the model
validator. Family defaults (``Family.overrides``, docs/architecture.md "Models") come from
the model registry and replace only the keys the user did not set (:func:`resolve_config`).

Names follow the field's standard terms (LibreYOLO / Ultralytics); a few Ultralytics or
older LibreYOLO spellings are accepted as aliases (see :data:`ALIASES`).
"""

from __future__ import annotations

import copy
import difflib
import os
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from libreyolo_core.models.registry import ModelNameError, parse_model_name

__all__ = ["AugmentConfig", "TrainConfig", "ConfigError", "ALIASES", "resolve_config", "describe_config"]

#: Alternative spellings accepted on input, mapped to the canonical field name.
ALIASES: dict[str, str] = {
    "lrf": "min_lr_ratio",  # Ultralytics
    "mosaic_prob": "mosaic",  # LibreYOLO Python API
    "mixup_prob": "mixup",
    "flip_prob": "fliplr",
    "mosaic_scale": "scale",
    "close_mosaic": "no_aug_epochs",  # Ultralytics
    "img_size": "imgsz",
    "batch_size": "batch",
}

AMP_DTYPES = {"float16": "float16", "fp16": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}
#: ``torch.compile`` modes (Ultralytics' ``compile`` key takes the same): ``True`` means "default".
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_COMPILE_WORDS = {"true": "default", "1": "default", "yes": "default", "false": False, "0": False,
                  "no": False, "none": False, "": False}
CACHE_MODES = {
    "false": False, "0": False, "no": False, "none": False, "": False,
    "true": "ram", "1": "ram", "yes": "ram", "ram": "ram", "disk": "disk",
}


class ConfigError(ValueError):
    """A training key with a bad value, or an unknown key.

    Attributes:
        key: the offending key (canonical name, or the unknown name as typed).
        value: the value given.
        allowed: what would have been accepted, in words.
    """

    def __init__(self, key: str, value: Any, allowed: str, message: str | None = None):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(message or f"{key}={value!r} is invalid: {allowed}")


def _as_range(v: Any) -> Any:
    """``(lo, hi)`` from a number ``s`` (``(1 - s, 1 + s)``, lo at least 0), a string
    ``"0.5, 1.5"`` / ``"0.5"``, or a pair (returned as given)."""
    if isinstance(v, int | float) and not isinstance(v, bool):
        return (max(1.0 - float(v), 0.0), 1.0 + float(v))
    if isinstance(v, str):
        parts = [p for p in v.strip("()[] ").replace(",", " ").split() if p]
        if len(parts) == 1:
            return _as_range(float(parts[0]))
        return tuple(float(p) for p in parts)
    return v


def _check_range(key: str, value: tuple[float, float]) -> None:
    lo, hi = value
    if not (0 < lo <= hi <= 10):
        raise ValueError(f"{key}=({lo}, {hi}) needs 0 < lo <= hi <= 10")


class AugmentConfig(BaseModel):
    """The augmentation keys the dataset reads, with their defaults, ranges and meanings.

    Declared once here; :class:`TrainConfig` has the same fields (flat keys such as
    ``mosaic=0.5``) and hands a validated copy to the dataset as :attr:`TrainConfig.augment`,
    so the ranges are checked once. Frozen: a dataset cannot change its recipe.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    mosaic: float = Field(1.0, ge=0, le=1, description="mosaic probability")
    mixup: float = Field(1.0, ge=0, le=1, description="mixup probability (keeps both label sets)")
    hsv_prob: float = Field(1.0, ge=0, le=1, description="probability of the HSV jitter")
    hsv_h: float = Field(5.0, ge=0, le=90, description="hue jitter, +- OpenCV hue units (of 180)")
    hsv_s: float = Field(30.0, ge=0, le=255, description="saturation jitter, +- of 255")
    hsv_v: float = Field(30.0, ge=0, le=255, description="value jitter, +- of 255")
    degrees: float = Field(10.0, ge=0, le=180, description="random rotation, +- degrees")
    translate: float = Field(0.1, ge=0, le=0.9, description="random translation, +- fraction")
    scale: tuple[float, float] = Field(
        (0.1, 2.0), description="random scale range (lo, hi); a number s means (1-s, 1+s)"
    )
    shear: float = Field(2.0, ge=0, le=90, description="random shear, +- degrees")
    perspective: float = Field(0.0, ge=0, le=0.001, description="random perspective")
    flipud: float = Field(0.0, ge=0, le=1, description="vertical flip probability")
    fliplr: float = Field(0.5, ge=0, le=1, description="horizontal flip probability")
    mosaic_buffer: int = Field(0, ge=0, le=100_000, description="draw 3 of a mosaic's 4 tiles "
                               "from the last N images each loader worker loaded (Ultralytics' "
                               "buffer; ~1 decode per mosaic, samples then depend on worker count "
                               "and load order, docs/performance.md); 0 = off, from the whole set")
    mosaic_partners: Literal["dataset", "batch"] = Field(
        "dataset", description="where a mosaic's 3 partner tiles (and a mixup's partner) come "
        "from: dataset (any image, LibreYOLO 1.6.0's draws) or batch (the other images of the "
        "same batch: ~1 decode per sample, samples stay a pure function of seed, epoch and "
        "batch; batches of 8 or more, docs/performance.md)")

    @field_validator("scale", mode="before")
    @classmethod
    def _range(cls, v: Any) -> Any:
        return _as_range(v)

    @model_validator(mode="after")
    def _scale_order(self) -> AugmentConfig:
        _check_range("scale", self.scale)
        return self


def _augment(key: str) -> Any:
    """A copy of :class:`AugmentConfig`'s field ``key`` (default, range, description), so
    :class:`TrainConfig` declares the same field without writing it twice."""
    return copy.copy(AugmentConfig.model_fields[key])


#: the annotations of number fields (a bool is refused there, see ``_no_bool_numbers``)
_NUMBERS = (int, float, int | None, float | None)


class TrainConfig(BaseModel):
    """Every training key with its default, type and range.

    The defaults are LibreYOLO's base defaults; a model family replaces some of them
    (:attr:`~libreyolo_core.models.family.Family.overrides`). Effective LR is
    ``lr0`` whatever the batch; ``nbs`` adds gradient accumulation instead.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False,
                              allow_inf_nan=False)

    # -- what to train ---------------------------------------------------------------
    model: str = Field("yolo9-t", description="model name <family>-<size>, e.g. yolo9-t")
    data: str | None = Field(None, description="dataset yaml path (YOLO format)")
    # -- schedule --------------------------------------------------------------------
    epochs: int = Field(300, ge=1, le=100_000, description="training epochs")
    batch: int = Field(16, ge=-1, le=65_536, description="GLOBAL batch size (all ranks); -1 = autobatch")
    imgsz: int = Field(640, ge=32, le=8192, description="square input size, pixels, multiple of 32")
    device: str = Field("auto", description="'auto', 'cpu', 'mps', '0', '0,1', 'cuda:0'")
    workers: int = Field(-1, ge=-1, le=64, description="data-loader worker processes per rank; "
                         "-1 = auto: usable CPUs (affinity) / ranks on the machine, less 1, at most 8")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="seed of shuffling and augmentation")
    # -- optimizer and LR ------------------------------------------------------------
    optimizer: Literal["sgd", "adam", "adamw"] = Field("sgd", description="optimizer")
    lr0: float = Field(0.01, gt=0, le=10, description="initial (peak) learning rate")
    min_lr_ratio: float = Field(0.05, gt=0, le=1, description="final LR = lr0 * min_lr_ratio (alias lrf)")
    momentum: float = Field(0.937, ge=0, lt=1, description="SGD momentum / Adam beta1")
    weight_decay: float = Field(5e-4, ge=0, le=1, description="L2 decay on conv/linear weights only")
    nesterov: bool = Field(True, description="Nesterov momentum (SGD)")
    scheduler: Literal["linear", "cos", "warmcos", "yoloxwarmcos"] = Field(
        "yoloxwarmcos", description="LR schedule after warm-up"
    )
    warmup_epochs: float = Field(5.0, ge=0, description="warm-up length in epochs (LR and momentum)")
    warmup_lr_start: float = Field(0.0, ge=0, description="LR at the first warm-up step")
    warmup_momentum: float = Field(0.8, ge=0, lt=1, description="momentum at the first warm-up step")
    nbs: int | None = Field(
        None, ge=1, le=65_536, description="nominal batch size: accumulate round(nbs/batch) steps; weight "
        "decay scaled by batch*accumulate/nbs. None = no accumulation"
    )
    clip_max_norm: float | None = Field(10.0, ge=0, description="gradient-norm clip; None disables")
    ema: bool = Field(True, description="keep an EMA of the weights (validated and saved)")
    ema_decay: float = Field(0.9998, gt=0, lt=1, description="EMA decay d in d*(1-exp(-n/tau))")
    ema_tau: float = Field(2000.0, gt=0, description="EMA ramp time constant, optimizer steps")
    # -- augmentation (declared once, in AugmentConfig) --------------------------------
    mosaic: float = _augment("mosaic")
    mixup: float = _augment("mixup")
    hsv_prob: float = _augment("hsv_prob")
    hsv_h: float = _augment("hsv_h")
    hsv_s: float = _augment("hsv_s")
    hsv_v: float = _augment("hsv_v")
    degrees: float = _augment("degrees")
    translate: float = _augment("translate")
    scale: tuple[float, float] = _augment("scale")
    shear: float = _augment("shear")
    perspective: float = _augment("perspective")
    flipud: float = _augment("flipud")
    fliplr: float = _augment("fliplr")
    mosaic_buffer: int = _augment("mosaic_buffer")
    mosaic_partners: Literal["dataset", "batch"] = _augment("mosaic_partners")
    mixup_scale: tuple[float, float] = Field((0.5, 1.5), description="mixup image scale range")
    no_aug_epochs: int = Field(15, ge=0, le=100_000, description="last N epochs without mosaic/mixup")
    multi_scale: bool = Field(False, description="each training batch resized on the device to a "
                              "random multiple of the stride in [0.5, 1.5] x imgsz (Ultralytics' "
                              "rule; boxes scaled with it); validation stays at imgsz")
    cache: Literal[False, "ram", "disk"] = Field(False, description="image cache: False, ram, disk")
    cache_recent_mb: int = Field(
        256, ge=0, le=1_048_576, description="MiB of recently decoded images each loader process "
        "keeps (least recently used dropped first), so an image is decoded again only after "
        "dropping out; samples do not change; 0 = off; not used with cache=ram nor by "
        "loader=gpu's training loader")
    loader: Literal["cpu", "gpu"] = Field(
        "cpu", description="where training images are decoded and augmented: cpu (loader "
        "workers, OpenCV) or gpu (workers read file bytes; nvjpeg decode, mosaic, affine, mixup, "
        "HSV and flips as batched tensor ops on the training device; docs/performance.md)")
    cache_dir: str | None = Field(None, description="folder of the label-scan and disk image caches "
                                  "(by content); None: next to the labels and images")
    # -- precision and speed ---------------------------------------------------------
    amp: bool = Field(True, description="mixed precision on CUDA (ignored on CPU)")
    amp_dtype: Literal["float16", "bfloat16"] = Field("float16", description="autocast dtype")
    cuda_graph: bool = Field(False, description="capture forward+backward in a CUDA graph")
    compile: Literal[False, "default", "reduce-overhead", "max-autotune",
                     "max-autotune-no-cudagraphs"] = Field(
        False, description="torch.compile the training network (as Ultralytics' compile): "
        "True = 'default', or a torch.compile mode; pays on a GPU only, the first step "
        "compiles (minutes); eager if compiling fails; wins over cuda_graph")
    channels_last: bool | None = Field(
        None, description="train the network in channels-last (NHWC) memory: None = auto (on "
        "for CUDA and x86 CPUs with oneDNN, where convolutions run faster on it; off elsewhere); "
        "a checkpoint's weights are written in NCHW either way")
    sync_bn: bool = Field(False, description="SyncBatchNorm under DDP")
    # -- profiler --------------------------------------------------------------------
    profile: bool = Field(False, description="profile a window of steps, then keep training")
    profile_then_stop: bool = Field(False, description="stop the run after the profile window")
    profile_warmup: int = Field(5, ge=0, le=10_000, description="profile: steps discarded")
    profile_steps: int = Field(20, ge=2, le=10_000, description="profile: steps measured")
    profile_trace: bool = Field(True, description="profile: record a torch.profiler trace")
    profile_open: bool = Field(False, description="profile: open timeline.html when done")
    preflight: bool = Field(
        False, description="before training, profile a short window of this configuration and "
        "estimate img/s, epoch time, total time (ETA) and peak memory; the cost too with "
        "LIBREYOLO_GPU_HOUR_PRICE")
    # -- validation ------------------------------------------------------------------
    val: bool = Field(True, description="validate during training")
    eval_interval: int = Field(1, ge=1, le=100_000, description="validate every N epochs (and the last)")
    conf: float = Field(0.001, ge=0, le=1, description="validation score threshold")
    iou: float = Field(0.7, gt=0, le=1, description="validation NMS IoU threshold")
    max_det: int = Field(300, ge=1, le=100_000, description="detections kept per image")
    plots: bool = Field(True, description="draw the report's curves, matrices and pictures (val/)")
    plot_images: int = Field(16, ge=0, le=1000, description="validation images drawn with detections")
    # -- run directory and checkpoints -----------------------------------------------
    project: str = Field("runs/train", description="parent folder of run directories")
    name: str = Field("exp", description="run directory name (exp, exp2, ... unless exist_ok)")
    exist_ok: bool = Field(False, description="reuse an existing run directory")
    save_period: int = Field(10, ge=0, le=100_000, description="also save weights/epoch_N.pt every N epochs; 0 off")
    patience: int = Field(50, ge=0, le=100_000, description="stop after N epochs without a better fitness; 0 off")
    resume: bool | str = Field(False, description="True (latest run) or path to last.pt")
    log_interval: int = Field(10, ge=1, le=1_000_000, description="steps between progress events")
    freeze: int | list[str] | None = Field(
        None, description="keep weights and BatchNorm statistics fixed: a count of leading "
        "blocks (freeze=10) or module names (freeze=backbone or [backbone, neck.up1])")
    # -- experiment trackers (engine/trackers.py) --------------------------------------
    tensorboard: bool = Field(True, description="TensorBoard event files in the run folder")
    mlflow: str | None = Field(None, description="MLflow tracking URI (default: $MLFLOW_TRACKING_URI; off: none)")
    export: list[Literal["onnx"]] = Field([], description="export best.pt at the end: [onnx] -> weights/best.onnx")

    # -- field-level normalisation ---------------------------------------------------
    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, v: Any, info: ValidationInfo) -> Any:
        """``epochs=True`` is not one epoch: true/false where a number is expected is
        refused (pydantic's lax mode would read it as 1/0)."""
        if (
            isinstance(v, bool)
            and info.field_name is not None
            and cls.model_fields[info.field_name].annotation in _NUMBERS
        ):
            raise ValueError("should be a number, not true/false")
        return v

    @field_validator("model", mode="before")
    @classmethod
    def _model_name(cls, v: Any) -> str:
        family, size = parse_model_name(str(v))  # raises ModelNameError (a ValueError)
        return f"{family.name}-{size}"

    @field_validator("data", "project", "name", mode="before")
    @classmethod
    def _pathlike(cls, v: Any) -> Any:
        return os.fspath(v) if isinstance(v, os.PathLike) else v

    @field_validator("device", mode="before")
    @classmethod
    def _device(cls, v: Any) -> str:
        if isinstance(v, int) and not isinstance(v, bool):
            return str(v)
        if isinstance(v, list | tuple):
            return ",".join(str(int(x)) for x in v)
        return str(v).strip().lower()

    @field_validator("optimizer", "scheduler", "loader", mode="before")
    @classmethod
    def _lower(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) else v

    @field_validator("amp_dtype", mode="before")
    @classmethod
    def _amp_dtype(cls, v: Any) -> Any:
        key = str(v).strip().lower()
        if key not in AMP_DTYPES:
            raise ValueError(f"must be one of {', '.join(sorted(AMP_DTYPES))}")
        return AMP_DTYPES[key]

    @field_validator("compile", mode="before")
    @classmethod
    def _compile(cls, v: Any) -> Any:
        """``True``/``"true"`` -> ``"default"``; ``False``/``None``/``"false"`` -> False; a
        mode (any case) as torch.compile spells it."""
        if v is None or isinstance(v, bool):
            return "default" if v else False
        key = str(v).strip().lower()
        if key in _COMPILE_WORDS:
            return _COMPILE_WORDS[key]
        if key not in COMPILE_MODES:
            raise ValueError(f"must be true, false or a torch.compile mode: {', '.join(COMPILE_MODES)}")
        return key

    @field_validator("cache", mode="before")
    @classmethod
    def _cache(cls, v: Any) -> Any:
        if v is None or isinstance(v, bool):
            return "ram" if v else False
        key = str(v).strip().lower()
        if key not in CACHE_MODES:
            raise ValueError("must be false, ram or disk")
        return CACHE_MODES[key]

    @field_validator("export", mode="before")
    @classmethod
    def _export(cls, v: Any) -> Any:
        if v is None or v is False or (isinstance(v, str) and v.strip().lower() in ("", "none", "false")):
            return []
        if isinstance(v, str):  # export=onnx, export=[onnx]
            return [p.strip().strip("'\"").lower() for p in v.strip().strip("[]").split(",") if p.strip()]
        return v

    @field_validator("freeze", mode="before")
    @classmethod
    def _freeze(cls, v: Any) -> Any:
        if v is None or v is False or (isinstance(v, str) and v.strip().lower() in ("", "none", "false")):
            return None
        if isinstance(v, bool):
            raise ValueError("must be a count of leading blocks or a list of module names")
        if isinstance(v, str):
            text = v.strip().strip("[]")
            v = int(text) if text.isdigit() else [p.strip().strip("'\"") for p in text.split(",")]
        if isinstance(v, int):
            if not 0 <= v <= 10_000:
                raise ValueError("a count of leading blocks must be between 0 and 10000")
            return v or None
        if isinstance(v, list | tuple):
            names = [str(p).strip() for p in v]
            bad = [p for p in names if not re.fullmatch(r"[A-Za-z_][\w]*(\.[\w]+)*", p)]
            if not names or bad:
                raise ValueError(f"module names must be dotted names like backbone or neck.up1, got {bad or v}")
            return names
        return v

    @field_validator("scale", "mixup_scale", mode="before")
    @classmethod
    def _range(cls, v: Any) -> Any:
        return _as_range(v)

    @field_validator("resume", mode="before")
    @classmethod
    def _resume(cls, v: Any) -> Any:
        if isinstance(v, os.PathLike):
            return os.fspath(v)
        if isinstance(v, str) and v.strip().lower() in {"true", "false", "1", "0", "yes", "no", ""}:
            return v.strip().lower() in {"true", "1", "yes"}
        return v

    # -- cross-field rules -----------------------------------------------------------
    @model_validator(mode="after")
    def _cross_field(self) -> TrainConfig:
        stride = parse_model_name(self.model)[0].stride
        if self.imgsz % stride:
            lo, hi = self.imgsz // stride * stride, (self.imgsz // stride + 1) * stride
            raise ValueError(
                f"imgsz={self.imgsz} must be a multiple of {stride} for {self.model}; "
                f"use {max(lo, stride)} or {hi}"
            )
        if self.batch == 0:
            raise ValueError("batch=0: use a positive batch or -1 for autobatch")
        for key in ("scale", "mixup_scale"):
            _check_range(key, getattr(self, key))
        if self.warmup_lr_start > self.lr0:
            raise ValueError(
                f"warmup_lr_start={self.warmup_lr_start} exceeds lr0={self.lr0}; "
                "it must be <= lr0"
            )
        if self.loader == "gpu" and self.mosaic_buffer:
            raise ValueError(f"loader=gpu does not support mosaic_buffer={self.mosaic_buffer} (the "
                             "buffer keeps decoded images in the loader workers; the gpu loader's "
                             "workers only read files): use mosaic_buffer=0 or loader=cpu")
        if self.mosaic_partners == "batch" and (self.mosaic_buffer or self.loader == "gpu"):
            other = f"mosaic_buffer={self.mosaic_buffer}" if self.mosaic_buffer else "loader=gpu"
            raise ValueError(f"mosaic_partners=batch does not combine with {other} (each picks the "
                             "mosaic's partner tiles its own way): use one of them")
        if self.profile_then_stop and not self.profile:
            raise ValueError("profile_then_stop=True needs profile=True")
        if self.preflight and self.profile_then_stop:
            raise ValueError("preflight=True estimates a training run; a profile-only run "
                             "(profile_then_stop=True) has nothing to estimate")
        return self

    @property
    def augment(self) -> AugmentConfig:
        """This config's augmentation keys as the dataset takes them (already validated
        here, so not checked again)."""
        return AugmentConfig.model_construct(**{k: getattr(self, k) for k in AugmentConfig.model_fields})


# Keys whose pydantic error should be reported as "unknown key" with suggestions.
def _unknown_key_error(key: str) -> ConfigError:
    choices = sorted(TrainConfig.model_fields) + sorted(ALIASES)
    close = difflib.get_close_matches(key, choices, n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return ConfigError(
        key, None, "not a training key",
        f"unknown key {key!r}.{hint} Run `libreyolo cfg` for the valid keys.",
    )


def _allowed(key: str) -> str:
    """Words that say what a field accepts (from its type and constraints)."""
    info = TrainConfig.model_fields.get(key)
    if info is None:
        return ""
    ann = info.annotation
    name = getattr(ann, "__name__", None) if isinstance(ann, type) else str(ann)
    parts = [str(name).replace("typing.", "")]
    for meta in info.metadata:
        for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if getattr(meta, attr, None) is not None:
                parts.append(f"{sym} {getattr(meta, attr)}")
    return ", ".join(parts)


def _to_config_error(exc: ValidationError, given: Mapping[str, Any]) -> ConfigError:
    err = exc.errors()[0]
    loc = [str(p) for p in err.get("loc", ()) if not isinstance(p, int)]
    msg = err.get("msg", "invalid value").removeprefix("Value error, ")
    if not loc:  # a cross-field rule: the message names its keys
        key = msg.split("=", 1)[0] if "=" in msg.split(" ", 1)[0] else "config"
        return ConfigError(key, given.get(key), msg, msg)
    key = loc[0]
    if err.get("type") == "extra_forbidden":
        return _unknown_key_error(key)
    value = given.get(key, err.get("input"))
    allowed = _allowed(key)
    return ConfigError(key, value, allowed, f"{key}={value!r} is invalid: {msg} (allowed: {allowed})")


def canonical_keys(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Map aliases (``lrf``, ``mosaic_prob``...) to field names; ``-`` becomes ``_``.

    Raises:
        ConfigError: an alias and its field are both given.
    """
    out: dict[str, Any] = {}
    for raw, value in overrides.items():
        key = str(raw).replace("-", "_")
        key = ALIASES.get(key, key)
        if key in out:
            raise ConfigError(key, value, f"given twice ({raw!r} is an alias of {key!r})")
        out[key] = value
    return out


def resolve_config(overrides: Mapping[str, Any] | None = None, **kwargs: Any) -> TrainConfig:
    """Validate user keys and fill the rest from the family defaults, then the base defaults.

    Args:
        overrides: user-given keys (canonical names or aliases); ``model`` picks the family.
        **kwargs: more user keys (merged over ``overrides``).

    Returns:
        The resolved :class:`TrainConfig`; ``model_fields_set`` holds the user's keys.

    Raises:
        ConfigError: unknown key (closest matches suggested), bad value (key, value and
            what is allowed), or a broken cross-field rule.
    """
    given = canonical_keys({**(overrides or {}), **kwargs})
    for key in given:
        if key not in TrainConfig.model_fields:
            raise _unknown_key_error(key)
    try:
        family, size = parse_model_name(given.get("model", TrainConfig.model_fields["model"].default))
    except ModelNameError as exc:
        raise ConfigError("model", given.get("model"), str(exc), str(exc)) from None
    merged = {**family.defaults(size), **given}
    try:
        cfg = TrainConfig(**merged)
    except ValidationError as exc:
        raise _to_config_error(exc, merged) from None
    return with_given(cfg, given)  # family defaults are not user choices


def with_given(cfg: TrainConfig, given: Any) -> TrainConfig:
    """``cfg`` with only the keys in ``given`` counted as the user's (its
    ``model_fields_set``): a resumed run keeps the checkpoint's value of every other key,
    and ``describe_config`` calls the rest defaults. Pydantic has no public setter for it
    (``model_construct(_fields_set=...)`` would skip validation)."""
    object.__setattr__(cfg, "__pydantic_fields_set__", set(given))
    return cfg


def describe_config(cfg: TrainConfig) -> str:
    """Printable resolved config: one ``key: value  # description [source]`` line per field.

    Source is ``user`` for keys the user set, ``family`` for family defaults, else
    ``default``.
    """
    family, size = parse_model_name(cfg.model)
    family_keys = set(family.defaults(size))
    lines = [f"# resolved training config for {cfg.model} ({family.title})"]
    width = max(len(k) for k in TrainConfig.model_fields)
    for key, info in TrainConfig.model_fields.items():
        value = getattr(cfg, key)
        source = "user" if key in cfg.model_fields_set else (
            "family" if key in family_keys else "default"
        )
        lines.append(f"{key:<{width}} : {value!r:<16} # {info.description} [{source}]")
    return "\n".join(lines)
