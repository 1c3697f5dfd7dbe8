"""Where the SDK finds the service URL and token.

Order: the arguments, then ``LIBREYOLO_URL`` / ``LIBREYOLO_TOKEN``, then the credentials
file that ``libreyolo-service up`` writes (``LIBREYOLO_CREDENTIALS_PATH``, default
``~/.config/libreyolo/credentials``, mode 600): JSON ``{"url": <default service>,
"token": <its token>, "services": {<url>: <token>, ...}}``, one token per service URL.
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


def _read_file(path: Path) -> tuple[str | None, dict[str, str]]:
    """``(default URL, {url: token})`` of the credentials file (``(None, {})`` if none)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, {}
    if not isinstance(data, dict):
        return None, {}
    services = {str(u).rstrip("/"): t for u, t in (data.get("services") or {}).items()
                if isinstance(t, str)}
    default = data.get("url") if isinstance(data.get("url"), str) else None
    if default and isinstance(data.get("token"), str):
        services.setdefault(default.rstrip("/"), data["token"])
    return default, services


def resolve(url: str | None = None, token: str | None = None,
            path: str | os.PathLike[str] | None = None) -> tuple[str, str | None]:
    """The service URL and token to use.

    A token of the credentials file is only taken for the URL it was saved for, so a
    token saved for a local service is never sent to another host.

    Returns:
        (url without a trailing slash, token or None).
    """
    default, services = _read_file(Path(path).expanduser() if path else credentials_path())
    url = url or os.environ.get("LIBREYOLO_URL") or default or DEFAULT_URL
    url = url.rstrip("/")
    if token is None:
        token = os.environ.get("LIBREYOLO_TOKEN") or None
    if token is None:
        token = services.get(url)
    return url, token
