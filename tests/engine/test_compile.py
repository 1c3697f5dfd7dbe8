"""``compile=True``: torch.compile of the training network, its eager fallback (CPU).

Inductor's code generation takes minutes for a detector, so these tests compile with
cheap backends: ``aot_eager`` (Dynamo + AOTAutograd, as Inductor gets the graphs, without
code generation) on a small network, and ``eager`` (Dynamo's tracing alone) for the real
training runs. Failures are forced with a backend that raises (compiling fails) and with
one whose backward raises once (a compiled backward fails after some gradients landed).
The real Inductor compile is measured on a GPU by ``bench/compile_step.py``.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import pytest
import torch
from torch import nn

from libreyolo_core.engine import compiled as compiled_mod
from libreyolo_core.engine.compiled import CompiledNetwork, build_compiled_network

LOGGER = "libreyolo_core.engine.compiled"


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test starts with Dynamo's caches empty (a new module would otherwise count
    towards the recompile limit of the same code)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.SiLU(),
                         nn.Conv2d(4, 2, 1)).train()


def _lines(caplog, level=logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= level]


def _raising_backend(gm, example_inputs):
    raise RuntimeError("forced compile failure")


# -- the runner --------------------------------------------------------------------------------
def test_compiled_step_matches_eager_and_says_one_line(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    model, ref = _net(), _net()
    net = CompiledNetwork(model, backend="aot_eager")
    x = torch.rand(2, 3, 8, 8)
    for step in range(2):
        out, out_r = net(x), ref(x)
        assert torch.allclose(out, out_r, atol=1e-6)
        assert net.backward(out.square().sum())
        out_r.square().sum().backward()
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            assert torch.allclose(p.grad, q.grad, atol=1e-5), step  # accumulated over 2 steps
    # BatchNorm running statistics are updated by the compiled forward like eager
    assert torch.allclose(model[1].running_mean, ref[1].running_mean, atol=1e-6)
    assert net.state == "compiled" and net.compiled_steps == 2 and net.eager_steps == 0
    assert net.compile_s is not None and net.compile_s > 0
    lines = _lines(caplog)
    assert len(lines) == 1 and lines[0].startswith("compile: the training network is compiled "
                                                   "(mode=default, backend=aot_eager)")
    # the module itself is untouched: its own keys, no torch.compile wrapper inside
    assert list(model.state_dict()) == list(ref.state_dict())


def test_eval_mode_runs_the_bare_module():
    calls = []

    def backend(gm, example_inputs):
        calls.append(1)
        return gm.forward

    model = _net().eval()
    net = CompiledNetwork(model, backend=backend)
    net(torch.rand(1, 3, 8, 8))
    assert calls == [] and net.eager_steps == 1 and net.state == "pending"


def test_a_failing_compile_trains_eager_with_one_line(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    model, ref = _net(), _net()
    net = CompiledNetwork(model, backend=_raising_backend)
    x = torch.rand(2, 3, 8, 8)
    out = net(x)
    assert torch.allclose(out, ref(x), atol=1e-6)  # this batch ran eager
    assert net.backward(out.sum())
    assert net.state == "failed" and "forced compile failure" in net.reason
    net(x)  # eager for good: nothing is compiled again
    assert net.compiled_steps == 0 and net.eager_steps == 2
    (line,) = _lines(caplog)
    assert line.startswith("compile: compiling or running the forward at input shape (2, 3, 8, 8) "
                           "failed (") and line.endswith("; continuing eager for the rest of the run")
    assert "\n" not in line


def test_torch_compile_itself_failing_falls_back(caplog, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", broken)
    net = CompiledNetwork(_net())
    net(torch.rand(1, 3, 8, 8))
    assert net.state == "failed" and net.eager_steps == 1
    assert _lines(caplog, logging.WARNING) == [
        "compile: torch.compile(mode='default') failed (RuntimeError: no compiler here); "
        "continuing eager for the rest of the run"]


class _BackwardFailsOnce:
    """A backend running Dynamo's graph as is, whose first backward raises once the last
    layer's gradients have landed (when the first layer's weight gradient is computed)."""

    def __init__(self, model: nn.Module):
        self.weight = model[0].weight
        self.armed = True
        self.handle = None

    def __call__(self, gm, example_inputs):
        def run(*args):
            if self.armed:
                self.armed = False

                def boom(grad):
                    raise RuntimeError("forced backward failure")

                self.handle = self.weight.register_hook(boom)
            return gm(*args)
        return run


def test_a_failing_compiled_backward_restores_the_gradients_for_an_eager_rerun(caplog):
    model = _net()
    ref = copy.deepcopy(model)
    backend = _BackwardFailsOnce(model)
    net = CompiledNetwork(model, backend=backend)
    x0, x1 = torch.rand(2, 3, 8, 8), torch.rand(2, 3, 8, 8)
    # an accumulation window: micro-batch 0 eager (gradients present), micro-batch 1 compiled
    model(x0).sum().backward()
    before = [p.grad.clone() for p in model.parameters()]
    assert not net.backward(net(x1).sum())  # the caller must run it again
    backend.handle.remove()
    assert net.state == "failed" and "forced backward failure" in net.reason
    for p, g in zip(model.parameters(), before, strict=True):
        assert torch.equal(p.grad, g)  # the last layer's gradient did land, and was undone
    assert net.backward(net(x1).sum())  # the rerun, eager
    ref(x0).sum().backward()
    ref(x1).sum().backward()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-5)  # g0 + g1, nothing twice
    (line,) = _lines(caplog, logging.WARNING)
    assert "forced backward failure" in line and "this micro-batch runs again, eager" in line


def test_close_mosaic_signal_reaches_the_runner(caplog):
    """A network the family changed at mosaic close: the next backward of each input key is
    guarded again (Dynamo's guards recompile the forward by themselves)."""
    import types

    from libreyolo_core.engine.hooks import MosaicSwitchHook

    caplog.set_level(logging.INFO, logger=LOGGER)
    net = CompiledNetwork(_net(), backend="eager")
    x = torch.rand(1, 3, 8, 8)
    assert net.backward(net(x).sum()) and net._keys
    hook = MosaicSwitchHook()
    hook.trainer = types.SimpleNamespace(
        parts=types.SimpleNamespace(train_set=types.SimpleNamespace(close_mosaic=lambda: None),
                                    model=net.module, loss_fn=None, cuda_graph=None, compiled=net),
        family=types.SimpleNamespace(on_mosaic_disable=lambda model, loss: True, title="YOLOX"),
        cfg=types.SimpleNamespace(epochs=10),
        events=types.SimpleNamespace(write=lambda event: None),
    )
    hook.close(7)
    assert not net._keys and net.state == "compiled"
    assert _lines(caplog)[-1] == ("compile: the network changed (YOLOX changed the network at "
                                  "mosaic close); the next step may compile again")
    out = net(x)
    assert net._new_key and net.backward(out.sum())


def test_build_on_cpu_says_it_pays_only_on_a_gpu(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    assert build_compiled_network(_net(), False, torch.device("cpu")) is None
    assert _lines(caplog) == []
    net = build_compiled_network(_net(), "reduce-overhead", torch.device("cpu"))
    assert isinstance(net, CompiledNetwork) and net.mode == "reduce-overhead"
    (line,) = _lines(caplog)
    assert line.startswith("compile=reduce-overhead on cpu: allowed, but it pays only on a GPU")
    assert build_compiled_network(_net(), "default", torch.device("cpu"), announce=False)
    assert len(_lines(caplog)) == 1


def test_config_and_cli_accept_compile():
    from libreyolo_core.cli import parse_args
    from libreyolo_core.config import ConfigError, resolve_config

    command, keys = parse_args(["train", "model=yolo9-t", "compile=true"])
    assert command == "train" and resolve_config(keys).compile == "default"
    assert resolve_config(compile=True).compile == "default"
    assert resolve_config(compile="Max-Autotune").compile == "max-autotune"
    assert resolve_config(compile="false").compile is False
    assert resolve_config().compile is False
    with pytest.raises(ConfigError, match="torch.compile mode"):
        resolve_config(compile="fastest")


# -- the trainer -------------------------------------------------------------------------------
@pytest.fixture
def tiny_yaml(tmp_path):
    from libreyolo_core.data.sample import generate_sample_dataset

    return generate_sample_dataset(tmp_path / "ds", n_train=12, n_val=2, imgsz=64, seed=1)


@pytest.fixture
def made(monkeypatch):
    """The runners the trainer builds, with Dynamo's ``eager`` backend (tracing only)."""
    from libreyolo_core.engine import build as build_mod

    runners: list[CompiledNetwork] = []

    def build(model, requested, device, **kw):
        runner = build_compiled_network(model, requested, device, **kw)
        if runner is not None:
            runners.append(runner)
        return runner

    monkeypatch.setattr(compiled_mod, "BACKEND", "eager")
    monkeypatch.setattr(build_mod, "build_compiled_network", build)
    return runners


def _train(tiny_yaml, tmp_path, name, **kw):
    from libreyolo_core import LibreYOLO

    kw = {"epochs": 1, **kw}
    return LibreYOLO("yolo9-t").train(data=tiny_yaml, imgsz=64, batch=4, workers=0, val=False,
                                      device="cpu", project=str(tmp_path), name=name, **kw)


def _bare_keys() -> list[str]:
    from libreyolo_core.models.registry import get_family

    return list(get_family("yolo9").build_model("t", 3).state_dict())


def test_training_runs_compiled_and_saves_the_bare_modules_keys(tiny_yaml, tmp_path, made):
    from libreyolo_core.engine.checkpoint import load_checkpoint

    result = _train(tiny_yaml, tmp_path, "compiled", compile=True)
    (net,) = made
    # 3 batches of 4, every one compiled (Dynamo's graph of the real network)
    assert net.state == "compiled" and net.compiled_steps == 3 and net.eager_steps == 0
    ckpt = load_checkpoint(result["last_checkpoint"])
    for key in ("model", "train_model"):
        assert list(ckpt[key]) == _bare_keys(), key  # no "_orig_mod." prefix
    assert ckpt["config"]["compile"] == "default"


@pytest.mark.slow
def test_a_compiled_run_resumes_and_trains_as_eager_does(tiny_yaml, tmp_path, made, caplog):
    from libreyolo_core.engine.checkpoint import load_checkpoint
    from libreyolo_core.engine.trainer import TrainingInterrupted

    caplog.set_level(logging.INFO)
    eager = _train(tiny_yaml, tmp_path, "eager", epochs=2)

    def stop(trainer):
        trainer.request_stop("test stop")

    with pytest.raises(TrainingInterrupted):
        _train(tiny_yaml, tmp_path, "compiled", epochs=2, compile=True,
               callbacks={"on_epoch_end": [stop]})
    (first,) = made
    # 3 batches of 4, every one compiled (Dynamo's graph of the real network)
    assert first.state == "compiled" and first.compiled_steps == 3 and first.eager_steps == 0
    last = tmp_path / "compiled" / "weights" / "last.pt"
    ckpt = load_checkpoint(last)
    for key in ("model", "train_model"):
        assert list(ckpt[key]) == _bare_keys(), key

    resumed = _train(tiny_yaml, tmp_path, "compiled", epochs=2, resume=str(last))
    assert resumed["epochs_completed"] == 2
    second = made[1]
    assert second.state == "compiled" and second.compiled_steps == 3
    # the same losses as the eager run: Dynamo's graph computes what the module computes
    assert eager["epochs_completed"] == 2
    rows = (tmp_path / "compiled" / "results.csv").read_text().splitlines()
    rows_eager = (tmp_path / "eager" / "results.csv").read_text().splitlines()
    assert len(rows) == len(rows_eager) == 3
    col = rows[0].split(",").index("train/box_loss")
    for a, b in zip(rows[1:], rows_eager[1:], strict=True):
        assert float(a.split(",")[col]) == pytest.approx(float(b.split(",")[col]), abs=1e-4)
    compile_lines = [m for m in caplog.messages if m.startswith("compile")]
    assert sum(m.startswith("compile=default on cpu: allowed") for m in compile_lines) == 2


def test_a_forced_compile_failure_trains_eager_with_the_line(tiny_yaml, tmp_path, made,
                                                              monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(compiled_mod, "BACKEND", _raising_backend)
    result = _train(tiny_yaml, tmp_path, "broken", compile=True)
    assert result["epochs_completed"] == 1
    (net,) = made
    assert net.state == "failed" and net.compiled_steps == 0 and net.eager_steps == 3
    warned = [r.getMessage() for r in caplog.records
              if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warned) == 1 and "forced compile failure" in warned[0]
    assert warned[0].endswith("continuing eager for the rest of the run")
    assert Path(result["last_checkpoint"]).is_file()


def _losses(run_dir: Path) -> list[float]:
    rows = (run_dir / "results.csv").read_text().splitlines()
    col = rows[0].split(",").index("train/box_loss")
    return [float(r.split(",")[col]) for r in rows[1:]]


def test_a_failing_compiled_backward_in_training_reruns_the_batch_eager(tiny_yaml, tmp_path, made,
                                                                        monkeypatch, caplog):
    """The first compiled backward fails after some gradients landed: they are undone, the
    micro-batch runs again eager, and the epoch's losses are the eager run's."""
    caplog.set_level(logging.INFO)
    armed = [True]

    def backend(gm, example_inputs):
        def run(*args):
            if armed[0]:
                armed[0] = False
                weight = next(made[0].module.parameters())  # the stem: its gradient comes last

                def boom(grad):
                    handle.remove()
                    raise RuntimeError("forced backward failure")

                handle = weight.register_hook(boom)
            return gm(*args)
        return run

    # no warm-up: the first step's gradient moves the weights the next batches see
    eager = _train(tiny_yaml, tmp_path, "eager", warmup_epochs=0, lr0=0.1)
    monkeypatch.setattr(compiled_mod, "BACKEND", backend)
    result = _train(tiny_yaml, tmp_path, "fails", compile=True, warmup_epochs=0, lr0=0.1)
    (net,) = made
    # batch 1 compiled (its backward failed), then batch 1 again and batches 2-3 eager
    assert net.state == "failed" and net.compiled_steps == 1 and net.eager_steps == 3
    warned = [r.getMessage() for r in caplog.records
              if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warned) == 1 and "forced backward failure" in warned[0]
    assert "this micro-batch runs again, eager" in warned[0]
    assert _losses(Path(result["save_dir"])) == pytest.approx(_losses(Path(eager["save_dir"])),
                                                              abs=1e-5)


def test_compile_wins_over_cuda_graph_with_one_line(tiny_yaml, tmp_path, made, monkeypatch,
                                                    caplog):
    caplog.set_level(logging.INFO)

    def no_compiler(*a, **k):  # the decision is made before anything compiles
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", no_compiler)
    _train(tiny_yaml, tmp_path, "both", compile=True, cuda_graph=True)
    assert made[0].reason.endswith("(RuntimeError: no compiler here)")
    # the CUDA-graph manager was never asked for (on a CPU it would say so in a line)
    lines = [m for m in caplog.messages if "cuda_graph" in m]
    assert lines == ["cuda_graph=True ignored: compile=default compiles the network instead "
                     "(the two do not stack; compile='reduce-overhead' adds CUDA graphs to the "
                     "compiled network)"]


def test_module_has_no_side_effects_on_import():
    assert compiled_mod.log.name == LOGGER and not compiled_mod.log.handlers
    assert compiled_mod.BACKEND == "inductor"


# -- the real Inductor compile (GPU only) ----------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_inductor_compiles_a_training_step_on_cuda_under_amp():
    """The default backend (Inductor, Triton kernels) on a small network: fp16 autocast,
    outputs and gradients as eager's within fp16 tolerance, two steps, no fallback."""
    model, ref = _net().cuda(), _net().cuda()
    net = CompiledNetwork(model)
    assert net.backend == "inductor"
    x = torch.rand(4, 3, 32, 32, device="cuda")
    for _ in range(2):
        with torch.autocast("cuda", dtype=torch.float16):
            out, out_r = net(x), ref(x)
            loss, loss_r = out.float().square().mean(), out_r.float().square().mean()
        assert net.backward(loss)
        loss_r.backward()
        assert (out.float() - out_r.float()).norm() <= 0.02 * out_r.float().norm() + 1e-3
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):  # fp16: 5 % of the norm
        assert (p.grad - q.grad).norm() <= 0.05 * q.grad.norm() + 1e-4
    assert net.state == "compiled" and net.compiled_steps == 2 and net.eager_steps == 0, net.reason
