"""How many loader workers and intra-op threads a rank gets on this machine.

``workers=-1`` (the default) sizes the loader from the CPUs this process may run on (its
affinity mask, which container CPU sets and ``taskset`` narrow, not ``os.cpu_count()``),
shared among the ranks on this machine: each rank keeps one CPU for its own training
process and gives the rest to loader workers, at most :data:`AUTO_MAX_WORKERS`
(Ultralytics' ``min(cpus // ranks, 8)`` rule, less the training process's own CPU).

Threads: every loader worker runs torch and OpenCV with one thread (torch's DataLoader
sets torch's; OpenCV's is set to 1 in the parent just before the workers fork, see
:func:`single_threaded_cv2`, because changing it in a forked child whose parent had used
its thread pool can deadlock). The training process caps its own torch and OpenCV
intra-op threads at the CPUs left after its workers (at least 1, never more than it had):
on a busy 2-core machine, a default of 2+ intra-op threads beside 2 loader workers made
steps 5-25x slower.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["AUTO_MAX_WORKERS", "WorkerPlan", "apply_threads", "local_ranks", "plan_workers",
           "resolved_workers", "single_threaded_cv2", "usable_cpus"]

#: Upper bound of the automatic worker count per rank.
AUTO_MAX_WORKERS = 8


def usable_cpus() -> int:
    """CPUs this process may run on (``sched_getaffinity``; ``os.cpu_count()`` where the
    platform has no affinity call)."""
    with contextlib.suppress(AttributeError, OSError):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


@dataclass(frozen=True)
class WorkerPlan:
    """The loader and thread sizing of one rank.

    Attributes:
        workers: loader worker processes for this rank.
        threads: torch/OpenCV intra-op threads of the training process.
        cpus: CPUs usable by this process; ``ranks``: training processes on this machine.
        requested: the ``workers`` value asked for (-1 = automatic).
    """

    workers: int
    threads: int
    cpus: int
    ranks: int
    requested: int

    def describe(self) -> str:
        """The one log line of this choice."""
        per_rank = max(1, self.cpus // self.ranks)
        if self.requested < 0:
            how = (f"auto: {self.cpus} usable CPU(s) / {self.ranks} rank(s) on this machine = "
                   f"{per_rank} per rank, 1 kept for training, at most {AUTO_MAX_WORKERS}")
        elif self.workers < self.requested:
            how = f"asked {self.requested}, capped at the {self.cpus} usable CPU(s)"
        else:
            how = "as asked"
        return (f"loader: {self.workers} worker(s) per rank ({how}); intra-op threads: "
                f"{self.threads} in the training process, 1 in each worker")


def plan_workers(requested: int, ranks: int = 1, cpus: int | None = None,
                 current_threads: int | None = None) -> WorkerPlan:
    """Size one rank's loader and threads (see the module docstring for the rule).

    Args:
        requested: ``cfg.workers``; ``-1`` automatic, else the count (capped at ``cpus``).
        ranks: training processes on this machine (``LOCAL_WORLD_SIZE``).
        cpus: usable CPUs (default :func:`usable_cpus`).
        current_threads: the process's torch intra-op threads now (default
            ``torch.get_num_threads()``); the plan never raises it.

    Raises:
        ValueError: ``requested < -1`` or ``ranks < 1``.
    """
    if requested < -1:
        raise ValueError(f"workers={requested} must be >= 0, or -1 for automatic")
    if ranks < 1:
        raise ValueError(f"ranks={ranks} must be >= 1")
    cpus = usable_cpus() if cpus is None else max(1, int(cpus))
    if current_threads is None:
        import torch

        current_threads = torch.get_num_threads()
    per_rank = max(1, cpus // ranks)
    workers = min(AUTO_MAX_WORKERS, per_rank - 1) if requested < 0 else min(requested, cpus)
    threads = max(1, min(int(current_threads), per_rank - workers))
    return WorkerPlan(workers=workers, threads=threads, cpus=cpus, ranks=ranks, requested=requested)


def local_ranks(world_size: int = 1) -> int:
    """Training processes on this machine: torchrun's ``LOCAL_WORLD_SIZE``, else
    ``world_size`` (one machine)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
    except ValueError:
        return max(1, world_size)


def resolved_workers(workers: int, ranks: int | None = None) -> int:
    """``workers`` as a count: ``-1`` (automatic) becomes :func:`plan_workers`' choice."""
    if workers >= 0:
        return workers
    return plan_workers(workers, local_ranks() if ranks is None else ranks, current_threads=1).workers


def apply_threads(plan: WorkerPlan) -> None:
    """Cap this process's torch and OpenCV intra-op threads at ``plan.threads``."""
    import cv2
    import torch

    if torch.get_num_threads() > plan.threads:
        torch.set_num_threads(plan.threads)
    if cv2.getNumThreads() > plan.threads:
        cv2.setNumThreads(plan.threads)


@contextlib.contextmanager
def single_threaded_cv2() -> Iterator[None]:
    """OpenCV at one thread inside the block (put back after): loader workers forked
    inside it inherit a single-threaded OpenCV, with no thread pool to deadlock on."""
    import cv2

    before = cv2.getNumThreads()
    if before != 1:
        cv2.setNumThreads(1)
    try:
        yield
    finally:
        if before != 1:
            cv2.setNumThreads(before)
