"""Attempt fencing: an engine of an earlier attempt of a job writes nothing once a newer
attempt has started, on any host.

The service's worker writes the attempt's token into the job's fence file
(``$LIBREYOLO_FENCE_FILE``, in the job folder of the shared artifact store) before it
starts the engine with ``$LIBREYOLO_ATTEMPT_TOKEN``. Before each event line, each
checkpoint and each other file of the run folder it writes (``results.csv``, ``args.yaml``,
the ``val/`` report, ``best.onnx``, the error file, the trackers' logging: TensorBoard's
event files, MLflow), the engine compares the two (:func:`check`): when the file names
another attempt, this engine belongs to an attempt that was given up (its worker was
stopped or cut off past its lease and the job re-queued), so it prints one line and ends
at once (``os._exit(EXIT_FENCED)``) without writing. Its event lines also carry the token
(``attempt_token``), so the ingester of the newer attempt refuses any line that was written
before the engine noticed (:mod:`worker.tail`). Unlike killing by pid, this works when the
two attempts run on different hosts, or in different PID namespaces of one host.

The job's ``train.log`` (the engine's stdout and stderr, appended to by every attempt) is
fenced the same way: :func:`guard_output` makes each write to ``sys.stdout`` and
``sys.stderr`` check the fence first, so a line a given-up engine prints after the newer
attempt raised the fence never reaches the log; the one line the log gets is the
``fenced:`` notice itself. (Bytes written past Python's streams, e.g. ``os.write(2, ...)``
from native code, are not covered.)

Outside the service (no ``$LIBREYOLO_ATTEMPT_TOKEN``) there is no fence.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

__all__ = ["EXIT_FENCED", "FENCE_FILE_ENV", "TOKEN_ENV", "check", "current", "guard_output",
           "token"]

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
        err = getattr(sys.stderr, "unfenced", sys.stderr)  # not through the guard
        err.write(f"error: fenced: this engine runs attempt {mine}, but attempt {now} "
                  f"of the job has started; {what} not written, stopping now\n")
        err.flush()
    finally:
        os._exit(EXIT_FENCED)


class _FencedStream:
    """A text stream whose writes first :func:`check` the fence (the rest is the wrapped
    stream's, ``unfenced``)."""

    def __init__(self, stream: Any, name: str):
        self.unfenced, self._name = stream, name

    def write(self, text: str) -> int:
        if text:
            check(f"{self._name} output")
        return self.unfenced.write(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.unfenced, attr)


def guard_output() -> None:
    """Inside the service (an attempt token is set): every later write to ``sys.stdout``
    and ``sys.stderr`` (prints, logging handlers made after this call, warnings) checks
    the fence first, so an engine of a given-up attempt adds nothing to the job's log past
    the ``fenced:`` notice. Outside the service, or called twice, it does nothing."""
    if token() is None:
        return
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _FencedStream):
            setattr(sys, name, _FencedStream(stream, name))
