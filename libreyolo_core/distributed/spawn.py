"""The spawn launcher: one DDP worker process per device from a plain Python call
(docs/architecture.md, "Multi-device").

``LibreYOLO.train(device="0,1")`` without a torchrun environment ends up in
:func:`spawn_train`: the caller's weights go to a temporary file, every worker
(``torch.multiprocessing.spawn``) gets the torchrun variables, rebuilds the model from that
file and the config from its dump, with the same keys counted as given as in the caller's
(``model_fields_set``: a resumed rank keeps the checkpoint's value of every key not given,
see :meth:`~libreyolo_core.engine.resume.Resume.config`), and runs the ordinary trainer
(which then takes the torchrun path); rank 0 writes its result next to the weights for the
parent to read. Tests call :func:`spawn_train` with ``device="cpu"`` to run real
2-process Gloo DDP.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import signal
import socket
import sys
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import torch

from libreyolo_core.config import TrainConfig, with_given
from libreyolo_core.distributed.batch import per_rank_batch
from libreyolo_core.engine.signals import install_sigterm

__all__ = ["MainGuardError", "spawn_train", "check_picklable", "free_port"]


class MainGuardError(RuntimeError):
    """``train(device=...)`` ran again while a spawned worker imported the user's script."""


GUARD_MESSAGE = (
    "multi-device training was started again inside a spawned DDP worker: the worker imports "
    "your script, and its top-level train(...) call ran a second time. Put the call under the "
    "main guard:\n\n    if __name__ == \"__main__\":\n        model.train(..., device=\"0,1\")\n"
)


def in_spawned_bootstrap() -> bool:
    """True while a ``spawn``-started child imports the parent's main module (the moment an
    unguarded top-level ``train(...)`` would recurse)."""
    main = sys.modules.get("__main__")
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False)) or (
        getattr(main, "__name__", "") == "__mp_main__"
    )


def check_picklable(callbacks: dict[str, list[Callable]] | None) -> None:
    """Every callback must travel to the workers by pickle.

    Raises:
        RuntimeError: names the first callback that cannot be pickled (a lambda, a closure,
            a bound method of an unpicklable object) and says what to use instead.
    """
    for event, fns in (callbacks or {}).items():
        for i, fn in enumerate(fns):
            try:
                pickle.dumps(fn)
            except Exception as exc:  # noqa: BLE001 - pickle raises several types
                name = getattr(fn, "__qualname__", repr(fn))
                raise RuntimeError(
                    f"callbacks[{event!r}][{i}] ({name}) cannot be sent to the DDP worker processes: "
                    f"{type(exc).__name__}: {exc}. Spawned workers receive callbacks by pickle, so use "
                    "a function or class defined at module level (not a lambda, closure or local "
                    "class), or read the built-in event log (<run_dir>/events.jsonl, the service's "
                    "job events) instead of a callback."
                ) from None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for ``MASTER_PORT``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def _visible_devices(cuda_ids: list[int] | None):
    """Set ``CUDA_VISIBLE_DEVICES`` to ``cuda_ids`` (through any existing mask) for the
    children; restore it afterwards."""
    if not cuda_ids:
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    if before:
        mask = [d.strip() for d in before.split(",") if d.strip()]
        ids = [mask[i] for i in cuda_ids]
    else:
        ids = [str(i) for i in cuda_ids]
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


def _worker(rank: int, world_size: int, port: int, cfg: dict[str, Any], given: list[str],
            weights: str | None, callbacks: dict[str, list[Callable]] | None, result_path: str) -> None:
    """One spawned rank: torchrun variables, the config from its dump ``cfg`` with the
    caller's ``given`` keys (its ``model_fields_set``) as the only ones set, the model from
    ``weights``, the trainer."""
    from libreyolo_core.distributed.context import destroy_distributed, exit_rank
    from libreyolo_core.engine.trainer import Trainer, TrainingInterrupted
    from libreyolo_core.models.registry import parse_model_name
    from libreyolo_core.weights.load import build_from_state

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if "OMP_NUM_THREADS" not in os.environ:  # as torchrun does: ranks must not oversubscribe cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    # only the caller's keys count as given (the dump holds every field)
    config = with_given(TrainConfig(**cfg), given)
    model = None
    if weights is not None:
        family, size = parse_model_name(config.model)
        state = torch.load(weights, map_location="cpu", weights_only=True)
        model = build_from_state(family, size, int(state["nc"]), state["model"])
    try:
        result = Trainer(config, model=model, callbacks=callbacks).train().to_dict()
    except TrainingInterrupted as exc:  # every rank stops at the same step; rank 0 saved last.pt
        result = {"interrupted": str(exc)}
    finally:
        destroy_distributed()
    if rank == 0:
        Path(result_path).write_text(json.dumps(result, default=str), encoding="utf-8")
    exit_rank(0)  # not the interpreter's teardown (see exit_rank); an error above takes
    # torch's path: its traceback to the parent, exit 1


def spawn_train(
    cfg: TrainConfig,
    world_size: int,
    model: torch.nn.Module | None = None,
    nc: int | None = None,
    callbacks: dict[str, list[Callable]] | None = None,
    cuda_ids: list[int] | None = None,
) -> dict[str, Any]:
    """Train ``cfg`` with ``world_size`` spawned DDP processes; returns rank 0's result.

    Args:
        cfg: the resolved config; ``batch`` is the global batch (resolve ``-1`` before:
            :func:`~libreyolo_core.distributed.autobatch.probe_batch`). ``device="cpu"``
            runs Gloo on the CPU. Every rank sees its ``model_fields_set`` as the keys
            given (with ``resume``, the checkpoint's config fills the others).
        world_size: number of processes (one per device).
        model: starting weights (ignored when ``cfg.resume`` names a checkpoint);
            ``None`` = fresh weights built under ``cfg.seed`` on rank 0.
        nc: class count of ``model``.
        callbacks: as for the trainer; run on rank 0 in its process, so they must pickle.
        cuda_ids: CUDA indices to expose to the workers as ``cuda:0..n-1``.

    Returns:
        Rank 0's :meth:`Trainer.train` result as its flat dict
        (:meth:`~libreyolo_core.records.train.TrainResult.to_dict`, through JSON: the class
        ids of ``names`` are strings).

    Raises:
        MainGuardError: called while a spawned child imports an unguarded script.
        ValueError: a global ``batch`` not divisible by ``world_size``.
        RuntimeError: an unpicklable callback; ``world_size < 1``.
        torch.multiprocessing.ProcessRaisedException: a rank raised; carries that rank's
            traceback (the other ranks are terminated at once).
        TrainingInterrupted: this process got SIGTERM: it was passed on to the ranks,
            which stopped at the same step after rank 0 saved ``last.pt``.
    """
    if in_spawned_bootstrap():
        raise MainGuardError(GUARD_MESSAGE)
    if world_size < 1:
        raise RuntimeError(f"world_size={world_size} must be >= 1")
    if cfg.batch != -1:
        per_rank_batch(cfg.batch, world_size)  # before any process starts
    check_picklable(callbacks)
    with tempfile.TemporaryDirectory(prefix="libreyolo-ddp-") as tmp:
        weights = None
        if model is not None and not cfg.resume:
            weights = str(Path(tmp) / "weights.pt")
            state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
            # every family's model carries an int ``nc`` (nn.Module types it Tensor | Module)
            model_nc = nc if nc is not None else cast(int, model.nc)
            torch.save({"nc": int(model_nc), "model": state}, weights)
        result_path = str(Path(tmp) / "result.json")
        port = free_port()
        with _visible_devices(cuda_ids):
            context = torch.multiprocessing.start_processes(
                _worker, args=(world_size, port, cfg.model_dump(mode="json"), sorted(cfg.model_fields_set),
                               weights, callbacks, result_path),
                nprocs=world_size, join=False, start_method="spawn",
            )
        _join(context)
        result = json.loads(Path(result_path).read_text(encoding="utf-8"))
    if "interrupted" in result:
        from libreyolo_core.engine.trainer import TrainingInterrupted

        raise TrainingInterrupted(result["interrupted"])
    return result


def _join(context: torch.multiprocessing.ProcessContext) -> None:
    """Wait for the ranks. SIGTERM to this process is passed on to every rank (they stop at
    one step and rank 0 saves ``last.pt``); a rank that dies ends the others.

    Raises:
        torch.multiprocessing.ProcessRaisedException: a rank raised (its traceback inside).
        RuntimeError: a rank exited without a Python error (a signal, or a failure while it
            imported the caller's script).
    """

    def forward() -> None:
        for process in context.processes:
            if process.is_alive():
                os.kill(process.pid, signal.SIGTERM)

    restore = install_sigterm(forward, chain=False)  # the parent stops with its ranks
    try:
        while not context.join(timeout=1.0, grace_period=10.0):
            pass
    except torch.multiprocessing.ProcessExitedException as exc:
        if exc.signal_name:
            raise RuntimeError(f"DDP rank {exc.error_index} (pid {exc.error_pid}) was killed by "
                               f"{exc.signal_name}; the other ranks were stopped") from None
        raise RuntimeError(
            f"DDP rank {exc.error_index} exited with code {exc.exit_code} before it could report an "
            "error (its output is above). At start-up the usual cause is a script without the main "
            "guard: put the training call under `if __name__ == \"__main__\":`."
        ) from None
    finally:
        restore()
