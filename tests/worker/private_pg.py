"""A PRIVATE PostgreSQL server for outage tests (its own data folder and free port), so a
test can stop and restart it without touching the shared server on 5432.

``initdb`` refuses to run as root: as root the server runs as the ``postgres`` user
(``runuser``). Skipped cleanly when the binaries are missing.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from testkit import free_port, wait_for


def pg_bin() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl`` (the newest under /usr/lib/postgresql), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if found:
        return Path(found[-1]).parent
    which = shutil.which("pg_ctl")
    return Path(which).parent if which else None


def _as_pg(argv: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


class PrivatePostgres:
    """``initdb`` + ``pg_ctl`` in a temporary folder, trust auth on 127.0.0.1:<free port>."""

    def __init__(self) -> None:
        binary = pg_bin()
        assert binary is not None
        self.bin = binary
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="lypg-", dir="/tmp"))
        self.data = self.folder / "data"
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres", "postgres")
        subprocess.run(_as_pg([str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust",
                               "-U", "postgres", "--no-sync", "-E", "UTF8"]),
                       check=True, capture_output=True)

    def start(self) -> PrivatePostgres:
        opts = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(_as_pg([str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", opts,
                               "-l", str(self.folder / "pg.log"), "-w", "start"]),
                       check=True, capture_output=True)
        wait_for(self.ready, timeout=30, interval=0.1, what="the private PostgreSQL")
        return self

    def ready(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.url.replace("+psycopg", ""), connect_timeout=2):
                return True
        except psycopg.Error:
            return False

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``immediate``: as abrupt as a crash)."""
        subprocess.run(_as_pg([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode,
                               "-w", "stop"]), capture_output=True)

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.folder, ignore_errors=True)
