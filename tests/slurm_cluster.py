"""A real one-host Slurm for the tests: munged, slurmctld and slurmd started
as root on this machine, all of their files in a temporary folder.

Nothing system-wide is used or changed: munged runs as the munge user with a
key of its own and its own socket (``--socket``; Slurm reaches it through
``AuthInfo=socket=...``), and every Slurm daemon and command reads the
slurm.conf written here (``-f`` for the daemons, ``SLURM_CONF`` for the
commands and, exported by sbatch, for the jobs' own srun and scontrol). The
cgroup plugins are off (``proctrack/linuxproc``, ``task/none``), so it runs in
a container without systemd. Waiting is on conditions with deadlines.

``SlurmCluster.unavailable()`` says, in one line, why Slurm cannot start here
(not root, a program missing); the tests skip with that line.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from fthsdp.testing.local_etcd import free_port

DAEMONS = ("munged", "munge", "unmunge", "slurmctld", "slurmd")
COMMANDS = ("sbatch", "scontrol", "squeue", "sinfo", "scancel", "srun")
INSTALL = "apt-get install slurmctld slurmd slurm-client munge"


class SlurmCluster:
    """munged + slurmctld + slurmd on this host, one partition of this one node."""

    def __init__(self, kill_wait: int = 30, cred_expire: int = 10, partition: str = "fthsdp") -> None:
        self.kill_wait = kill_wait
        self.cred_expire = cred_expire
        self.partition = partition
        self.node = socket.gethostname().split(".")[0]
        # Not under pytest's tmp_path: those folders are 0700 root, which the
        # munge user cannot enter. mkdtemp's own folder is made 0755 below.
        self.base = Path(tempfile.mkdtemp(prefix="fthsdp-slurm-"))
        self.munge_dir = self.base / "munge"
        self.socket = self.munge_dir / "munge.socket"
        self.conf = self.base / "slurm.conf"
        self._procs: dict[str, subprocess.Popen] = {}
        self._logs: list = []

    # ----- whether it can run ---------------------------------------------------------

    @staticmethod
    def unavailable() -> str:
        """Why a Slurm cannot be started here ("" if it can)."""
        if os.geteuid() != 0:
            return "Slurm test needs root (munged as the munge user, slurmd as root)"
        missing = [name for name in DAEMONS + COMMANDS if shutil.which(name, path=_sbin_path()) is None]
        if missing:
            return f"Slurm or munge is not installed ({', '.join(missing)} missing): {INSTALL}"
        try:
            pwd.getpwnam("munge")
        except KeyError:
            return "no munge user (the munge package creates it)"
        return ""

    # ----- start and stop -------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> SlurmCluster:
        try:
            self._start_munge(timeout)
            self._write_conf()
            self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
            self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf)])
            self.wait_until(self._node_idle, timeout, f"node {self.node} idle in sinfo")
        except BaseException:
            self.stop()
            raise
        return self

    def _start_munge(self, timeout: float) -> None:
        munge = pwd.getpwnam("munge")
        self.base.chmod(0o755)
        self.munge_dir.mkdir(mode=0o755)
        key = self.munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for path in (self.munge_dir, key):
            os.chown(path, munge.pw_uid, munge.pw_gid)
        self._spawn("munged", [
            "munged", "--foreground", f"--socket={self.socket}", f"--key-file={key}",
            f"--log-file={self.munge_dir / 'munged.log'}", f"--pid-file={self.munge_dir / 'munged.pid'}",
            f"--seed-file={self.munge_dir / 'munged.seed'}",
        ], user=munge.pw_uid, group=munge.pw_gid)

        def round_trip() -> bool:
            cred = subprocess.run(["munge", "-n", f"--socket={self.socket}"], capture_output=True, timeout=5)
            back = subprocess.run(["unmunge", f"--socket={self.socket}"], input=cred.stdout, capture_output=True,
                                  timeout=5)
            return cred.returncode == 0 and back.returncode == 0

        self.wait_until(round_trip, timeout, "munged answering on its socket")

    def _write_conf(self) -> None:
        cpus, memory = self._node_resources()
        for folder in ("state", "spool"):
            (self.base / folder).mkdir()
        ctld_port, slurmd_port = free_port(), free_port()
        self.conf.write_text(f"""\
# Written by tests/slurm_cluster.py: a one-host Slurm for the tests.
ClusterName=fthsdptest
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.socket},cred_expire={self.cred_expire}
StateSaveLocation={self.base / 'state'}
SlurmdSpoolDir={self.base / 'spool'}
SlurmctldPidFile={self.base / 'slurmctld.pid'}
SlurmdPidFile={self.base / 'slurmd.pid'}
SlurmctldLogFile={self.base / 'slurmctld.log'}
SlurmdLogFile={self.base / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
MpiDefault=none
JobRequeue=1
ReturnToService=2
KillWait={self.kill_wait}
MinJobAge=600
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory} State=UNKNOWN
PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
""")

    @staticmethod
    def _node_resources() -> tuple[int, int]:
        """CPUs and RealMemory as ``slurmd -C`` reports them: a node configured
        with more is drained as invalid."""
        out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30, check=True,
                             env=_env()).stdout
        cpus = int(re.search(r"\bCPUs=(\d+)", out).group(1))
        memory = int(re.search(r"\bRealMemory=(\d+)", out).group(1))
        return cpus, max(1, memory - 512)

    def _spawn(self, name: str, argv: list[str], **kwargs) -> None:
        log = open(self.base / f"{name}.out", "ab")  # closed in stop()
        self._logs.append(log)
        self._procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env(),
                                             cwd=self.base, start_new_session=True, **kwargs)

    def stop(self) -> None:
        """Cancel every job, stop the daemons, end whatever is left of this
        cluster's processes (found by the SLURM_CONF in their environment:
        slurmstepd and the jobs' processes, which outlive slurmd), and delete
        the folder."""
        if "slurmctld" in self._procs and self._procs["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--partition", self.partition], env=self.env(), capture_output=True,
                           timeout=30)
            try:
                self.wait_until(lambda: not self.command("squeue", "--noheader", "-o", "%i", check=False).strip(),
                                self.kill_wait + 10, "every job ended")
            except AssertionError:
                pass  # ended below, by signal
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self._procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for pid in self.leftover_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for log in self._logs:
            log.close()
        self._procs.clear()
        shutil.rmtree(self.base, ignore_errors=True)

    def leftover_pids(self) -> list[int]:
        """Processes whose environment names this cluster's slurm.conf (this
        cluster's daemons, slurmstepd and every process of its jobs)."""
        marker = f"SLURM_CONF={self.conf}".encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:
                continue
        return pids

    # ----- using it ---------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        return {**_env(), "SLURM_CONF": str(self.conf), **extra}

    def command(self, *argv: str, check: bool = True, env: dict[str, str] | None = None, timeout: float = 30) -> str:
        """Run a Slurm command with this cluster's slurm.conf; its stdout."""
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env or self.env())
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def jobs(self, job_id: int | str) -> list[dict[str, str]]:
        """``scontrol show job -o JOB``: one dict per job (each task of an
        array), its fields as Slurm prints them (JobState, Restarts, ...)."""
        out = self.command("scontrol", "show", "job", "-o", str(job_id), check=False)
        return [dict(re.findall(r"(\w[\w:/]*)=(\S*)", line)) for line in out.splitlines() if "JobId=" in line]

    def _node_idle(self) -> bool:
        out = self.command("sinfo", "--noheader", "-N", "-o", "%N %T", check=False)
        return f"{self.node} idle" in out

    def wait_until(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise AssertionError(f"{name} exited {proc.returncode} while waiting for {what}:\n{self.logs()}")
            try:
                if predicate():
                    return
            except (OSError, subprocess.SubprocessError):
                pass  # a daemon still starting: not yet
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout:g}s:\n{self.logs()}")
            time.sleep(0.1)

    def logs(self, lines: int = 15) -> str:
        """The tails of the daemons' logs, for a failure message."""
        parts = []
        for path in sorted(self.base.glob("*.log")) + sorted(self.base.glob("*.out")) + [
                self.munge_dir / "munged.log"]:
            try:
                tail = path.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            parts.append(f"--- {path.name}\n" + "\n".join(tail))
        return "\n".join(parts)


def _sbin_path() -> str:
    return os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/local/sbin"])


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "FTHSDP_"))}
    env["PATH"] = _sbin_path()
    return env
