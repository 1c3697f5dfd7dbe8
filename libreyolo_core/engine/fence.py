"""Attempt fencing: an engine of an earlier attempt of a job writes nothing once a newer
attempt has started, on any host.

The service's worker writes the attempt's token into the job's fence file
(``$LIBREYOLO_FENCE_FILE``, in the job folder of the shared artifact store) before it
starts the engine with ``$LIBREYOLO_ATTEMPT_TOKEN``. Before each event line and each
checkpoint it writes, the engine compares the two (:func:`check`): when the file names
another attempt, this engine belongs to an attempt that was given up (its worker was
stopped or cut off past its lease and the job re-queued), so it prints one line and ends
at once (``os._exit(EXIT_FENCED)``) without writing. Its event lines also carry the token
(``attempt_token``), so the ingester of the newer attempt refuses any line that was written
before the engine noticed (:mod:`worker.tail`). Unlike killing by pid, this works when the
two attempts run on different hosts, or in different PID namespaces of one host.

Outside the service (no ``$LIBREYOLO_ATTEMPT_TOKEN``) there is no fence.
"""

from __future__ import annotations

import contextlib
import os
import sys

__all__ = ["EXIT_FENCED", "FENCE_FILE_ENV", "TOKEN_ENV", "check", "current", "token"]

#: the engine's exit code when it found its attempt fenced off
EXIT_FENCED = 6
TOKEN_ENV = "LIBREYOLO_ATTEMPT_TOKEN"
FENCE_FILE_ENV = "LIBREYOLO_FENCE_FILE"


def token() -> str | None:
    """This engine's attempt token, or None outside the service."""
    return os.environ.get(TOKEN_ENV) or None


def current() -> str | None:
    """The token in the fence file now (None when unset or unreadable)."""
    path = os.environ.get(FENCE_FILE_ENV)
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def check(what: str, leftover: str | os.PathLike[str] | None = None) -> None:
    """End this process at once (exit :data:`EXIT_FENCED`) when a newer attempt holds the
    job; ``what`` names the write that was refused, ``leftover`` a temporary file of that
    write to remove first. A fence file that cannot be read does not stop the engine (a
    shared folder's hiccup is not a newer attempt)."""
    mine = token()
    if mine is None:
        return
    now = current()
    if now is None or now == mine:
        return
    try:
        if leftover is not None:
            with contextlib.suppress(OSError):
                os.unlink(leftover)
        sys.stderr.write(f"error: fenced: this engine runs attempt {mine}, but attempt {now} "
                         f"of the job has started; {what} not written, stopping now\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_FENCED)
