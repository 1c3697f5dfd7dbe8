"""The job status machine: the statuses and every named transition between them.

Every status change of a job is one of the :data:`TRANSITIONS` below, made by
:func:`service.ops.transition` (which refuses any other edge) through the job store
(:mod:`service.job_store`). ``docs/architecture.md`` draws the same table as a mermaid
state diagram; ``tests/service/test_lifecycle.py`` checks that the two agree.

A job is created ``queued`` (a submit inserts the row; that is not a transition).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["JobStatus", "ACTIVE", "TERMINAL", "Transition", "TransitionError", "CLAIM",
           "CANCEL_QUEUED", "REQUEST_CANCEL", "HAND_BACK", "FINISH", "REQUEUE_EXPIRED",
           "FAIL_EXPIRED", "CANCEL_EXPIRED", "NODE_LOST", "REQUEUE_INFRA", "TRANSITIONS", "EDGES"]


class JobStatus(StrEnum):
    """A job's ``status`` column (stored as the lower-case value)."""

    QUEUED = "queued"
    RUNNING = "running"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: statuses holding a worker's lease (they count towards the owner's cap).
ACTIVE = (JobStatus.RUNNING, JobStatus.CANCELLING)
#: statuses no transition leaves.
TERMINAL = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


class TransitionError(ValueError):
    """A status change that is not in the transition's table entry."""


@dataclass(frozen=True)
class Transition:
    """A named transition: from any of ``sources`` to one of ``targets``, made by ``actor``.

    Args:
        name: the label of its edges in the diagram of ``docs/architecture.md``.
        sources: statuses the job may be in (the ``WHERE status IN (...)`` of the update).
        targets: statuses it may move to; the caller picks one when there are several.
        actor: who makes it (the API, the scheduler's claim, the worker, the reaper).
    """

    name: str
    sources: tuple[JobStatus, ...]
    targets: tuple[JobStatus, ...]
    actor: str

    def target(self, to: JobStatus | str | None = None) -> JobStatus:
        """The status this transition moves to: ``to``, or its only target when None.

        Raises:
            TransitionError: ``to`` is not one of :attr:`targets`, or None while there
                are several.
        """
        if to is None:
            if len(self.targets) != 1:
                raise TransitionError(f"{self.name}: say which of "
                                      f"{', '.join(self.targets)} to move to")
            return self.targets[0]
        if to not in self.targets:
            raise TransitionError(f"{self.name} moves {'|'.join(self.sources)} to "
                                  f"{'|'.join(self.targets)}, not to {str(to)!r}")
        return JobStatus(to)

    def edges(self) -> set[tuple[JobStatus, JobStatus]]:
        """Every ``(from, to)`` pair this transition allows."""
        return {(s, t) for s in self.sources for t in self.targets}


CLAIM = Transition("claim", (JobStatus.QUEUED,), (JobStatus.RUNNING,),
                   "worker, through the scheduler's atomic claim")
CANCEL_QUEUED = Transition("cancel_queued", (JobStatus.QUEUED,), (JobStatus.CANCELLED,),
                           "API cancel")
REQUEST_CANCEL = Transition("request_cancel", (JobStatus.RUNNING,), (JobStatus.CANCELLING,),
                            "API cancel")
HAND_BACK = Transition("hand_back", (JobStatus.RUNNING,), (JobStatus.QUEUED,),
                       "worker shutting down")
#: the worker's end of an attempt; a cancel requested while the engine was already
#: exiting still ends ``succeeded`` or ``failed`` by the engine's exit.
FINISH = Transition("finish", ACTIVE, TERMINAL, "worker")
REQUEUE_EXPIRED = Transition("requeue_expired", (JobStatus.RUNNING,), (JobStatus.QUEUED,),
                             "reaper, attempts left")
FAIL_EXPIRED = Transition("fail_expired", (JobStatus.RUNNING,), (JobStatus.FAILED,),
                          "reaper, no attempt left")
CANCEL_EXPIRED = Transition("cancel_expired", (JobStatus.CANCELLING,), (JobStatus.CANCELLED,),
                            "reaper")
#: a multi-node job whose other node's engine died or whose node lease expired: re-queued
#: as one whole attempt (``queued``, attempts left) or ``failed`` (none left).
NODE_LOST = Transition("node_lost", (JobStatus.RUNNING,), (JobStatus.QUEUED, JobStatus.FAILED),
                       "node 0's worker, when another node is lost")

#: an attempt whose engine ended for a reason of the infrastructure (a hang, the host's
#: OOM killer, a full disk): re-queued on the infrastructure budget (``queued``), or
#: ``failed`` once it is spent.
REQUEUE_INFRA = Transition("requeue_infra", (JobStatus.RUNNING,),
                           (JobStatus.QUEUED, JobStatus.FAILED),
                           "worker, an infrastructure end of its engine")

#: every transition by name.
TRANSITIONS: dict[str, Transition] = {t.name: t for t in (
    CLAIM, CANCEL_QUEUED, REQUEST_CANCEL, HAND_BACK, FINISH, REQUEUE_EXPIRED, FAIL_EXPIRED,
    CANCEL_EXPIRED, NODE_LOST, REQUEUE_INFRA)}
#: ``(from, to, transition name)`` of every allowed edge.
EDGES: frozenset[tuple[JobStatus, JobStatus, str]] = frozenset(
    (s, t, m.name) for m in TRANSITIONS.values() for s, t in m.edges())
