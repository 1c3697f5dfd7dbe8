"""How an attempt ends: its class and the budgets (torch-free; the API, the pages, the
worker and the reaper share it).

Every end of an attempt is one of three classes, stored on the job (``end_class``,
``end_reason``, migration 0007e) and in its ``status`` event (``end_class``, ``why``):

- ``infrastructure``: the worker or a node lost (lease expired), a database or broker
  outage past the lease, the host's OOM killer (SIGKILL the worker did not send), a full
  disk, a hang (the engine's watchdog), a worker shutdown. Not the job's fault: the job is
  re-queued to resume from ``last.pt``, on its own budget (``max_infra_retries``), and no
  attempt of ``max_attempts`` is used.
- ``job``: a config, data, model or code error, a non-finite loss, the job's time budget.
  Running it again would fail again: the job fails at once with the error.
- ``user``: a cancel.
"""

from __future__ import annotations

__all__ = ["END_CLASSES", "INFRASTRUCTURE", "JOB", "USER", "describe", "retry_note"]

INFRASTRUCTURE, JOB, USER = "infrastructure", "job", "user"
END_CLASSES = (INFRASTRUCTURE, JOB, USER)


def describe(end_class: str | None, why: str | None) -> str | None:
    """``"infrastructure: hang ..."``: the class and why, as the page, the SDK and
    ``jobs show`` print it; None when the attempt has not ended by one of the classes."""
    if not end_class:
        return None
    return f"{end_class}: {why}" if why else end_class


def retry_note(attempt: int, retries_after: int, max_retries: int) -> str:
    """What a re-queue after an infrastructure end says about the budget."""
    return f"re-queued for attempt {attempt + 1} (infrastructure retry {retries_after} of " \
           f"{max_retries})"
