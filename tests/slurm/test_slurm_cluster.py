"""The private two-node Slurm itself: an ``sbatch --nodes=2`` runs one task on each node."""

from __future__ import annotations


def test_two_nodes_one_task_each(slurm, tmp_path):
    out = tmp_path / "out.txt"
    job = slurm.run("sbatch", "--parsable", "--wait", "--nodes=2", "--ntasks-per-node=1",
                    f"--output={out}", "--wrap",
                    "srun bash -c 'echo task $SLURM_PROCID on $SLURMD_NODENAME'", timeout=120)
    assert job.returncode == 0, job.stderr
    lines = sorted(out.read_text().splitlines())
    assert lines == ["task 0 on n1", "task 1 on n2"]
    assert slurm.idle()
