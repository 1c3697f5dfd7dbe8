"""The streamed upload of a request body to a file, with a size cap and its sha256: one
writer for the dataset zips, the model weights and the "Try it" images."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import anyio
from fastapi import Request

from service.api.problems import Problem

__all__ = ["Received", "receive_upload", "HEAD_BYTES"]

#: how many of the first bytes :func:`receive_upload` keeps (enough to tell an image type)
HEAD_BYTES = 16


@dataclass(frozen=True)
class Received:
    """What :func:`receive_upload` wrote: ``size`` in bytes, the ``sha256`` hex of the
    bytes, and their first :data:`HEAD_BYTES` bytes (``head``; fewer for a shorter body)."""

    size: int
    sha256: str
    head: bytes


async def receive_upload(request: Request, dest: Path, *, max_bytes: int, too_big: str,
                         field: str | None = None) -> Received:
    """Stream ``request``'s body into the file ``dest`` (created or truncated), counting
    its bytes and hashing them as they come.

    ``dest`` is deleted when anything fails on the way (the cap, a client that went away);
    on success it is the caller's. An empty body is no error here (the caller says what
    an empty upload means).

    Args:
        max_bytes: the size cap; the body's first byte past it stops the upload.
        too_big: the 413's detail.
        field: the 413's ``field`` (None: no field).

    Raises:
        Problem 413: the body is larger than ``max_bytes``.
    """
    size, digest, head = 0, hashlib.sha256(), b""
    try:
        async with await anyio.open_file(dest, "wb") as f:
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise Problem(413, too_big, field=field)
                if len(head) < HEAD_BYTES:
                    head = (head + chunk)[:HEAD_BYTES]
                await f.write(chunk)
                digest.update(chunk)
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return Received(size=size, sha256=digest.hexdigest(), head=head)
