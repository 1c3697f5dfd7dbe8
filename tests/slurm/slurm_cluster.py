"""A PRIVATE two-node Slurm on this host: its own munged, slurmctld and two slurmd.

Debian's ``slurm-wlm`` (22.05) and ``munge``: one ``munged`` on a private socket with the
key the package made, a ``slurm.conf`` in a temporary folder (``proctrack/linuxproc``,
``task/none``, ``select/cons_tres``, ``SlurmUser=root``, no accounting), two nodes ``n1``
and ``n2`` on this host (``NodeAddr=127.0.0.1``, a port each, ``CPUs=1``) in one partition,
and free ports for everything, so it never meets another Slurm or another test's cluster.
Clients find it through ``SLURM_CONF`` (:meth:`SlurmCluster.env`).

Needs root (slurmd runs jobs as their user) and the binaries; :func:`unavailable` says why
not, for a clean ``pytest.skip``. Run as a script it starts the cluster, checks that an
``sbatch --nodes=2`` puts task 0 on n1 and task 1 on n2, and stops it (``.ci/run``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["NODES", "PARTITION", "SlurmCluster", "unavailable"]

NODES = ("n1", "n2")
PARTITION = "debug"
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "scancel")
MUNGE_KEY = Path("/etc/munge/munge.key")


def unavailable() -> str | None:
    """Why a private Slurm cannot run here (None when it can)."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return f"Slurm is not installed (no {', '.join(missing)}; apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "the private Slurm needs root (SlurmUser=root)"
    if not MUNGE_KEY.is_file():
        return f"no munge key at {MUNGE_KEY}"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SlurmCluster:
    """munged + slurmctld + ``slurmd -N n1`` + ``slurmd -N n2`` in a temporary folder.

    Args:
        kill_wait_s: ``KillWait``: seconds between the SIGTERM and the SIGKILL of a job's
            steps when it is cancelled or runs out of time.
        slurmd_timeout_s: ``SlurmdTimeout``: how long before a silent node is DOWN.
    """

    def __init__(self, *, kill_wait_s: int = 30, slurmd_timeout_s: int = 10) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="lyslurm-", dir="/tmp"))
        self.conf = self.folder / "slurm.conf"
        self.munge_socket = self.folder / "munge.sock"
        self.host = socket.gethostname()
        self.ctld_port = _free_port()
        self.node_ports = {n: _free_port() for n in NODES}
        self.kill_wait_s, self.slurmd_timeout_s = kill_wait_s, slurmd_timeout_s
        self.procs: dict[str, subprocess.Popen] = {}
        self.cluster_name = f"ly{os.getpid()}"

    # -- configuration -----------------------------------------------------------------
    def _write_conf(self) -> None:
        d = self.folder
        (d / "state").mkdir()
        (d / "spool").mkdir()
        lines = [
            f"ClusterName={self.cluster_name}",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge",
            # cred_expire: a requeued job waits this long before it may run again (120 s)
            f"AuthInfo=socket={self.munge_socket},cred_expire=10",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool/%n",
            f"SlurmctldPidFile={d}/slurmctld.pid",
            f"SlurmdPidFile={d}/slurmd.%n.pid",
            f"SlurmctldLogFile={d}/slurmctld.log",
            f"SlurmdLogFile={d}/slurmd.%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none", "JobCompType=jobcomp/none",
            "MpiDefault=none", "ReturnToService=2", "InactiveLimit=0",
            f"KillWait={self.kill_wait_s}", f"SlurmdTimeout={self.slurmd_timeout_s}",
            "SlurmctldTimeout=30", "MessageTimeout=10", "MinJobAge=600",
            "SchedulerParameters=sched_interval=2", "PlugStackConfig=/dev/null",
        ]
        for n in NODES:
            lines.append(f"NodeName={n} NodeHostname={self.host} NodeAddr=127.0.0.1 "
                         f"Port={self.node_ports[n]} CPUs=1 State=UNKNOWN")
        lines.append(f"PartitionName={PARTITION} Nodes={','.join(NODES)} Default=YES "
                     "MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def env(self) -> dict[str, str]:
        """This process's environment with ``SLURM_CONF`` pointing at the cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    # -- start / stop ------------------------------------------------------------------
    def _daemon(self, name: str, argv: list[str]) -> None:
        log = open(self.folder / f"{name}.out", "ab")  # noqa: SIM115 (the daemon keeps it)
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=self.env(),
                                            start_new_session=True)

    def start(self, timeout_s: float = 60.0) -> SlurmCluster:
        """Start the daemons and wait until both nodes are idle.

        Raises:
            RuntimeError: a daemon did not come up (its log's tail in the message).
        """
        self._write_conf()
        d = self.folder
        self._daemon("munged", ["munged", "-F", "--force", f"--socket={self.munge_socket}",
                                f"--key-file={MUNGE_KEY}", f"--pid-file={d}/munged.pid",
                                f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"])
        self._wait(lambda: self.munge_socket.exists(), timeout_s, "munged")
        self._daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self.scontrol("ping").returncode == 0
                   and "UP" in self.scontrol("ping").stdout, timeout_s, "slurmctld")
        for n in NODES:
            self._daemon(f"slurmd-{n}", ["slurmd", "-D", "-N", n, "-f", str(self.conf)])
        self._wait(self.idle, timeout_s, "slurmd n1 and n2 (idle)")
        return self

    def _wait(self, pred, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not pred():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                tail = "".join(self.log_tail(n) for n in (dead or list(self.procs)))
                self.stop()
                raise RuntimeError(f"the private Slurm did not start ({what}; "
                                   f"exited: {dead or 'none'}):\n{tail}")
            time.sleep(0.2)

    def log_tail(self, name: str, lines: int = 15) -> str:
        """The last ``lines`` of a daemon's log (``slurmctld``, ``slurmd-n1``, ...)."""
        out = []
        for path in (self.folder / f"{name}.out", self.folder / f"{name.replace('-', '.')}.log",
                     self.folder / f"{name}.log"):
            if path.is_file():
                out += path.read_text(errors="replace").splitlines()[-lines:]
        return f"--- {name}\n" + "\n".join(out) + "\n"

    def stop(self) -> None:
        """Stop the daemons (slurmd first; SIGKILL after 10 s) and kill what jobs left."""
        order = [n for n in self.procs if n.startswith("slurmd")] + \
            [n for n in ("slurmctld", "munged") if n in self.procs]
        for name in order:
            p = self.procs[name]
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
        self.procs.clear()

    def remove(self) -> None:
        """:meth:`stop`, then delete the folder."""
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def stop_node(self, node: str) -> None:
        """Stop one node's slurmd (SIGKILL: a node that went away)."""
        p = self.procs.get(f"slurmd-{node}")
        if p is not None and p.poll() is None:
            p.kill()
            p.wait(5)

    # -- queries -----------------------------------------------------------------------
    def run(self, *argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster (text output, never raises on rc)."""
        return subprocess.run(list(argv), env=self.env(), capture_output=True, text=True,
                              timeout=timeout)

    def scontrol(self, *args: str) -> subprocess.CompletedProcess:
        return self.run("scontrol", *args)

    def node_states(self) -> dict[str, str]:
        """``{node: state}`` from ``sinfo`` (``idle``, ``alloc``, ``down*``, ...)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t").stdout.split()
        return dict(zip(out[::2], out[1::2], strict=False))

    def idle(self) -> bool:
        """Whether every node is idle."""
        states = self.node_states()
        return all(states.get(n) == "idle" for n in NODES)

    def resume(self, node: str) -> None:
        """Bring a node back after ``state=down`` (``state=resume``)."""
        self.scontrol("update", f"nodename={node}", "state=resume")

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.remove()


def check() -> int:
    """Start a cluster, run ``sbatch --nodes=2`` whose ``srun`` prints ``SLURM_PROCID`` and
    ``SLURMD_NODENAME``, print what it printed, stop; 0 when task 0 ran on n1 and 1 on n2."""
    why = unavailable()
    if why:
        print(f"private Slurm: skipped: {why}")
        return 0
    with SlurmCluster() as cluster:
        out = cluster.folder / "check.out"
        job = cluster.run("sbatch", "--parsable", "--wait", "--nodes=2", "--ntasks-per-node=1",
                          f"--output={out}", "--wrap",
                          "srun bash -c 'echo task $SLURM_PROCID on $SLURMD_NODENAME'",
                          timeout=120)
        text = out.read_text() if out.is_file() else job.stderr
        print(text, end="")
        ok = job.returncode == 0 and "task 0 on n1" in text and "task 1 on n2" in text
        print("private Slurm: two nodes ok" if ok else "private Slurm: FAILED")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(check())
