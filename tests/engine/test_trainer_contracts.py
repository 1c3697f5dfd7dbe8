"""The trainer's contracts: the hook order, TrainState's save/load round trip and the
resume decision table."""

from __future__ import annotations

import os
import types

import pytest
import torch
from torch import nn

from libreyolo_core import LibreYOLO
from libreyolo_core.config import resolve_config
from libreyolo_core.distributed.context import DistContext
from libreyolo_core.engine.amp import resolve_amp
from libreyolo_core.engine.checkpoint import (
    CheckpointError,
    lean_state,
    load_checkpoint,
    save_checkpoint,
)
from libreyolo_core.engine.ema import ModelEMA
from libreyolo_core.engine.hooks import (
    CallbackHook,
    CheckpointHook,
    HookBase,
    MosaicSwitchHook,
    NonFiniteGuard,
    ProfilerHook,
    ProgressHook,
    ReportHook,
    ValidationHook,
    WatchdogHook,
)
from libreyolo_core.engine.hooks.policy import default_hooks
from libreyolo_core.engine.resume import Resume, open_resume, resume_path
from libreyolo_core.engine.state import TrainState


# -- hooks ----------------------------------------------------------------------------------
def _fake_trainer(rank: int, world_size: int, profile: bool) -> types.SimpleNamespace:
    return types.SimpleNamespace(dist=DistContext(rank=rank, local_rank=rank, world_size=world_size),
                                 cfg=types.SimpleNamespace(profile=profile))


@pytest.mark.parametrize("rank, world_size, profile, expected", [
    # the hang watchdog first on every rank: it sees every step (a hook may end the epoch)
    (0, 1, False, [WatchdogHook, MosaicSwitchHook, ValidationHook, CheckpointHook, ReportHook, ProgressHook,
                   NonFiniteGuard, CallbackHook]),
    (0, 1, True, [WatchdogHook, MosaicSwitchHook, ProfilerHook, ValidationHook, CheckpointHook, ReportHook,
                  ProgressHook, NonFiniteGuard, CallbackHook]),
    (0, 2, True, [WatchdogHook, MosaicSwitchHook, ValidationHook, CheckpointHook, ReportHook, ProgressHook,
                  NonFiniteGuard, CallbackHook]),
    (1, 2, False, [WatchdogHook, MosaicSwitchHook, ValidationHook, NonFiniteGuard]),
], ids=["single", "profiled", "ddp-rank0", "ddp-rank1"])
def test_default_hooks_decide_rank_0_once(rank, world_size, profile, expected):
    """Rank 0 alone profiles (never under DDP), saves, reports and calls back; the order is
    the contract (validation before the checkpoint, both before the epoch_end event and
    the user's on_epoch_end)."""
    trainer = _fake_trainer(rank, world_size, profile)
    hooks = default_hooks(trainer, {})
    assert [type(h) for h in hooks] == expected
    assert all(h.trainer is trainer for h in hooks)


class _Recorder(HookBase):
    """Writes the name of every hook point it is called at into ``calls``."""

    def __init__(self, calls: list[str]):
        self.calls = calls

    def before_train(self) -> None:
        self.calls.append("before_train")

    def before_epoch(self) -> None:
        self.calls.append("before_epoch")

    def after_step(self, finite: bool) -> None:
        self.calls.append(f"after_step:{finite}")

    def after_train_epoch(self) -> None:
        self.calls.append("after_train_epoch")

    def on_interrupt(self) -> None:
        self.calls.append("on_interrupt")

    def after_epoch(self) -> None:
        self.calls.append("after_epoch")

    def after_train(self) -> None:
        self.calls.append("after_train")


@pytest.fixture
def tiny_yaml(tmp_path):
    from libreyolo_core.data.sample import generate_sample_dataset

    return generate_sample_dataset(tmp_path / "ds", n_train=4, n_val=2, imgsz=64, seed=1)


def test_hook_points_are_called_in_loop_order(tiny_yaml, tmp_path):
    """A hook appended from on_train_start (still inside before_train, so it gets that
    point too) sees every point of a 2-epoch run of 2 steps each, in the documented order;
    on_epoch_end comes after the checkpoint."""
    calls: list[str] = []

    def add_recorder(trainer):
        recorder = _Recorder(calls)
        recorder.trainer = trainer
        trainer.hooks.append(recorder)

    def on_epoch_end(trainer):
        assert (trainer.run_dir / "weights" / "last.pt").is_file()
        calls.append("on_epoch_end")

    LibreYOLO("yolo9-t").train(data=tiny_yaml, epochs=2, imgsz=64, batch=2, workers=0, device="cpu",
                               warmup_epochs=0, no_aug_epochs=1, project=str(tmp_path), name="hooks",
                               callbacks={"on_train_start": [add_recorder], "on_epoch_end": [on_epoch_end]})
    epoch = ["before_epoch", "after_step:True", "after_step:True", "after_train_epoch", "on_epoch_end",
             "after_epoch"]
    assert calls == ["before_train"] + epoch + epoch + ["after_train"]


# -- TrainState -----------------------------------------------------------------------------
def _parts(seed: int) -> types.SimpleNamespace:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return types.SimpleNamespace(model=model, optimizer=optimizer, ema=ModelEMA(model, 0.9, 2.0),
                                 amp=resolve_amp(False, "float16", torch.device("cpu")))


def test_train_state_save_load_round_trip(tmp_path):
    """What TrainState.checkpoint writes (through the checkpoint file), TrainState.load
    reads back: weights, EMA, optimizer, RNG and every counter; ``start_epoch`` is the
    next epoch and later history rows are dropped."""
    parts = _parts(0)
    parts.model(torch.rand(2, 3, 8, 8)).sum().backward()
    parts.optimizer.step()
    parts.ema.update(parts.model)
    state = TrainState(epoch=2, best_fitness=0.5, best_epoch=2, best_metrics={"mAP50": 0.6},
                       history=[{"epoch": e, "epoch_time_s": 1.5, "val_time_s": 0.5, "validated": 1}
                                for e in (1, 2, 3, 4)],
                       nonfinite_skipped=3)
    meta = {"model_family": "yolox", "size": "n", "nc": 1, "names": {0: "a"}, "imgsz": 64}
    ckpt = state.checkpoint(2, parts, meta=meta, config={"epochs": 5})
    rng = torch.get_rng_state()
    path = save_checkpoint(ckpt, tmp_path / "last.pt")
    assert set(lean_state(ckpt)) < set(ckpt)  # best.pt keeps no training state

    torch.manual_seed(123)  # another RNG state, which load puts back
    fresh, restored = _parts(1), TrainState()
    restored.load(load_checkpoint(path), fresh, path=path, title="toy")
    assert torch.equal(torch.get_rng_state(), rng)
    for a, b in zip(parts.model.state_dict().values(), fresh.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(parts.ema.module.state_dict().values(), fresh.ema.module.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert fresh.ema.updates == parts.ema.updates == 1
    momentum = [s["momentum_buffer"] for s in fresh.optimizer.state_dict()["state"].values()]
    assert momentum and all(torch.equal(a, s["momentum_buffer"]) for a, s in
                            zip(momentum, parts.optimizer.state_dict()["state"].values(), strict=True))
    assert (restored.start_epoch, restored.best_fitness, restored.best_epoch) == (3, 0.5, 2)
    assert restored.best_metrics == {"mAP50": 0.6} and restored.nonfinite_skipped == 3
    assert [r["epoch"] for r in restored.history] == [1, 2, 3]
    assert restored.train_s == [1.5, 1.5, 1.5] and restored.val_s == [0.5, 0.5, 0.5]


def test_train_state_load_refuses_weights_of_another_model(tmp_path):
    parts = _parts(0)
    meta = {"model_family": "yolox", "size": "n", "nc": 1, "names": {0: "a"}, "imgsz": 64}
    ckpt = TrainState().checkpoint(0, parts, meta=meta, config={})
    other = _parts(0)
    other.model = nn.Sequential(nn.Conv2d(3, 8, 3))
    with pytest.raises(CheckpointError, match=r"last.pt: its weights do not fit toy"):
        TrainState().load(ckpt, other, path=tmp_path / "last.pt", title="toy")


# -- resume ---------------------------------------------------------------------------------
def _last(run, age: float, tmp_path):
    path = tmp_path / "runs" / run / "weights" / "last.pt"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x")
    os.utime(path, (age, age))
    return path


@pytest.mark.parametrize("resume", [None, False, "", "false", "no", "0"])
def test_resume_off(resume, tmp_path):
    assert resume_path(resume, tmp_path) is None


@pytest.mark.parametrize("resume", [True, "true", "yes", "1"])
def test_resume_true_takes_the_newest_last_pt(resume, tmp_path):
    _last("old", 1_000, tmp_path)
    new = _last("new", 2_000, tmp_path)
    assert resume_path(resume, tmp_path / "runs") == new


def test_resume_true_without_a_last_pt_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="resume=True: no weights/last.pt under"):
        resume_path(True, tmp_path)


def test_resume_path_is_that_file(tmp_path):
    assert resume_path(tmp_path / "x" / "epoch_3.pt", tmp_path) == tmp_path / "x" / "epoch_3.pt"
    assert resume_path(str(tmp_path / "a.pt"), tmp_path) == tmp_path / "a.pt"


def test_resume_config_run_dir_and_lean_refusal(tmp_path):
    """The resumed run continues with the checkpoint's config, except the call's data,
    device, workers and epochs; it writes into the checkpoint's run directory. A lean
    checkpoint has no training state to resume."""
    saved = resolve_config({"model": "yolo9-t", "data": "old.yaml", "epochs": 3, "lr0": 0.02, "workers": 4})
    ckpt = {"config": saved.model_dump(mode="json"), "epoch": 1}
    path = tmp_path / "run7" / "weights" / "last.pt"
    given = resolve_config({"model": "yolo9-t", "data": "new.yaml", "epochs": 9, "resume": str(path)})
    cfg = Resume(path, ckpt).config(given)
    assert (cfg.data, cfg.epochs, cfg.lr0, cfg.workers, cfg.resume) == ("new.yaml", 9, 0.02, 4, str(path))
    assert Resume(path, ckpt).run_dir == tmp_path / "run7" and Resume(path, ckpt).epochs_done == 2

    # the caches change no sample: a resume takes them (a run killed for memory resumes
    # with less); the keys it does not take are named, with the checkpoint's values
    given = resolve_config({"model": "yolo9-t", "data": "new.yaml", "lr0": 0.5, "val": False,
                            "cache_recent_mb": 0, "cache": "disk", "project": "elsewhere",
                            "channels_last": False})
    cfg = Resume(path, ckpt).config(given)
    assert (cfg.cache_recent_mb, cfg.cache, cfg.lr0, cfg.val) == (0, "disk", 0.02, True)
    assert cfg.channels_last is False  # the layout goes with the device, taken like it
    assert Resume(path, ckpt).ignored(given) == ["lr0=0.02", "val=True"]
    same = resolve_config({"model": "yolo9-t", "lr0": 0.02, "epochs": 5})
    assert Resume(path, ckpt).ignored(same) == []

    meta = {"model_family": "yolox", "size": "n", "nc": 1, "names": {0: "a"}, "imgsz": 64}
    full = TrainState().checkpoint(0, _parts(0), meta=meta, config=saved.model_dump(mode="json"))
    save_checkpoint(lean_state(full), tmp_path / "best.pt")
    with pytest.raises(ValueError, match="best.pt: has no training state to resume"):
        open_resume(given.model_copy(update={"resume": str(tmp_path / "best.pt")}))
    assert open_resume(given.model_copy(update={"resume": False})) is None
