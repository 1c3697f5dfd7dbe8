"""DDP building blocks without starting processes: global batch, autobatch, device and
torchrun-environment parsing, callback pickling, the main guard check."""

from __future__ import annotations

import logging

import pytest
import torch

from libreyolo_core.config import resolve_config
from libreyolo_core.distributed.autobatch import (
    DEFAULT_BATCH,
    MAX_EXTRAPOLATION,
    AutobatchError,
    choose_batch,
    fit_batch,
    global_batch,
    probe_batch,
)
from libreyolo_core.distributed.batch import per_rank_batch
from libreyolo_core.distributed.context import init_distributed, torchrun_env
from libreyolo_core.distributed.device import DeviceError, parse_devices, rank_device
from libreyolo_core.distributed.spawn import check_picklable, in_spawned_bootstrap, spawn_train


def module_level_callback(trainer):  # picklable: importable by name
    return None


def test_batch_not_divisible_names_both_numbers_and_the_nearest_valid_batches():
    with pytest.raises(ValueError) as err:
        per_rank_batch(6, 4)
    msg = str(err.value)
    assert "batch=6" in msg and "world_size=4" in msg and "batch=4 or batch=8" in msg
    with pytest.raises(ValueError, match=r"Use batch=4\.$"):  # no batch=0 suggestion
        per_rank_batch(3, 4)
    with pytest.raises(ValueError, match="positive global batch"):
        per_rank_batch(0, 2)
    assert per_rank_batch(8, 2) == 4 and per_rank_batch(16, 1) == 16


def test_spawn_rejects_a_bad_batch_and_a_lambda_before_starting_any_process(tmp_path):
    cfg = resolve_config({"model": "yolo9-t", "data": str(tmp_path / "d.yaml"), "batch": 6, "device": "cpu"})
    with pytest.raises(ValueError, match="batch=4 or batch=8"):
        spawn_train(cfg, 4)
    ok = cfg.model_copy(update={"batch": 8})
    with pytest.raises(RuntimeError) as err:
        spawn_train(ok, 2, callbacks={"on_epoch_end": [module_level_callback, lambda t: None]})
    msg = str(err.value)
    assert "callbacks['on_epoch_end'][1]" in msg and "<lambda>" in msg and "module level" in msg
    check_picklable({"on_epoch_end": [module_level_callback]})  # no error


def test_autobatch_fit_takes_the_power_of_two_below_the_memory_share():
    gib = 2**30
    # 1 GiB fixed + 0.5 GiB per image on an 80 GiB device: 60 % = 48 GiB -> raw 94 -> 64
    sizes = [1, 2, 4, 8, 16, 32]  # probes up to 32: 64 and 128 are within 4x of them
    memory = [gib + 0.5 * gib * b for b in sizes]
    assert fit_batch(sizes, memory, 80 * gib) == 64
    assert fit_batch(sizes, memory, 80 * gib, fraction=0.9) == 128  # raw 142
    assert fit_batch([1, 2], [gib, 2 * gib], 1.5 * gib) == 1


def test_autobatch_fallbacks_never_pass_the_largest_probe_that_fitted():
    gib = 2**30
    # one point (batch 2 ran out of memory): no fit, and never the default 16 > 1
    batch, why = choose_batch([1], [gib], 80 * gib)
    assert batch == 1 and "only 1 probe fitted" in why and "largest probe that fitted 1" in why
    assert choose_batch([1, 2, 4, 8, 16, 32], [gib] * 6, 80 * gib)[0] == DEFAULT_BATCH  # flat: min(16, 32)
    batch, why = choose_batch([1, 2], [2 * gib, gib], 80 * gib)  # negative slope
    assert batch == 2 and "did not grow" in why
    # an extrapolation stays within MAX_EXTRAPOLATION x the largest probe
    batch, why = choose_batch([1, 2, 4], [gib + 0.01 * gib * b for b in (1, 2, 4)], 80 * gib)
    assert batch == 4 * MAX_EXTRAPOLATION and f"at most {MAX_EXTRAPOLATION}x the largest probe" in why
    with pytest.raises(AutobatchError, match="not even batch 1 fits in the device's 80.0 GiB"):
        choose_batch([], [], 80 * gib)


def test_global_batch_is_capped_by_nbs_and_a_multiple_of_world_size():
    assert global_batch(48, 2, None) == 96
    assert global_batch(48, 2, 64) == 64
    assert global_batch(48, 3, 64) == 63
    assert global_batch(8, 4, 2) == 4  # never below one image per rank


def test_autobatch_on_cpu_says_it_needs_a_gpu_and_uses_the_default(caplog):
    model = torch.nn.Conv2d(3, 4, 3)
    with caplog.at_level(logging.WARNING):
        assert probe_batch(model, 64, torch.device("cpu")) == DEFAULT_BATCH
    assert "needs a CUDA device" in caplog.text


def test_device_forms():
    assert parse_devices("cpu") == ["cpu"]
    assert parse_devices(None) == parse_devices("auto")
    for bad in ("gpu", "0,x", "cuda:-1"):
        with pytest.raises(DeviceError, match="invalid"):
            parse_devices(bad)
    n = torch.cuda.device_count()
    with pytest.raises(DeviceError, match=f"CUDA device {n} does not exist"):
        parse_devices([0, n] if n else "0,1")


def test_each_torchrun_rank_takes_its_gpu():
    assert rank_device([], 1, 2) == "cuda:1"  # device unset / auto: LOCAL_RANK
    assert rank_device(["cuda:0"], 1, 2) == "cuda:1"  # one index: torchrun's convention
    assert rank_device(["cuda:2", "cuda:3"], 1, 2) == "cuda:3"  # one named GPU per process
    with pytest.raises(DeviceError, match="names 3 GPUs.*started 2 processes"):
        rank_device(["cuda:0", "cuda:1", "cuda:2"], 0, 2)


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="this machine has MPS")
def test_mps_without_metal_is_a_clear_error():
    with pytest.raises(DeviceError, match="MPS.*not available"):
        parse_devices("mps")


def test_torchrun_environment(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert torchrun_env() is None
    ctx, device = init_distributed("cpu")  # no environment: one process, nothing initialised
    assert not ctx.enabled and ctx.is_main and device == torch.device("cpu")
    assert not torch.distributed.is_initialized()
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert torchrun_env() == (3, 1, 4)
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError, match="not in"):
        torchrun_env()
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    ctx, _ = init_distributed("cpu")  # torchrun --nproc_per_node=1: no process group needed
    assert not ctx.enabled


def test_not_in_a_spawned_bootstrap_here():
    assert not in_spawned_bootstrap()


def test_nothing_fits_names_the_device_its_free_memory_and_a_fixed_batch():
    """#28.11 (a public bug report): the error named neither the device nor its free
    memory, and did not suggest a fixed batch=."""
    from libreyolo_core.distributed.autobatch import nothing_fits

    msg = nothing_fits("cuda:0 (NVIDIA H200)", 140 * 2**30, 2 * 2**30, "batch 1 ran out of memory",
                       1280)
    assert msg.startswith("autobatch: not even batch 1 fits on cuda:0 (NVIDIA H200) (140.0 GiB, "
                          "2.0 GiB free; batch 1 ran out of memory)")
    assert "Set a fixed batch= instead of batch=-1" in msg and "smaller imgsz than 1280" in msg
    assert "other processes hold 138.0 GiB of it" in msg
