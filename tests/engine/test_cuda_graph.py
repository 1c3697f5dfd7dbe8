"""CUDA-graph training capture: dispatch, fallbacks and re-capture (CPU); real capture (GPU).

On CPU the manager runs with an injected capture function. ``static_buffer_capture``
mimics what ``torch.cuda.make_graphed_callables`` hands back: an autograd node whose
backward writes the parameter gradients into static buffers and returns views of them,
so the manager's gradient-accumulation handling is exercised for real. The real capture
path (``capture_network``) runs only where CUDA exists.
"""

from __future__ import annotations

import copy
import logging
import types

import pytest
import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from libreyolo_core.engine import cuda_graph as cg
from libreyolo_core.engine.cuda_graph import (
    CudaGraphManager,
    build_cuda_graph_manager,
    capture_network,
    has_stochastic_layers,
)
from libreyolo_core.models.registry import get_family

LOGGER = "libreyolo_core.engine.cuda_graph"


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.SiLU(),
                         nn.Conv2d(4, 2, 1))


def _lines(caplog, level=logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= level]


class static_buffer_capture:  # noqa: N801 - used like a function
    """A capture function for CPU tests: eager compute, graph-like static gradient buffers.

    ``calls``: captures made; ``replays``: graphed forwards run.
    """

    def __init__(self):
        self.calls = 0
        self.replays = 0

    def __call__(self, model: nn.Module, sample: torch.Tensor):
        self.calls += 1
        params = tuple(model.parameters())
        static_grads = [torch.zeros_like(p) for p in params]
        spec = []
        outer = self

        class Graphed(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, *ps):
                with torch.enable_grad():
                    leaves, tree = tree_flatten(model(x.detach()))
                spec[:] = [tree]
                ctx.leaves = leaves
                return tuple(o.detach() for o in leaves)

            @staticmethod
            def backward(ctx, *grads):
                got = torch.autograd.grad(ctx.leaves, params, grads, allow_unused=True)
                for buf, g in zip(static_grads, got, strict=True):
                    buf.copy_(g if g is not None else torch.zeros_like(buf))
                return (None, *(b.detach() for b in static_grads))

        def graphed(x):
            outer.replays += 1
            out = Graphed.apply(x, *params)
            return tree_unflatten(list(out), spec[0])

        return graphed


def _raising_capture(model, sample):
    raise RuntimeError("operation not permitted when stream is capturing")


# -- the shape counter ---------------------------------------------------------------------
def test_captures_on_third_sighting_and_runs_other_shapes_eager(caplog):
    caplog.set_level(logging.INFO, LOGGER)
    cap = static_buffer_capture()
    m = CudaGraphManager(_net(), capture_fn=cap)
    a, b = torch.rand(2, 3, 8, 8), torch.rand(1, 3, 8, 8)
    m(a), m(b), m(a)
    assert cap.calls == 0 and m.state == "counting" and m.eager_steps == 3
    m(a)  # third sighting of a: captured and replayed at once
    assert cap.calls == 1 and cap.replays == 1 and m.state == "captured"
    assert m.key == ((2, 3, 8, 8), torch.float32, torch.device("cpu"))
    m(b), m(b)  # b reaches 3 sightings, but one graph per run: eager
    out = m(torch.rand(2, 3, 16, 16))  # another shape: eager
    assert out.shape == (2, 2, 16, 16)
    m(a)
    assert cap.calls == 1 and cap.replays == 2 and m.replays == 2 and m.eager_steps == 6
    assert m.counts[m.input_key(b)] == 3
    assert sum("captured training forward/backward at input shape (2, 3, 8, 8)" in s
               for s in _lines(caplog)) == 1
    assert sum("RNG stream" in s for s in _lines(caplog)) == 1


def test_eval_mode_is_never_graphed():
    cap = static_buffer_capture()
    model = _net().eval()
    m = CudaGraphManager(model, capture_fn=cap)
    for _ in range(4):
        m(torch.rand(2, 3, 8, 8))
    assert cap.calls == 0 and not m.counts


def test_capture_after_must_be_positive():
    with pytest.raises(ValueError, match="capture_after"):
        CudaGraphManager(_net(), capture_after=0)


def test_replayed_outputs_and_gradients_match_eager():
    model = _net()
    ref = copy.deepcopy(model)
    m = CudaGraphManager(model, capture_after=1, capture_fn=static_buffer_capture())
    x = torch.rand(2, 3, 8, 8)
    out = m(x)
    assert m.replays == 1
    m.backward(out.square().mean())
    ref(x).square().mean().backward()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


def test_accumulation_clones_grads_before_a_graphed_backward():
    """Two graphed micro-batches must sum to g0 + g1, not 2 * g1 (static grad buffers)."""
    x0, x1 = torch.rand(2, 3, 8, 8), torch.rand(2, 3, 8, 8)
    ref = _net()
    for x in (x0, x1):
        ref(x).square().mean().backward()
    expected = [p.grad.clone() for p in ref.parameters()]

    model = _net()
    m = CudaGraphManager(model, capture_after=1, capture_fn=static_buffer_capture())
    for x in (x0, x1):
        assert m.backward(m(x).square().mean())
    assert m.replays == 2
    for p, e in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad, e)

    # control: a plain loss.backward() after a replay lets .grad alias the static buffers
    naive = _net()
    m = CudaGraphManager(naive, capture_after=1, capture_fn=static_buffer_capture())
    for x in (x0, x1):
        m(x).square().mean().backward()
    assert not all(torch.allclose(p.grad, e) for p, e in zip(naive.parameters(), expected,
                                                               strict=True))


# -- applicability: one line, eager ----------------------------------------------------------
def test_cpu_writes_one_line_and_stays_eager(caplog):
    caplog.set_level(logging.INFO, LOGGER)
    model = _net()
    assert build_cuda_graph_manager(model, True, torch.device("cpu"), family=get_family("yolo9")) is None
    assert _lines(caplog) == ["cuda_graph=True ignored on cpu: training in eager mode"]
    caplog.clear()
    assert build_cuda_graph_manager(model, False, torch.device("cpu")) is None
    assert _lines(caplog) == []


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"distributed": True}, "distributed training is not supported yet"),
        ({"distributed": False, "distillation": True}, "distillation runs are not supported"),
        (
            {"distributed": False,
             "family": types.SimpleNamespace(title="YOLOv9", cuda_graph=False)},
            "YOLOv9 does not support training capture",
        ),
    ],
)
def test_unsupported_runs_write_one_line(caplog, kwargs, why):
    caplog.set_level(logging.INFO, LOGGER)
    # a CUDA device object can be named without a GPU; nothing touches it
    assert build_cuda_graph_manager(_net(), True, torch.device("cuda"), **kwargs) is None
    assert _lines(caplog) == [f"cuda_graph=True ignored ({why}): training in eager mode"]


def test_supported_cuda_run_gets_a_manager():
    m = build_cuda_graph_manager(_net(), True, torch.device("cuda"), family=get_family("yolo9"),
                                 distributed=False, capture_after=2)
    assert isinstance(m, CudaGraphManager) and m.capture_after == 2


# -- failures: eager for the rest of the run, one line -------------------------------------------
def test_capture_failure_falls_back_for_the_rest_of_the_run(caplog):
    caplog.set_level(logging.INFO, LOGGER)
    calls = []

    def capture(model, sample):
        calls.append(tuple(sample.shape))
        _raising_capture(model, sample)

    model = _net()
    m = CudaGraphManager(model, capture_fn=capture)
    x = torch.rand(2, 3, 8, 8)
    outs = [m(x) for _ in range(5)]
    assert calls == [(2, 3, 8, 8)] and m.state == "failed"
    torch.testing.assert_close(outs[2], model(x))  # the failing batch ran eager
    for _ in range(3):
        m(torch.rand(1, 3, 8, 8))  # a new shape reaching 3 sightings: no new attempt
    m.invalidate("region changed")  # a failed manager stays eager, silently
    for _ in range(3):
        m(x)
    assert len(calls) == 1 and m.replays == 0 and m.eager_steps == 11
    warnings = _lines(caplog, logging.WARNING)
    assert len(warnings) == 1
    assert warnings[0].startswith("cuda_graph training capture disabled, falling back to eager: "
                                  "capture at input shape (2, 3, 8, 8) failed (RuntimeError: "
                                  "operation not permitted")
    assert not any("invalidated" in s for s in _lines(caplog))


def test_default_capture_refuses_a_cpu_batch(caplog):
    """The real ``capture_network`` on a CPU batch: one fallback line, BN stats untouched."""
    caplog.set_level(logging.INFO, LOGGER)
    model = _net()
    bn = model[1]
    before = bn.running_mean.clone()
    m = CudaGraphManager(model, capture_after=1)
    assert m.capture_fn is capture_network
    out = m(torch.rand(2, 3, 8, 8))
    assert out.shape == (2, 2, 8, 8) and m.state == "failed"
    assert "not on a CUDA device" in m.reason
    assert len(_lines(caplog, logging.WARNING)) == 1
    assert not torch.equal(bn.running_mean, before)  # only the eager forward updated it
    assert int(bn.num_batches_tracked) == 1


def test_replay_failure_falls_back_and_reruns_the_batch_eager(caplog):
    caplog.set_level(logging.INFO, LOGGER)

    def capture(model, sample):
        def graphed(x):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return graphed

    model = _net()
    m = CudaGraphManager(model, capture_after=1, capture_fn=capture)
    x = torch.rand(2, 3, 8, 8)
    out = m(x)
    assert m.state == "failed" and out.shape == (2, 2, 8, 8) and out.requires_grad
    assert m.backward(out.sum())  # eager backward, no clone, no failure
    warnings = _lines(caplog, logging.WARNING)
    assert len(warnings) == 1 and "replay failed (RuntimeError: CUDA error" in warnings[0]


def test_backward_replay_failure_drops_the_micro_batch(caplog):
    caplog.set_level(logging.INFO, LOGGER)

    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("graph replay failed")

    model = _net()
    first = next(model.parameters())
    m = CudaGraphManager(model, capture_after=1,
                         capture_fn=lambda model, sample: lambda x: Boom.apply(x, first))
    out = m(torch.rand(2, 3, 8, 8))
    assert m.backward(out.sum()) is False
    assert m.state == "failed" and first.grad is None
    assert "backward replay failed" in _lines(caplog, logging.WARNING)[0]


# -- re-capture after captured_region_changed ---------------------------------------------------
def test_invalidate_drops_the_graph_and_recaptures_after_three_more(caplog):
    caplog.set_level(logging.INFO, LOGGER)
    cap = static_buffer_capture()
    m = CudaGraphManager(_net(), capture_fn=cap)
    x = torch.rand(2, 3, 8, 8)
    for _ in range(4):
        m(x)
    assert cap.calls == 1 and cap.replays == 2
    m.invalidate("YOLOX enabled the L1 branch at mosaic close")
    assert m.state == "counting" and m.key is None and not m.counts
    assert "cuda_graph: capture invalidated (YOLOX enabled the L1 branch at mosaic close); " \
           "will re-capture" in _lines(caplog)
    m(x), m(x)
    assert cap.calls == 1 and cap.replays == 2  # eager while counting again
    m(x)
    assert cap.calls == 2 and cap.replays == 3 and m.captures == 2
    # the RNG caveat is written once per run, not per capture
    assert sum("RNG stream" in s for s in _lines(caplog)) == 1


def test_close_mosaic_signal_invalidates_the_manager():
    """The trainer's mosaic switch forwards ``captured_region_changed`` to the manager."""
    from libreyolo_core.engine.hooks import MosaicSwitchHook

    cap = static_buffer_capture()
    m = CudaGraphManager(_net(), capture_after=1, capture_fn=cap)
    m(torch.rand(1, 3, 8, 8))
    assert m.state == "captured"
    emitted = []
    hook = MosaicSwitchHook()
    hook.trainer = types.SimpleNamespace(
        parts=types.SimpleNamespace(train_set=types.SimpleNamespace(close_mosaic=lambda: None),
                                    model=m.model, loss_fn=None, cuda_graph=m, compiled=None),
        family=types.SimpleNamespace(on_mosaic_disable=lambda model, loss: True, title="YOLOX"),
        cfg=types.SimpleNamespace(epochs=10),
        events=types.SimpleNamespace(write=lambda event: emitted.append(event.event)),
    )
    hook.close(7)
    assert emitted == ["captured_region_changed"] and m.state == "counting" and m.key is None


def test_stochastic_layer_detection():
    assert not has_stochastic_layers(_net())
    assert has_stochastic_layers(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1)))
    assert not has_stochastic_layers(nn.Sequential(nn.Dropout(0.0)))

    class DropPath(nn.Module):
        pass

    assert has_stochastic_layers(nn.Sequential(DropPath()))


# -- the trainer ---------------------------------------------------------------------------------
@pytest.fixture
def tiny_yaml(tmp_path):
    from libreyolo_core.data.sample import generate_sample_dataset

    return generate_sample_dataset(tmp_path / "ds", n_train=12, n_val=2, imgsz=64, seed=1)


def _train(tiny_yaml, tmp_path, name, **kw):
    from libreyolo_core import LibreYOLO

    return LibreYOLO("yolo9-t").train(data=tiny_yaml, epochs=1, imgsz=64, batch=4, workers=0,
                                      val=False, device="cpu", project=str(tmp_path), name=name,
                                      **kw)


def test_trainer_on_cpu_logs_once_and_trains_eager(tiny_yaml, tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(CudaGraphManager, "__call__", lambda *a: pytest.fail("manager used"))
    result = _train(tiny_yaml, tmp_path, "cpu", cuda_graph=True)
    assert result["epochs_completed"] == 1
    lines = [r.getMessage() for r in caplog.records if "cuda_graph" in r.getMessage()]
    assert lines == ["cuda_graph=True ignored on cpu: training in eager mode"]


def test_trainer_dispatches_through_the_manager(tiny_yaml, tmp_path, monkeypatch):
    """The trainer's forward/backward block with a manager (CPU stand-in for the graph)."""
    from libreyolo_core.engine import build as build_mod

    made: list[CudaGraphManager] = []
    cap = static_buffer_capture()

    def build(model, requested, device, family=None, **kw):
        made.append(CudaGraphManager(model, capture_fn=cap))
        return made[-1]

    monkeypatch.setattr(build_mod, "build_cuda_graph_manager", build)
    result = _train(tiny_yaml, tmp_path, "graphed", cuda_graph=True)
    assert result["epochs_completed"] == 1
    (m,) = made
    # 3 batches of 4: eager, eager, captured + replayed
    assert cap.calls == 1 and m.replays == 1 and m.eager_steps == 2 and m.state == "captured"


# -- the real capture (GPU only) -------------------------------------------------------------------
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _yolo9_setup(batch=2, imgsz=128):
    yolo9 = get_family("yolo9")

    torch.manual_seed(0)
    model = yolo9.build_model("t", 3).cuda().train()
    ref = copy.deepcopy(model)
    loss_fn = yolo9.build_loss(model)
    # [batch_idx, cls, x1, y1, x2, y2] in input pixels
    targets = torch.tensor([[0, 1, 20, 30, 60, 70], [1, 2, 40, 50, 100, 110]],
                           dtype=torch.float32, device="cuda")
    return model, ref, loss_fn, targets


@pytest.fixture
def no_tf32():
    """fp32 comparisons in true fp32 (cuDNN would use TF32 convolutions by default)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.gpu
@needs_cuda
def test_real_capture_matches_eager_fp32(no_tf32):
    model, ref, loss_fn, targets = _yolo9_setup()
    m = CudaGraphManager(model)
    xs = [torch.rand(2, 3, 128, 128, device="cuda") for _ in range(5)]
    for k, x in enumerate(xs):
        loss, _ = loss_fn(m(x), targets, 2)
        assert m.backward(loss * 2)
        loss_r, _ = loss_fn(ref(x), targets, 2)
        (loss_r * 2).backward()
        torch.testing.assert_close(loss, loss_r, rtol=1e-4, atol=1e-5)
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4)
            p.grad = q.grad = None
        assert m.state == ("captured" if k >= 2 else "counting")
        del loss, loss_r  # as the trainer: no autograd graph outlives its step
    assert m.captures == 1 and m.replays == 3 and m.eager_steps == 2
    # warm-up passes did not count: BatchNorm statistics follow the 5 real batches
    for b, c in zip(model.buffers(), ref.buffers(), strict=True):
        torch.testing.assert_close(b, c, rtol=1e-4, atol=1e-5)
    # another shape runs eager; the graph stays
    loss, _ = loss_fn(m(torch.rand(1, 3, 128, 128, device="cuda")), targets[:1], 1)
    m.backward(loss)
    assert m.replays == 3 and m.state == "captured"


@pytest.mark.gpu
@needs_cuda
def test_real_capture_accumulates_and_recaptures_under_amp():
    model, ref, loss_fn, targets = _yolo9_setup()
    m = CudaGraphManager(model, capture_after=1)
    x0, x1 = (torch.rand(2, 3, 128, 128, device="cuda") for _ in range(2))
    seen: dict = {"graph": [], "eager": []}
    with torch.autocast("cuda", dtype=torch.float16, cache_enabled=False):
        for x in (x0, x1):  # one accumulation window of two graphed micro-batches
            loss, _ = loss_fn(m(x), targets, 2)
            seen["graph"].append(loss.item())
            assert m.backward(loss)
        for x in (x0, x1):
            loss_r, _ = loss_fn(ref(x), targets, 2)
            seen["eager"].append(loss_r.item())
            loss_r.backward()
    assert m.captures == 1 and m.replays == 2
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert torch.isfinite(p.grad).all()
        # the losses in the message tell a different assignment from a different gradient
        torch.testing.assert_close(p.grad.float(), q.grad.float(), rtol=2e-2, atol=2e-3,
                                   msg=lambda text, name=name: f"{name}: {text} (losses {seen})")
    del loss, loss_r
    m.invalidate("test")
    with torch.autocast("cuda", dtype=torch.float16, cache_enabled=False):
        loss, _ = loss_fn(m(x0), targets, 2)
        assert m.backward(loss)
    assert m.captures == 2 and m.state == "captured"


def test_module_has_no_side_effects_on_import():
    assert cg.log.name == LOGGER and not cg.log.handlers
