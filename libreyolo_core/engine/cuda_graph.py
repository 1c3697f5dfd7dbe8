"""CUDA-graph capture of the network's forward and backward during training.

Contract: docs/architecture.md, Trainer (CUDA graphs).

What is captured
    Only the network: ``outputs = model(images)`` in train mode and the matching backward
    (gradients of the outputs with respect to every trainable parameter). Capture uses
    :func:`torch.cuda.make_graphed_callables`: one forward ``torch.cuda.CUDAGraph`` and one
    backward graph sharing a private memory pool, with a static input buffer (the batch
    is copied into it), static outputs, static grad-of-output buffers and static
    parameter-gradient buffers. The graphed forward is an autograd node, so the loss,
    computed **eagerly** on the replayed outputs, back-propagates into it as usual:
    ``loss.backward()`` copies ``d loss / d outputs`` into the static grad buffers, replays
    the backward graph and accumulates the static parameter gradients into ``p.grad``.
    The loss (assignment, masking, branching on its results), the optimizer step,
    gradient clipping, EMA and the LR schedule stay eager.

Shapes
    A graph is valid for one input key ``(shape, dtype, device)``. The manager counts
    keys and captures the first key seen :data:`CAPTURE_AFTER` (3) times; that batch and
    every later batch of the key replay, batches of any other key (multi-scale, the last
    partial batch) run eager. One graph per run (memory). :meth:`CudaGraphManager.invalidate`
    (the trainer calls it on ``captured_region_changed``) drops the graph and the counts;
    the key is captured again after it is seen 3 more times.

Failures
    A capture or replay failure logs one warning and moves the rest of the run to eager
    mode; the batch that failed runs eager (a failed backward replay loses that
    micro-batch's gradient). :func:`build_cuda_graph_manager` writes one line and returns
    ``None`` (eager training, unchanged) on CPU/MPS, under distributed training, for
    distillation runs and for families whose ``Family.cuda_graph`` is False.

Costs and numerics
    Memory: roughly one extra set of activations of the captured shape (static outputs,
    the saved tensors of the captured forward and the backward workspace live in the
    graph's pool); LibreYOLO measured -5 % to +19 % peak allocation across families
    (ResNet-18, 224 px, batch 16: 0.48 GB eager -> 0.57 GB graphed). Capture itself costs
    3 warm-up forward/backward passes plus the capture (once per key). BatchNorm running
    statistics and other buffers are snapshotted before capture and restored in place
    afterwards, so the warm-up passes do not count as training steps. Under AMP,
    autocast must run with its weight-cast cache disabled (``cache_enabled=False``);
    the trainer does so while a manager exists. Stochastic layers (dropout, stochastic
    depth) inside the graph draw from the graph's own Philox offsets: statistically
    equivalent to eager, not bit-identical (one log line at the first capture).
    Published effect (LibreYOLO, RTX 5070 Ti, Windows, AMP, batch 8, 640 px): YOLOv9-t GPU
    step 93.6 -> 47.0 ms (1.99x); not measured in this project yet.

Gradient accumulation
    The parameter gradients returned by a replay are views of static buffers, which the
    next replay overwrites; autograd may "steal" such a view as ``p.grad`` when ``.grad``
    is empty. Before a graphed backward, every live ``.grad`` is therefore cloned, so a
    window of micro-batches sums to ``g0 + g1`` (not ``2 * g1``). With one micro-batch
    per step ``.grad`` is ``None`` at that point and nothing is copied.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "CAPTURE_AFTER",
    "CaptureFn",
    "CudaGraphManager",
    "build_cuda_graph_manager",
    "capture_network",
    "has_stochastic_layers",
]

log = logging.getLogger(__name__)

#: Sightings of one input key before it is captured (LibreYOLO's ``DEFAULT_WARMUP_THRESHOLD``).
CAPTURE_AFTER = 3

#: Warm-up forward/backward passes that ``make_graphed_callables`` runs on a side stream.
WARMUP_ITERS = 3

#: ``capture(model, sample) -> graphed``: ``graphed(x)`` returns the model's outputs for an
#: ``x`` of the sample's key, autograd-connected to the model's parameters. Raises on failure.
CaptureFn = Callable[[nn.Module, Tensor], Callable[[Tensor], Any]]

_FALLBACK = "cuda_graph training capture disabled, falling back to eager: %s"


class _Network(nn.Module):
    """The module handed to ``make_graphed_callables``: ``forward(x) = model(x)``.

    ``make_graphed_callables`` replaces ``forward`` of the module it is given and would
    then replay for *any* input while ``training`` matches, copying a wrong-shaped batch
    into the static buffer (or broadcasting a batch of 1 silently). Wrapping keeps the
    trained model's own ``forward`` untouched; the manager decides per batch which one
    runs. The wrapper has no hooks and exposes exactly the model's parameters and buffers.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Any:
        return self.model(x)


def has_stochastic_layers(model: nn.Module) -> bool:
    """True when ``model`` holds dropout with ``p > 0`` or a stochastic-depth layer.

    Stochastic depth is recognised by class name (``DropPath``, ``StochasticDepth``).
    """
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return True
        name = type(m).__name__.lower()
        if "droppath" in name or "stochasticdepth" in name:
            return True
    return False


def _autocast_without_cache() -> contextlib.AbstractContextManager:
    """Re-enter an active CUDA autocast with its cache disabled (a no-op when off).

    ``make_graphed_callables`` refuses autocast with the weight-cast cache on: cached
    casts made during capture would be freed while the graph still points at them.
    """
    if not torch.is_autocast_enabled("cuda"):
        return contextlib.nullcontext()
    dtype = torch.get_autocast_dtype("cuda")
    return torch.autocast("cuda", dtype=dtype, cache_enabled=False)


def capture_network(model: nn.Module, sample: Tensor) -> Callable[[Tensor], Any]:
    """Capture ``model``'s train-mode forward and backward at ``sample``'s shape.

    Args:
        model: the network on a CUDA device, in train mode; its parameters must not be
            replaced afterwards (optimizers update them in place, which is fine).
        sample: one real batch ``(B, C, H, W)`` on CUDA; it is cloned into the static input.

    Returns:
        ``graphed(x)``: copies ``x`` (same shape, dtype, device) into the static input,
        replays the forward graph and returns the outputs in the model's own structure
        (list/tuple/dict of tensors), views of static buffers valid until the next replay.

    Raises:
        RuntimeError: ``sample`` is not on CUDA, or capture failed (the CUDA error as
            raised by torch). Buffers are restored and the device drained before raising.
    """
    if not sample.is_cuda:
        raise RuntimeError(f"the batch is on {sample.device}, not on a CUDA device")
    net = _Network(model)
    static_x = sample.detach().clone()
    buffers = [b for b in model.buffers()]
    with torch.no_grad():
        saved = [b.detach().clone() for b in buffers]
    try:
        with _autocast_without_cache():
            # thread_local: the pin-memory thread's host allocations must not invalidate
            # the capture (the default "global" mode forbids them process-wide).
            try:
                graphed = torch.cuda.make_graphed_callables(
                    net, (static_x,), num_warmup_iters=WARMUP_ITERS, allow_unused_input=True,
                    capture_error_mode="thread_local",
                )
            except TypeError as exc:  # torch without capture_error_mode
                if "capture_error_mode" not in str(exc):
                    raise
                graphed = torch.cuda.make_graphed_callables(
                    net, (static_x,), num_warmup_iters=WARMUP_ITERS, allow_unused_input=True
                )
    except BaseException:
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()  # drain asynchronous errors before going on eager
        raise
    finally:
        with torch.no_grad():  # undo the warm-up passes' BatchNorm updates, in place
            for b, s in zip(buffers, saved, strict=True):
                b.copy_(s)
    return graphed


class CudaGraphManager:
    """Counts input keys, captures the network on the 3rd sighting, replays, falls back.

    Use (the trainer's forward/backward block)::

        with amp.autocast(cache_enabled=False):
            outputs = manager(images)            # replay or eager
            loss, items = loss_fn(outputs, targets, n)
        manager.backward(scaler.scale(loss * n))  # backward replay or eager backward

    Args:
        model: the network being trained (not a DDP wrapper).
        capture_after: sightings of a key before it is captured (default 3).
        capture_fn: ``capture(model, sample) -> graphed`` (default :func:`capture_network`);
            tests inject their own to exercise the dispatch logic on CPU.

    Attributes:
        state: ``"counting"`` (no graph), ``"captured"`` or ``"failed"`` (eager for good).
        key: the captured ``(shape, dtype, device)`` or ``None``.
        counts: sightings per key since the last capture reset.
        captures, replays, eager_steps: counters (captures includes re-captures).
        reason: why the manager fell back, once ``state == "failed"``.
    """

    def __init__(
        self,
        model: nn.Module,
        capture_after: int = CAPTURE_AFTER,
        capture_fn: CaptureFn | None = None,
    ):
        if capture_after < 1:
            raise ValueError(f"capture_after must be >= 1, got {capture_after}")
        self.model = model
        self.capture_after = int(capture_after)
        self.capture_fn: CaptureFn = capture_fn or capture_network
        self.state = "counting"
        self.key: tuple | None = None
        self.counts: Counter = Counter()
        self.captures = 0
        self.replays = 0
        self.eager_steps = 0
        self.reason = ""
        self._graphed: Callable[[Tensor], Any] | None = None
        self._last_graphed = False
        self._rng_noted = False

    # -- forward --------------------------------------------------------------------------
    @staticmethod
    def input_key(x: Tensor) -> tuple:
        """``(shape, dtype, device)`` of a batch: the identity of a graph."""
        return tuple(x.shape), x.dtype, x.device

    def __call__(self, x: Tensor) -> Any:
        """The network's outputs for batch ``x``: a graph replay or the eager forward."""
        self._last_graphed = False
        if self.state == "failed" or not self.model.training:
            return self._eager(x)
        key = self.input_key(x)
        self.counts[key] += 1
        if self._graphed is None and self.counts[key] >= self.capture_after:
            self._capture(x, key)
        if self._graphed is not None and key == self.key:
            try:
                out = self._graphed(x)
            except Exception as exc:  # noqa: BLE001 - any replay error: eager from now on
                self._fail(f"replay failed ({type(exc).__name__}: {exc})")
                return self._eager(x)
            self.replays += 1
            self._last_graphed = True
            return out
        return self._eager(x)

    def _eager(self, x: Tensor) -> Any:
        self.eager_steps += 1
        return self.model(x)

    def _capture(self, x: Tensor, key: tuple) -> None:
        try:
            graphed = self.capture_fn(self.model, x)
        except Exception as exc:  # noqa: BLE001 - any capture error: eager from now on
            self._fail(f"capture at input shape {key[0]} failed ({type(exc).__name__}: {exc})")
            return
        self._graphed, self.key = graphed, key
        self.state = "captured"
        self.captures += 1
        log.info("cuda_graph: captured training forward/backward at input shape %s (%s)",
                 key[0], str(key[1]).removeprefix("torch."))
        if not self._rng_noted:  # the RNG caveat, once per run
            self._rng_noted = True
            if has_stochastic_layers(self.model):
                log.info("cuda_graph: stochastic layers (dropout / stochastic depth) in the "
                         "captured region draw from the graph's own RNG stream: statistically "
                         "equivalent to eager, not bit-identical")
            else:
                log.info("cuda_graph: no stochastic layers in the captured region; any added "
                         "later would draw from the graph's own RNG stream (statistically "
                         "equivalent to eager, not bit-identical)")

    def _fail(self, reason: str) -> None:
        self._graphed, self.key = None, None
        self.state, self.reason = "failed", reason
        self.counts.clear()
        log.warning(_FALLBACK, reason)

    # -- backward -------------------------------------------------------------------------
    def backward(self, loss: Tensor) -> bool:
        """``loss.backward()`` for the last forward; returns False if a replay failed.

        After a graphed forward, live ``.grad`` tensors are cloned first (see the module
        docstring, "Gradient accumulation"). A failed backward replay moves the run to
        eager mode and drops this micro-batch's gradient (the autograd node of the graph
        returns all parameter gradients at once, so ``.grad`` is left as it was).

        Raises:
            whatever ``loss.backward()`` raises on an eager forward.
        """
        if not self._last_graphed:
            loss.backward()
            return True
        self._last_graphed = False
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad = p.grad.clone()
        try:
            loss.backward()
        except Exception as exc:  # noqa: BLE001 - any replay error: eager from now on
            self._fail(f"backward replay failed ({type(exc).__name__}: {exc}); "
                       "this micro-batch's gradient is dropped")
            return False
        return True

    # -- invalidation ---------------------------------------------------------------------
    def invalidate(self, reason: str) -> None:
        """Drop the graph and the shape counts; the key is captured again after 3 sightings.

        Called when the captured region changes (e.g. a family switches on a loss branch
        that adds network outputs). A manager that has failed stays eager.
        """
        had = self._graphed is not None
        self._graphed, self.key = None, None
        self.counts.clear()
        self._last_graphed = False
        if self.state == "failed":
            return
        self.state = "counting"
        if had and torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()  # give the graph's private pool back
        log.info("cuda_graph: capture invalidated (%s); will re-capture", reason)


def build_cuda_graph_manager(
    model: nn.Module,
    requested: bool,
    device: torch.device,
    family: Any = None,
    distributed: bool | None = None,
    distillation: bool = False,
    **kwargs: Any,
) -> CudaGraphManager | None:
    """A :class:`CudaGraphManager` when ``cuda_graph=True`` can apply, else ``None``.

    Writes one info line for each reason it cannot apply (and trains eager unchanged):
    not a CUDA device, distributed training (``distributed=None`` asks
    ``torch.distributed``), a distillation run, a family whose ``cuda_graph`` flag is
    False. Nothing is logged when ``requested`` is False.

    Args:
        model: the network being trained, already on ``device``.
        requested: the ``cuda_graph`` key of the config.
        device: the training device.
        family: the model's :class:`~libreyolo_core.models.family.Family` (``cuda_graph``,
            ``title``), or ``None``.
        kwargs: passed to :class:`CudaGraphManager` (``capture_after``, ``capture_fn``).
    """
    if not requested:
        return None
    if device.type != "cuda":
        log.info("cuda_graph=True ignored on %s: training in eager mode", device.type)
        return None
    if distributed is None:
        distributed = (torch.distributed.is_available() and torch.distributed.is_initialized()
                       and torch.distributed.get_world_size() > 1)
    why = None
    if distributed:
        why = "distributed training is not supported yet"
    elif distillation:
        why = "distillation runs are not supported"
    elif family is not None and not family.cuda_graph:
        why = f"{family.title} does not support training capture"
    if why:
        log.info("cuda_graph=True ignored (%s): training in eager mode", why)
        return None
    return CudaGraphManager(model, **kwargs)
