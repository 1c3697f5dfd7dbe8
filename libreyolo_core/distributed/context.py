"""The process group of a DDP run: the torchrun environment, backend choice, global batch
split and the few collectives the trainer needs (docs/architecture.md, Multi-device).

A run is distributed when the torchrun variables ``RANK``, ``LOCAL_RANK`` and
``WORLD_SIZE`` are set and ``WORLD_SIZE > 1``; the spawn launcher
(:mod:`libreyolo_core.distributed.spawn`) sets them inside each worker, so both launch
paths meet here.

Process-group timeout: :data:`TIMEOUT_ENV` (``LIBREYOLO_DIST_TIMEOUT_S``, seconds; default
10800 = 3 h, long enough for rank 0 to validate a big set while the others wait). The
trainer names the phase it is in (:func:`set_phase`: the rendezvous, the dataset scan and
label cache, the model build, autobatch, the DDP start-up sync, the first batch, a training
epoch, the end-of-epoch wait while rank 0 validates and saves); each rank also publishes its
phase in the process group's store, so a collective that times out raises
:class:`CollectiveTimeoutError` naming this rank's phase, rank 0's (where it could be read)
and the setting.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import multiprocessing
import os
import re
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from libreyolo_core.distributed.device import DeviceError, parse_devices, rank_device, select_device
from libreyolo_core.distributed.parent import die_with_parent

__all__ = [
    "PG_TIMEOUT",
    "TIMEOUT_ENV",
    "CollectiveTimeoutError",
    "pg_timeout",
    "set_phase",
    "current_phase",
    "rank0_phase",
    "timeout_error",
    "DistContext",
    "torchrun_env",
    "init_distributed",
    "destroy_distributed",
    "exit_rank",
    "broadcast_object",
    "all_reduce_sum",
    "mean_normalizer",
]

log = logging.getLogger(__name__)

#: Default process-group timeout (docs/architecture.md, Multi-device): long enough for rank 0's validation of a
#: big set. Override with :data:`TIMEOUT_ENV`.
PG_TIMEOUT = datetime.timedelta(hours=3)
#: Environment variable holding the process-group timeout in seconds.
TIMEOUT_ENV = "LIBREYOLO_DIST_TIMEOUT_S"

_phase = "start-up"
_PHASE_KEY = "libreyolo/phase/{rank}"
#: seconds a phase publish or read (:func:`set_phase`, :func:`rank0_phase`) may wait for the store
PHASE_STORE_TIMEOUT_S = 5.0
_phase_client: Any = None
_phase_client_for: tuple[str, str] | None = None
_TIMEOUT_RE = re.compile(r"timed? ?out|timeout", re.IGNORECASE)


class CollectiveTimeoutError(RuntimeError):
    """A collective waited longer than the process-group timeout; names the phase and the
    setting (:data:`TIMEOUT_ENV`)."""


def pg_timeout() -> datetime.timedelta:
    """The process-group timeout: ``$LIBREYOLO_DIST_TIMEOUT_S`` seconds, else 3 h.

    Raises:
        ValueError: the variable is not a positive number (names it and the value).
    """
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return PG_TIMEOUT
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"{TIMEOUT_ENV}={raw!r}: must be a positive number of seconds (default "
                         f"{int(PG_TIMEOUT.total_seconds())})")
    return datetime.timedelta(seconds=seconds)


def set_phase(name: str) -> None:
    """Say what this process is doing now (named by a collective that times out).

    Inside a process group the phase is also written to the group's store (key
    ``libreyolo/phase/<rank>``), where a rank whose collective timed out reads rank 0's
    (:func:`timeout_error`); a store that cannot be written (a peer gone) is ignored.
    """
    global _phase
    _phase = name
    store = _store()
    if store is not None:
        # the phase is a diagnostic: never fail a run for it
        with contextlib.suppress(Exception):
            store.set(_PHASE_KEY.format(rank=dist.get_rank()), name)


def _store() -> Any:
    """A client of the job's rendezvous store (``MASTER_ADDR:MASTER_PORT``: torchrun's agent
    or rank 0) with a short timeout (:data:`PHASE_STORE_TIMEOUT_S`), made once per address;
    None outside a process group or when it cannot be reached. Not the process group's own
    client: its timeout is the collective timeout, and a publish to a vanished host must not
    add one more such wait before the collective that times out."""
    global _phase_client, _phase_client_for
    if not (dist.is_available() and dist.is_initialized()):
        return None
    where = (os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", ""))
    if not all(where):
        return None
    if _phase_client_for != where:
        _phase_client_for, _phase_client = where, None
        try:
            _phase_client = dist.TCPStore(where[0], int(where[1]), is_master=False,
                                          timeout=datetime.timedelta(seconds=PHASE_STORE_TIMEOUT_S),
                                          wait_for_workers=False)
        except Exception:  # noqa: BLE001 - the phase is a diagnostic: no store, no publishing
            _phase_client = None
    return _phase_client


def rank0_phase() -> str | None:
    """Rank 0's last published phase (:func:`set_phase`), read from the process group's
    store without waiting; None outside a process group, on rank 0, or when it cannot be
    read (rank 0 gone, nothing published yet)."""
    store = _store()
    if store is None or dist.get_rank() == 0:
        return None
    key = _PHASE_KEY.format(rank=0)
    try:
        if not store.check([key]):
            return None
        value = store.get(key)
    except Exception:  # noqa: BLE001 - a diagnostic read: the store may have died with rank 0
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def current_phase() -> str:
    """The last phase :func:`set_phase` named (``"start-up"`` before any)."""
    return _phase


def timeout_error(exc: BaseException) -> CollectiveTimeoutError | None:
    """A :class:`CollectiveTimeoutError` for ``exc`` when it is a collective timeout (Gloo's
    "Timed out waiting ...", NCCL's blocking-wait timeout), else None."""
    if isinstance(exc, CollectiveTimeoutError) or not isinstance(exc, RuntimeError):
        return None
    if not _TIMEOUT_RE.search(str(exc)):
        return None
    seconds = int(pg_timeout().total_seconds())
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    who = f"rank {dist.get_rank()}" if dist.is_available() and dist.is_initialized() else "this rank"
    main = rank0_phase()
    other = f"; rank 0's phase: {main}" if main is not None and main != _phase else ""
    return CollectiveTimeoutError(
        f"a collective timed out after {seconds} s during {_phase} ({who}){other}: another rank did "
        f"not reach it in time (it failed, hung, or this phase is slower than the timeout). The "
        f"timeout is {TIMEOUT_ENV} (seconds, default {int(PG_TIMEOUT.total_seconds())}). ({first})")


@dataclass(frozen=True)
class DistContext:
    """Where this process stands in the job.

    Attributes:
        rank: global rank (0 owns every side effect: run dir, checkpoints, events, logs).
        local_rank: rank on this machine (selects ``cuda:local_rank``).
        world_size: number of processes; 1 means not distributed.
        backend: ``"nccl"`` or ``"gloo"``; ``""`` when not distributed.
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    backend: str = ""

    @property
    def enabled(self) -> bool:
        """True when several processes train together (a process group exists)."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def torchrun_env() -> tuple[int, int, int] | None:
    """``(rank, local_rank, world_size)`` from the torchrun variables, or None when absent.

    Raises:
        ValueError: a variable that is not an integer, or a rank outside the world.
    """
    if "LOCAL_RANK" not in os.environ:
        return None
    try:
        local_rank = int(os.environ["LOCAL_RANK"])
        rank = int(os.environ.get("RANK", local_rank))
        world_size = int(os.environ.get("WORLD_SIZE", 1))
    except ValueError as exc:
        raise ValueError(f"torchrun environment is malformed: {exc}") from None
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"torchrun environment: RANK={rank} is not in [0, WORLD_SIZE={world_size})")
    return rank, local_rank, world_size


def init_distributed(device: str | int | list[int] | None) -> tuple[DistContext, torch.device]:
    """Join the torchrun job this process belongs to and pick its device.

    Backend: NCCL when the job trains on CUDA and NCCL is built, else Gloo (so CPU-only
    machines, CI included, run real 2-rank DDP). Device: on CUDA the rank's GPU
    (:func:`~libreyolo_core.distributed.device.rank_device`: ``cuda:LOCAL_RANK``, or the
    ``LOCAL_RANK``-th of ``device`` when it names one GPU per process), else the CPU (``device="cpu"`` forces the CPU even where CUDA exists). Timeout: :func:`pg_timeout`
    (``$LIBREYOLO_DIST_TIMEOUT_S``, default 3 h). Rank 0 logs the rendezvous address.

    Without the torchrun environment (or with ``WORLD_SIZE=1``) nothing is initialised and
    the context says ``world_size=1``.

    Raises:
        DeviceError: a malformed ``device``, a CUDA index (or ``LOCAL_RANK``) this machine
            does not have, ``"mps"`` under DDP, or several devices named without a launcher
            (see :func:`~libreyolo_core.distributed.device.select_device`).
        ValueError: a malformed ``$LIBREYOLO_DIST_TIMEOUT_S``.
    """
    env = torchrun_env()
    if env is None or env[2] == 1:
        return DistContext(), select_device(device)
    rank, local_rank, world_size = env
    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun's agent: end with it
        die_with_parent(signal.SIGKILL)
    text = "auto" if device is None else str(device).strip().lower()
    if text == "mps":
        raise DeviceError("device='mps' cannot train under DDP (no collective backend for MPS); "
                          "use device=cpu or CUDA devices")
    # a malformed value or a missing CUDA index fails here, on every rank
    names = parse_devices(device) if text != "cpu" else ["cpu"]
    use_cuda = torch.cuda.is_available() and text != "cpu"
    if use_cuda:
        if local_rank >= torch.cuda.device_count():
            raise DeviceError(f"LOCAL_RANK={local_rank} but this machine has "
                              f"{torch.cuda.device_count()} CUDA device(s)")
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        torch_device = torch.device(rank_device(names, local_rank, local_world))
        torch.cuda.set_device(torch_device)
    else:
        torch_device = torch.device("cpu")
    backend = "nccl" if use_cuda and dist.is_nccl_available() else "gloo"
    timeout = pg_timeout()
    if not dist.is_initialized():
        kwargs: dict[str, Any] = {"device_id": torch_device} if backend == "nccl" else {}
        set_phase("joining the process group (rendezvous)")
        dist.init_process_group(backend, timeout=timeout, rank=rank, world_size=world_size, **kwargs)
        set_phase("set-up after the rendezvous")  # published: the others can now read it
    ctx = DistContext(rank=rank, local_rank=local_rank, world_size=world_size, backend=backend)
    if rank != 0:  # rank 0 speaks for the job; the others report errors only
        logging.getLogger("libreyolo_core").setLevel(logging.ERROR)
    log.info("DDP rank %d/%d (local %d) on %s, backend %s", rank, world_size, local_rank, torch_device,
             backend)
    if rank == 0:
        log.info("DDP rendezvous %s:%s (MASTER_ADDR:MASTER_PORT), %d ranks, collective timeout %d s (%s)",
                 os.environ.get("MASTER_ADDR", "?"), os.environ.get("MASTER_PORT", "?"), world_size,
                 int(timeout.total_seconds()), TIMEOUT_ENV)
    return ctx, torch_device


def destroy_distributed() -> None:
    """Leave the process group if one is initialised (safe to call twice)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def exit_rank(code: int) -> NoReturn:
    """End a DDP rank process that finished its run with ``code``, without the
    interpreter's teardown (a failed rank exits the usual way: see ``libreyolo_core.cli``).

    After a finished run, the process group's C++ threads can still be alive when the
    interpreter destroys its statics, and the rank dies of ``std::terminate`` ("terminate
    called without an active exception", SIGABRT) although it trained to the end: seen on
    a spawned rank 1 after both epochs (1 in about 1,000 runs of the suite), which failed a
    finished run. The process group is left, child processes (persistent loader workers)
    get SIGTERM as ``multiprocessing``'s exit handler would give them, logging and the
    standard streams are flushed, then ``os._exit``.
    """
    try:
        destroy_distributed()
    finally:
        children = multiprocessing.active_children()
        for child in children:
            child.terminate()
        for child in children:
            child.join(timeout=5)
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


def broadcast_object(obj: Any, ctx: DistContext) -> Any:
    """Rank 0's ``obj`` on every rank (picklable objects; a no-op when not distributed)."""
    if not ctx.enabled:
        return obj
    box = [obj]
    try:
        dist.broadcast_object_list(box, src=0)
    except RuntimeError as exc:
        raise (timeout_error(exc) or exc) from exc
    return box[0]


def all_reduce_sum(tensor: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """In-place sum of ``tensor`` over ranks; returns it (unchanged when not distributed)."""
    if ctx.enabled:
        try:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        except RuntimeError as exc:
            raise (timeout_error(exc) or exc) from exc
    return tensor


def mean_normalizer(ctx: DistContext) -> Callable[[torch.Tensor], torch.Tensor]:
    """The loss-normaliser hook for DDP: ``x -> sum over ranks of x / world_size``.

    A loss that divides by its positive count (YOLOv9's target-score sum, YOLOX's
    ``num_fg``) then divides by the *global* count spread evenly over ranks, so that the
    DDP average of the ranks' gradients equals the gradient of one process that saw the
    whole global batch (docs/architecture.md, Multi-device; no extra world-size factor). The input is a
    detached scalar; the result carries no gradient.
    """

    def reduce(x: torch.Tensor) -> torch.Tensor:
        total = x.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total / ctx.world_size

    return reduce
