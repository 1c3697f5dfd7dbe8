"""Run directories: ``<project>/<name>``, then ``<name>2``, ``<name>3``... unless ``exist_ok``."""

from __future__ import annotations

from pathlib import Path

__all__ = ["make_run_dir"]


def make_run_dir(project: str | Path, name: str, exist_ok: bool = False, weights: bool = True) -> Path:
    """Create and return a fresh run directory (with ``weights/`` unless ``weights=False``:
    ``runs/val/exp``, ``runs/predict/exp``)."""
    base = Path(project)
    path = base / name
    if path.exists() and not exist_ok:
        n = 2
        while (base / f"{name}{n}").exists():
            n += 1
        path = base / f"{name}{n}"
    (path / "weights" if weights else path).mkdir(parents=True, exist_ok=True)
    return path

