"""The Slurm launcher's pure parts (no Slurm needed): sbatch's command line from the
settings and the job's shape, the scripts it writes, and a real ``scontrol show job -o``
line read back (captured from the private 2-node Slurm of tests/slurm)."""

from __future__ import annotations

from pathlib import Path

from service.settings import Settings
from worker.launcher import LaunchRequest, LocalLauncher, make_launcher
from worker.slurm import SlurmLauncher, parse_job, sbatch_args, write_scripts

LINE = ("JobId=2 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901758 "
        "Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) "
        "Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:03 "
        "TimeLimit=UNLIMITED NodeList=n[1-2] BatchHost=n1 NumNodes=2 NumCPUs=2 "
        "WorkDir=/work/x StdOut=/work/x/slurm-2.out Power=")


def request(tmp_path: Path, **over) -> LaunchRequest:
    base = dict(job_id="j0123456789abcdef", attempt=1, job_dir=tmp_path, spec_path=tmp_path / "job.json",
                log_path=tmp_path / "train.log", argv=["python"], env={}, nodes=2, gpus=0,
                procs=1, priority=3, resume_spec=tmp_path / "job.resume.json",
                last_pt=tmp_path / "run" / "weights" / "last.pt")
    return LaunchRequest(**(base | over))


def test_parse_job_reads_state_reason_nodes_restarts():
    f = parse_job(LINE)
    assert (f["JobState"], f["Reason"], f["NodeList"], f["Restarts"], f["ExitCode"]) == \
        ("RUNNING", "None", "n[1-2]", "0", "0:0")
    assert f["Power"] == ""


def test_sbatch_args_cpu_and_gpu_jobs(tmp_path):
    s = Settings(home=tmp_path, launcher="slurm", slurm_partition="gpu", slurm_account="lab",
                 slurm_qos="normal", slurm_time_limit="04:00:00", slurm_signal_s=90,
                 slurm_extra_args=["--exclusive"])
    cpu = sbatch_args(s, request(tmp_path, procs=2), tmp_path / "b.sh")
    assert "--nodes=2" in cpu and "--ntasks-per-node=1" in cpu and "--cpus-per-task=2" in cpu
    assert not any(a.startswith("--gpus") for a in cpu)
    assert {"--requeue", "--signal=B:USR1@90", "--partition=gpu", "--account=lab",
            "--qos=normal", "--time=04:00:00"} <= set(cpu)
    assert cpu[-2:] == ["--exclusive", str(tmp_path / "b.sh")]
    gpu = sbatch_args(s, request(tmp_path, gpus=4), tmp_path / "b.sh")
    assert "--gpus-per-node=4" in gpu and not any(a.startswith("--cpus") for a in gpu)
    assert not any(a.startswith("--nice") for a in gpu)  # our fair share: no nice
    theirs = Settings(home=tmp_path, launcher="slurm", slurm_fair_share="slurm")
    assert "--nice=600" in sbatch_args(theirs, request(tmp_path), tmp_path / "b.sh")


def test_scripts_run_torchrun_per_node_and_resume_on_restart(tmp_path):
    s = Settings(home=tmp_path, launcher="slurm", slurm_port_base=31000)
    batch = write_scripts(s, request(tmp_path)).read_text()
    node = (tmp_path / "slurm" / "node.sh").read_text()
    assert "srun --ntasks-per-node=1" in batch and "trap forward USR1" in batch
    assert "31000 + SLURM_JOB_ID % 1000" in batch
    assert 'SLURM_RESTART_COUNT:-0}" -gt 0' in batch and "job.resume.json" in batch
    assert '--nnodes="$SLURM_NNODES" --node-rank="$SLURM_NODEID"' in node
    assert "--rdzv-backend=static" in node and "--nproc-per-node=1" in node
    assert f"0) LOG={tmp_path / 'train.log'}" in node  # node 0's log is the job's log


def test_make_launcher_by_setting(tmp_path):
    assert isinstance(make_launcher(Settings(home=tmp_path)), LocalLauncher)
    slurm = make_launcher(Settings(home=tmp_path, launcher="slurm"))
    assert isinstance(slurm, SlurmLauncher) and slurm.whole
