"""Fixtures of the Slurm tests: one private two-node Slurm for the session
(:mod:`slurm_cluster`), skipped cleanly when Slurm is not installed or cannot start."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "service"))

from slurm_cluster import SlurmCluster, unavailable  # noqa: E402


@pytest.fixture(scope="session")
def slurm():
    """A started :class:`slurm_cluster.SlurmCluster` (n1, n2), removed at the end."""
    why = unavailable()
    if why:
        pytest.skip(why)
    cluster = SlurmCluster()
    try:
        cluster.start()
    except RuntimeError as exc:
        pytest.skip(f"the private Slurm did not start: {exc}")
    yield cluster
    cluster.remove()
