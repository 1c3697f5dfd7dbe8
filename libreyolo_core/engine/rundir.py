"""Run directories: ``<project>/<name>``, then ``<name>2``, ``<name>3``... unless ``exist_ok``."""

from __future__ import annotations

from pathlib import Path

__all__ = ["make_run_dir", "latest_last_checkpoint"]


def make_run_dir(project: str | Path, name: str, exist_ok: bool = False) -> Path:
    """Create and return a fresh run directory (with ``weights/``)."""
    base = Path(project)
    path = base / name
    if path.exists() and not exist_ok:
        n = 2
        while (base / f"{name}{n}").exists():
            n += 1
        path = base / f"{name}{n}"
    (path / "weights").mkdir(parents=True, exist_ok=True)
    return path


def latest_last_checkpoint(project: str | Path = "runs/train") -> Path:
    """The most recently modified ``*/weights/last.pt`` under ``project`` (``resume=True``).

    Raises:
        CheckpointError: there is none (exit code 4 in the CLI).
    """
    from libreyolo_core.engine.checkpoint import CheckpointError

    found = sorted(Path(project).glob("*/weights/last.pt"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise CheckpointError(f"resume=True: no weights/last.pt under {project}/ "
                              "(name the checkpoint: resume=path/to/last.pt)")
    return found[-1]
