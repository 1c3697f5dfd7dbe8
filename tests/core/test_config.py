"""TrainConfig: defaults, family overrides, aliases, errors that name the key."""

import subprocess
import sys

import pytest
from pydantic import ValidationError

from libreyolo_core.config import ConfigError, TrainConfig, describe_config, resolve_config


def test_family_defaults_fill_only_unset_keys():
    cfg = resolve_config(model="yolo9-t", epochs=3)
    assert cfg.scheduler == "linear" and cfg.min_lr_ratio == 0.01 and cfg.mixup == 0.0
    assert cfg.epochs == 3
    assert cfg.model_fields_set == {"model", "epochs"}
    user = resolve_config(model="yolo9-t", mixup=0.3, min_lr_ratio=0.2)
    assert user.mixup == 0.3 and user.min_lr_ratio == 0.2


def test_aliases_map_to_standard_names():
    cfg = resolve_config(model="yolo9-s", lrf=0.1, mosaic_prob=0.5, flip_prob=0.2, close_mosaic=4)
    assert (cfg.min_lr_ratio, cfg.mosaic, cfg.fliplr, cfg.no_aug_epochs) == (0.1, 0.5, 0.2, 4)
    with pytest.raises(ConfigError, match="given twice"):
        resolve_config(lrf=0.1, min_lr_ratio=0.2)


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        ({"epoch": 3}, "epoch", "Did you mean epochs"),
        ({"batch": "x"}, "batch", "integer"),
        ({"lr0": -1}, "lr0", "greater than 0"),
        ({"imgsz": 330}, "imgsz", "use 320 or 352"),
        ({"model": "yolo9-x"}, "model", "Valid models: yolo9-t, yolo9-s"),
        ({"amp_dtype": "fp8"}, "amp_dtype", "bf16, bfloat16, float16, fp16"),
        ({"optimizer": "lion"}, "optimizer", "sgd"),
        ({"cache": "ssd"}, "cache", "false, ram or disk"),
        ({"warmup_lr_start": 1.0}, "warmup_lr_start", "<= lr0"),
        ({"profile_then_stop": True}, "profile_then_stop", "profile=True"),
        ({"scale": "(2, 1)"}, "scale", "lo <= hi"),
        ({"batch": 0}, "batch", "-1 for autobatch"),
        ({"epochs": True}, "epochs", "a number, not true/false"),
        ({"lr0": False}, "lr0", "a number, not true/false"),
        ({"nbs": True}, "nbs", "a number, not true/false"),
    ],
)
def test_bad_values_name_the_key(overrides, key, words):
    with pytest.raises(ConfigError) as info:
        resolve_config(**overrides)
    assert info.value.key == key
    assert words in str(info.value)


def test_normalisation():
    cfg = resolve_config(amp_dtype="BF16", cache="true", device=[0, 1], scale=0.5, resume="true")
    assert cfg.amp_dtype == "bfloat16" and cfg.cache == "ram" and cfg.device == "0,1"
    assert cfg.scale == (0.5, 1.5) and cfg.resume is True
    assert resolve_config(scale="(0.3, 1.2)").scale == (0.3, 1.2)
    assert resolve_config(cache="disk").cache == "disk"


def test_describe_config_marks_sources():
    text = describe_config(resolve_config(model="yolo9-t", epochs=3))
    assert "epochs" in text and "[user]" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("scheduler"))
    assert "'linear'" in line and "[family]" in line
    assert len([ln for ln in text.splitlines() if ":" in ln]) >= len(TrainConfig.model_fields)


def test_config_import_is_torch_free():
    code = "import sys, libreyolo_core.config, libreyolo_core.models; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_are_refused_as_such(value):
    """NaN is no number above 10: the message says "finite", naming the field."""
    with pytest.raises(ValidationError, match="lr0") as err:
        TrainConfig(lr0=value)
    assert "finite number" in str(err.value)
