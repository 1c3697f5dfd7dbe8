"""Local-folder artifact store.

Layout: ``<root>/<job id>/`` holds ``job.json`` and ``train.log``; the engine's run
directory is ``<root>/<job id>/run/`` and artifact paths are relative to it
(``weights/best.pt``, ``timeline.html``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path, PurePosixPath

__all__ = ["ArtifactStore", "artifact_kind", "sha256_file"]

_KINDS = {
    ".pt": "checkpoint", ".csv": "results", ".yaml": "config", ".json": "results",
    ".html": "timeline", ".log": "log", ".png": "plot", ".jpg": "plot", ".jsonl": "events",
}


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """sha256 hex of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def artifact_kind(relpath: str) -> str:
    """Kind of an artifact from its name when the engine did not say."""
    name = PurePosixPath(relpath).name
    if name == "timeline.html":
        return "timeline"
    if name.startswith("profile") and name.endswith((".json", ".json.gz")):
        return "trace" if "trace" in name else "profile"
    return _KINDS.get(PurePosixPath(relpath).suffix.lower(), "other")


class ArtifactStore:
    """Job folders under ``root``; resolves artifact paths without escaping a run dir."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()

    def job_dir(self, job_id: str) -> Path:
        """``<root>/<job id>`` (job.json, train.log, run/)."""
        return self.root / job_id

    def run_dir(self, job_id: str) -> Path:
        """The engine's run directory ``<root>/<job id>/run``."""
        return self.job_dir(job_id) / "run"

    def last_checkpoint(self, job_id: str) -> Path | None:
        """The run's ``weights/last.pt`` when an earlier attempt left one (the next attempt
        resumes from it), else None. A file check: nothing is loaded."""
        path = self.run_dir(job_id) / "weights" / "last.pt"
        return path if path.is_file() else None

    def resume_note(self, job_id: str) -> str:
        """How a re-queued job's next attempt starts, for its status event:
        ``"resuming from last.pt"`` or ``"starting again (no last.pt yet)"``."""
        if self.last_checkpoint(job_id) is not None:
            return "resuming from last.pt"
        return "starting again (no last.pt yet)"

    def input_dir(self, job_id: str) -> Path:
        """``<job dir>/input``: the image a "Try it" predict job reads (``POST /v1/predict``;
        outside the run dir, so it is no artifact)."""
        return self.job_dir(job_id) / "input"

    def is_input(self, job_id: str, path: str | Path) -> bool:
        """True when ``path`` (symlinks resolved) lies in the job's :meth:`input_dir`."""
        return Path(path).resolve().is_relative_to(self.input_dir(job_id).resolve())

    def log_path(self, job_id: str) -> Path:
        """The engine's stdout+stderr, ``<job dir>/train.log``."""
        return self.job_dir(job_id) / "train.log"

    def resolve(self, job_id: str, relpath: str) -> Path | None:
        """The file ``relpath`` inside the job's run dir, or None.

        None when the path is absolute, has ``..`` or a NUL byte, leads (also through a
        symlink) outside the run directory, or is not a regular file.
        """
        rel = PurePosixPath(relpath)
        if not relpath or rel.is_absolute() or ".." in rel.parts or "\\" in relpath or \
                "\0" in relpath or len(relpath) > 4096:
            return None
        base = self.run_dir(job_id).resolve()
        try:
            path = (base / rel).resolve(strict=True)
        except (OSError, RuntimeError, ValueError):
            return None
        if not path.is_relative_to(base) or not path.is_file():
            return None
        return path

    def list_files(self, job_id: str) -> list[tuple[str, Path]]:
        """Every regular file under the run dir as ``(relative posix path, path)``, sorted.

        Symlinks are skipped (never followed out of the run dir).
        """
        base = self.run_dir(job_id)
        if not base.is_dir():
            return []
        out = []
        for path in sorted(base.rglob("*")):
            if path.is_symlink() or not path.is_file():
                continue
            out.append((path.relative_to(base).as_posix(), path))
        return out
