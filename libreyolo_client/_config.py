"""Where the SDK finds the service URL and token.

Order: the arguments, then ``LIBREYOLO_URL`` / ``LIBREYOLO_TOKEN``, then the credentials
file that ``libreyolo-service up`` writes (``LIBREYOLO_CREDENTIALS_PATH``, default
``~/.config/libreyolo/credentials``, JSON ``{"url": ..., "token": ...}``, mode 600).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["DEFAULT_CREDENTIALS_PATH", "DEFAULT_URL", "credentials_path", "resolve"]

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_CREDENTIALS_PATH = "~/.config/libreyolo/credentials"


def credentials_path() -> Path:
    """The credentials file: ``LIBREYOLO_CREDENTIALS_PATH`` or the default."""
    return Path(os.environ.get("LIBREYOLO_CREDENTIALS_PATH") or DEFAULT_CREDENTIALS_PATH
                ).expanduser()


def _read_file(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}


def resolve(url: str | None = None, token: str | None = None,
            path: str | os.PathLike[str] | None = None) -> tuple[str, str | None]:
    """The service URL and token to use.

    The credentials file's token is only taken for the file's own URL, so a token saved for
    a local service is never sent to another host.

    Returns:
        (url without a trailing slash, token or None).
    """
    file = _read_file(Path(path).expanduser() if path else credentials_path())
    url = url or os.environ.get("LIBREYOLO_URL") or file.get("url") or DEFAULT_URL
    url = url.rstrip("/")
    if token is None:
        token = os.environ.get("LIBREYOLO_TOKEN") or None
    if token is None and file.get("token") and file.get("url", "").rstrip("/") == url:
        token = file["token"]
    return url, token
