"""The credentials file ``up`` writes for the SDK: one token per service URL.

Format (JSON, mode 600)::

    {"url": "<default service>", "token": "<its token>",
     "services": {"<url>": "<token>", ...}}

``url``/``token`` are the default the SDK uses when it is given no URL: the first service
saved, which a later ``up`` on another address does not take over (it adds its own entry
under ``services``). ``libreyolo_client._config`` reads the same format.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["load_credentials", "saved_token", "save_credentials"]


def load_credentials(path: Path) -> dict[str, str]:
    """``{url: token}`` of every service in the file (empty if missing or unreadable);
    a file of the older single-entry form gives its one entry."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    services = {str(u).rstrip("/"): t for u, t in (data.get("services") or {}).items()
                if isinstance(t, str)}
    if isinstance(data.get("url"), str) and isinstance(data.get("token"), str):
        services.setdefault(data["url"].rstrip("/"), data["token"])
    return services


def saved_token(path: Path, url: str) -> str | None:
    """The token saved for ``url``, if any."""
    return load_credentials(path).get(url.rstrip("/"))


def save_credentials(path: Path, url: str, token: str) -> str | None:
    """Save ``token`` for ``url`` (mode 600), keeping the other services' entries.

    Returns:
        The default service's URL when it is another one (the caller says so), else None.
    """
    url = url.rstrip("/")
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        old = {}
    services = load_credentials(path)
    services[url] = token
    default = old.get("url", "").rstrip("/") if isinstance(old, dict) else ""
    if default not in services:
        default = url
    body = {"url": default, "token": services[default], "services": services}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(body, f, indent=1)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return default if default != url else None
