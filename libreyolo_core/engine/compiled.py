"""``compile=True``: ``torch.compile`` of the training network, with an eager fallback.

Contract: docs/performance.md, "torch.compile"; the key mirrors Ultralytics' ``compile``
(``True`` = mode ``"default"``, or a mode string ``"reduce-overhead"``, ``"max-autotune"``,
``"max-autotune-no-cudagraphs"``, passed to :func:`torch.compile` unchanged).

What is compiled
    Only the network's train-mode forward (``outputs = model(images)``) and, through
    AOTAutograd, its backward; the loss, the optimizer step, gradient clipping, EMA and
    validation stay eager. The trained module is never replaced: :class:`CompiledNetwork`
    holds the ``torch.compile`` wrapper beside it, so checkpoints, the EMA, freezing,
    validation and export see the bare module and its ``state_dict`` keys (no
    ``_orig_mod.`` prefix). Under DDP the wrapper compiles the ``DistributedDataParallel``
    module (``torch.compile(DDP(model))``, the order PyTorch documents: Dynamo splits the
    graph at DDP's gradient buckets).

When it compiles
    Lazily: the first train-mode forward traces and compiles the forward (TorchDynamo +
    Inductor), its backward compiles at the first backward. A new input key
    ``(shape, dtype, device)`` or a changed network (``invalidate``) may compile again.
    The first step's wall time is logged (``compile_s``). Eval-mode calls run the bare
    module eagerly (validation never compiles).

Failures
    If ``torch.compile``, a compiled forward or a compiled backward raises, one warning
    says what failed and that training continues eager, and the rest of the run is eager.
    A failed forward reruns that batch eagerly. A failed backward that may have been
    compiling (the first after a forward of an input key not seen before) returns False
    from :meth:`CompiledNetwork.backward`: the parameter gradients are put back as they
    were (copied before such a backward; a window's first micro-batch has none to copy)
    and the trainer runs that micro-batch again, eager (its BatchNorm statistics then see
    the batch twice). A later failure cannot be undone: that micro-batch's gradient may
    be partly applied, and the rest of the run is eager.

Costs
    Compiling ``yolo9-t`` (320 px, batch 8, forward + backward) took 188 s on a CPU, for a
    327 ms step against 336 ms eager: on a CPU it does not pay. On a GPU Inductor fuses
    elementwise kernels (fewer launches, less memory traffic): ``bench/compile_step.py``
    measures it beside CUDA graphs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["BACKEND", "CompiledNetwork", "build_compiled_network"]

log = logging.getLogger(__name__)

#: The ``torch.compile`` backend of a run. Tests set ``"eager"`` / ``"aot_eager"`` (tracing
#: without Inductor's minutes of code generation); nothing else changes it.
BACKEND: str | Callable[..., Any] = "inductor"

_FALLBACK = "compile: %s; continuing eager for the rest of the run"


class CompiledNetwork:
    """Runs the training network through ``torch.compile``; falls back to eager for good.

    Use (the trainer's forward/backward block)::

        with amp.autocast():
            outputs = net(images)                 # compiled (or eager after a failure)
            loss, items = loss_fn(outputs, targets, n)
        if not net.backward(scaler.scale(loss * n)):
            ...                                   # the compiled backward failed: redo eager

    Args:
        module: the module the trainer calls: the bare network, or its DDP wrapper (set
            :attr:`module` again after wrapping, before the first call).
        mode: the ``torch.compile`` mode (``"default"``, ``"reduce-overhead"``, ...).
        backend: the ``torch.compile`` backend (default :data:`BACKEND`, read at
            construction).

    Attributes:
        state: ``"pending"`` (nothing compiled yet), ``"compiled"`` (a compiled step ran
            forward and backward) or ``"failed"`` (eager for good).
        reason: what failed, once ``state == "failed"``.
        compile_s: wall seconds of the first compiled step (forward + backward, compiling
            included), or None until it ran.
        compiled_steps, eager_steps: forwards run compiled / eager in train mode.
    """

    def __init__(self, module: nn.Module, mode: str = "default",
                 backend: str | Callable[..., Any] | None = None):
        self.module = module
        self.mode = mode
        self.backend = BACKEND if backend is None else backend
        self.state = "pending"
        self.reason = ""
        self.compile_s: float | None = None
        self.compiled_steps = 0
        self.eager_steps = 0
        self._compiled: Callable[[Tensor], Any] | None = None
        self._keys: set[tuple] = set()
        self._t0: float | None = None  # start of the first compiled step
        self._last_compiled = False
        self._new_key = False

    @staticmethod
    def input_key(x: Tensor) -> tuple:
        """``(shape, dtype, device)`` of a batch: a new one may make Dynamo compile again."""
        return tuple(x.shape), x.dtype, x.device

    # -- forward --------------------------------------------------------------------------
    def __call__(self, x: Tensor) -> Any:
        """The network's outputs for ``x``: compiled in train mode, else eager."""
        self._last_compiled = False
        if self.state == "failed" or not self.module.training:
            return self._eager(x)
        if self._compiled is None:
            try:
                self._compiled = torch.compile(self.module, mode=self.mode, backend=self.backend)
            except Exception as exc:  # noqa: BLE001 - any error: eager from now on
                self._fail(f"torch.compile(mode={self.mode!r}) failed ({_what(exc)})")
                return self._eager(x)
        key = self.input_key(x)
        self._new_key = key not in self._keys
        if self._t0 is None:
            self._t0 = time.perf_counter()
        try:
            out = self._compiled(x)
        except Exception as exc:  # noqa: BLE001 - any error: eager from now on
            self._fail(f"compiling or running the forward at input shape {key[0]} failed "
                       f"({_what(exc)})")
            return self._eager(x)
        self._keys.add(key)
        self.compiled_steps += 1
        self._last_compiled = True
        return out

    def _eager(self, x: Tensor) -> Any:
        self.eager_steps += 1
        return self.module(x)

    # -- backward -------------------------------------------------------------------------
    def backward(self, loss: Tensor) -> bool:
        """``loss.backward()`` for the last forward; False when the caller must run the
        micro-batch again.

        False: a compiled backward failed after a forward of a new input key; the
        parameter gradients are as they were before this call (see the module docstring)
        and the run is eager from now on. A failure on a key that compiled before cannot
        be undone (no copy was taken): the run goes eager and True is returned.

        Raises:
            whatever ``loss.backward()`` raises after an eager forward.
        """
        if not self._last_compiled:
            loss.backward()
            return True
        self._last_compiled = False
        saved = self._snapshot_grads() if self._new_key else None
        try:
            loss.backward()
        except Exception as exc:  # noqa: BLE001 - any error: eager from now on
            if saved is None:  # a key that compiled before: no copy to put back
                self._fail(f"running the compiled backward failed ({_what(exc)}); this "
                           "micro-batch's gradient may be partly applied")
                return True
            for p, g in saved:
                p.grad = g
            self._fail(f"compiling or running the backward failed ({_what(exc)}); this "
                       "micro-batch runs again, eager")
            return False
        if self.state == "pending":
            self.state = "compiled"
            self.compile_s = time.perf_counter() - (self._t0 or time.perf_counter())
            log.info("compile: the training network is compiled (mode=%s, backend=%s); the "
                     "first step took %.1f s", self.mode, _name(self.backend), self.compile_s)
        return True

    def _snapshot_grads(self) -> list[tuple[nn.Parameter, Tensor | None]]:
        """Every trainable parameter and a copy of its ``.grad`` (None stays None)."""
        return [(p, None if p.grad is None else p.grad.detach().clone())
                for p in self.module.parameters() if p.requires_grad]

    # -- failures and changes -------------------------------------------------------------
    def _fail(self, reason: str) -> None:
        self._compiled, self._last_compiled = None, False
        self.state, self.reason = "failed", reason
        log.warning(_FALLBACK, reason)

    def invalidate(self, reason: str) -> None:
        """The network changed (a family switched a branch on): the next backward of each
        input key is snapshotted again, since Dynamo's guards recompile the forward."""
        self._keys.clear()
        if self.state != "failed":
            log.info("compile: the network changed (%s); the next step may compile again", reason)


def _what(exc: BaseException, depth: int = 0) -> str:
    """``Type: first line of the message`` (Dynamo's messages run to pages); a wrapped
    error (``BackendCompilerFailed``'s ``inner_exception``, a ``__cause__``) is named
    instead of the wrapper's first line: ``BackendCompilerFailed: RuntimeError: ...``."""
    inner = getattr(exc, "inner_exception", None) or exc.__cause__
    if isinstance(inner, BaseException) and inner is not exc and depth < 3:
        return f"{type(exc).__name__}: {_what(inner, depth + 1)}"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _name(backend: str | Callable[..., Any]) -> str:
    return backend if isinstance(backend, str) else getattr(backend, "__name__", repr(backend))


def build_compiled_network(model: nn.Module, requested: str | bool, device: torch.device,
                           announce: bool = True, **kwargs: Any) -> CompiledNetwork | None:
    """A :class:`CompiledNetwork` when ``compile`` is set, else None (nothing logged).

    Writes one line: on a CPU or MPS it is allowed, but the line says it pays only on a
    GPU and that the first step compiles for minutes; on CUDA that the first step
    compiles.

    Args:
        model: the network being trained, on ``device`` (not yet DDP-wrapped: the trainer
            sets :attr:`CompiledNetwork.module` to the wrapper).
        requested: the ``compile`` key of the config (False, True or a mode).
        device: the training device.
        announce: write the line (rank 0 of a DDP job; the others pass False).
        kwargs: passed to :class:`CompiledNetwork` (``backend``).
    """
    if not requested:
        return None
    mode = "default" if requested is True else str(requested)
    if not announce:
        pass
    elif device.type != "cuda":
        log.info("compile=%s on %s: allowed, but it pays only on a GPU (measured on a CPU: "
                 "yolo9-t 336 -> 327 ms a step after 188 s of compiling); the first step "
                 "compiles for minutes", mode, device.type)
    else:
        log.info("compile=%s: the first training step compiles the network (a minute or "
                 "more); eager if compiling fails", mode)
    return CompiledNetwork(model, mode=mode, **kwargs)
