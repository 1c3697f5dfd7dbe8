"""Schemathesis hooks of tests/service/test_openapi_conformance.py (loaded by name).

``POST /v1/datasets`` takes a raw ``application/zip`` body (``type: string, format:
binary``), which a client sends as bytes; schemathesis ships that serializer for
``application/octet-stream`` only, so it is registered here for the zip media type.
"""

from __future__ import annotations

from typing import Any

import schemathesis
from schemathesis.transport.serialization import serialize_binary


@schemathesis.serializer("application/zip")
def zip_body(ctx: Any, value: Any) -> bytes:
    """The generated body as the raw bytes of the request."""
    return serialize_binary(value)
