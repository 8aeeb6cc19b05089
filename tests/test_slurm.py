"""deploy/slurm/fthsdp-group.sbatch on a real Slurm (tests/slurm_cluster.py):
two replica groups as an array job train against a real coordinator; one
group's rank is SIGKILLed (its agent restarts it), then that group's agent
(its srun step fails, the script requeues the array task, Slurm runs it
again, the replica catches up from the other group), and the job finishes
with both groups at the last step while the other group never stopped."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from fthsdp.client import CoordinatorClient
from fthsdp.demo.record import json_objects
from tests.harness.events import JsonLog
from tests.harness.processes import ROOT, CoordinatorProcess
from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "deploy" / "slurm" / "fthsdp-group.sbatch"
STEPS = 900
SLOW = "0.05"
"""Seconds of sleep per step (tests/ftar_worker.py --slow): about 60 s of
training, long enough for the faulted group to come back twice, and little
CPU, so that the two groups and Slurm share 2 cores."""
MAX_STALL = 3.0
"""The longest the healthy group may go without committing a step. Both
failures are crashes, noticed at once (the rank's session closes; 0.2 s
measured); a dead peer noticed only by the heartbeat timeout (1 s here) would
still pass, one waited for until FTHSDP_FTAR_TIMEOUT (30 s) would not."""


@pytest.fixture
def slurm():
    reason = SlurmCluster.unavailable()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster(kill_wait=15).start()
    try:
        yield cluster
    finally:
        cluster.stop()


class GroupOutput:
    """The output file of one array task: the script's own lines, the agent's
    log and the rank's JSON lines (tests/ftar_worker.py), of every run."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def text(self) -> str:
        try:
            return self.path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def records(self) -> list[dict]:
        return [obj for line in self.text().splitlines() for obj in json_objects(line)]

    def admitted(self) -> list[dict]:
        return [r for r in self.records() if "admitted" in r]

    def steps(self) -> list[dict]:
        return [r for r in self.records() if "step" in r]

    def tail(self, n: int = 40) -> str:
        return f"--- {self.path.name}\n" + "\n".join(self.text().splitlines()[-n:])


def wait_for(predicate, timeout: float, what: str, outputs, cluster: SlurmCluster):
    """Poll ``predicate`` until it returns something truthy (returned); on the
    deadline fail with the groups' outputs and the daemons' logs."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:g}s\n" + "\n".join(o.tail() for o in outputs)
                                 + "\n" + cluster.logs())
        time.sleep(0.05)


def advertise(node: str) -> dict[str, str]:
    """Nothing: the script advertises each host by its node name, which is
    this machine's name; only where that name does not resolve, 127.0.0.1."""
    try:
        socket.gethostbyname(node)
    except OSError:
        return {"FTHSDP_ADVERTISE_HOST": "127.0.0.1"}
    return {}


def proc_stat(pid: int) -> tuple[str, int]:
    """(command line, parent pid) of a running process, from /proc."""
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    stat = Path(f"/proc/{pid}/stat").read_text()
    ppid = int(stat.rsplit(")", 1)[1].split()[1])
    return cmdline, ppid


@pytest.mark.timeout(240)
def test_two_groups_as_an_array_job_survive_a_rank_kill_and_an_agent_kill_with_a_requeue(slurm, tmp_path):
    coordinator = CoordinatorProcess(tmp_path, "--min-replicas", "1", "--heartbeat-interval", "200ms",
                                     "--heartbeat-timeout", "1s", "--join-timeout", "2s",
                                     "--log-format", "json").start()
    try:
        env = slurm.env(
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{slurm.env()['PATH']}",
            PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1",
            FTHSDP_COORDINATOR=coordinator.address, FTHSDP_RESTART_BACKOFF="100ms", FTHSDP_STOP_TIMEOUT="5s",
            FTHSDP_FTAR_TIMEOUT="30", FTHSDP_CHECKSUM_EVERY="1", MAX_REQUEUES="2", **advertise(slurm.node),
        )
        submitted = time.monotonic()
        out = slurm.command("sbatch", "--parsable", "--array=0-1", "--nodes=1", f"--chdir={ROOT}",
                            f"--output={tmp_path}/group-%A_%a.out", str(SCRIPT),
                            "python", "-m", "tests.ftar_worker", "--steps", str(STEPS), "--wait-for", "2",
                            "--hidden", "64", "--slow", SLOW, env=env)
        array = out.strip().split(";")[0]
        healthy, faulted = (GroupOutput(tmp_path / f"group-{array}_{i}.out") for i in range(2))
        outputs = (healthy, faulted)

        # 1. Both groups train; SIGKILL group 1's rank: its agent restarts it.
        first = wait_for(lambda: faulted.admitted(), 90, "admission of replica-1", outputs, slurm)[0]
        cmdline, agent_pid = proc_stat(first["pid"])
        assert "tests.ftar_worker" in cmdline
        agent_cmdline, _ = proc_stat(agent_pid)
        assert " agent " in agent_cmdline and "replica-1" in agent_cmdline, agent_cmdline
        wait_for(lambda: any(s["step"] >= 20 for s in faulted.steps()), 60, "step 20 of replica-1", outputs, slurm)
        os.kill(first["pid"], signal.SIGKILL)
        rank_killed = time.monotonic()

        second = wait_for(lambda: faulted.admitted()[1:], 60, "replica-1 restarted by its agent",
                          outputs, slurm)[0]
        assert second["pid"] != first["pid"] and second["catch_up"] is not None, second
        assert proc_stat(second["pid"])[1] == agent_pid, "the same agent restarted the rank"
        assert [j["Restarts"] for j in slurm.jobs(array)] == ["0", "0"], "no requeue for a rank"
        wait_for(lambda: [s for s in faulted.steps() if s["t"] > second["t"]], 60, "a step of the restarted rank",
                 outputs, slurm)

        # 2. SIGKILL group 1's agent: its srun step fails, the script requeues the task.
        assert proc_stat(second["pid"])[1] == agent_pid
        os.kill(agent_pid, signal.SIGKILL)
        agent_killed = time.monotonic()
        third = wait_for(lambda: faulted.admitted()[2:], 90, "replica-1 back after the requeue",
                         outputs, slurm)[0]
        assert third["catch_up"] is not None, third

        # 3. The job finishes: both array tasks COMPLETED, group 1 requeued once.
        def ended() -> list[dict]:
            jobs = slurm.jobs(array)
            return jobs if len(jobs) == 2 and all(j["JobState"] in ("COMPLETED", "FAILED", "CANCELLED")
                                                  for j in jobs) else []

        jobs = {j["ArrayTaskId"]: j for j in wait_for(ended, 120, "the end of both array tasks", outputs, slurm)}
        finished = time.monotonic()
        print(f"slurm: submitted -> replica-1 admitted {first['t'] - submitted:.1f}s; rank SIGKILL -> admitted "
              f"again {second['t'] - rank_killed:.1f}s; agent SIGKILL -> admitted after the requeue "
              f"{third['t'] - agent_killed:.1f}s; submitted -> both tasks ended {finished - submitted:.1f}s")
        summary = {i: (j["JobState"], j["ExitCode"], j["Restarts"]) for i, j in jobs.items()}
        assert summary == {"0": ("COMPLETED", "0:0", "0"), "1": ("COMPLETED", "0:0", "1")}, (
            summary, healthy.tail(), faulted.tail())
        assert "start 2 (SLURM_RESTART_COUNT=1)" in faulted.text()
        assert "requeueing" in faulted.text() and "requeueing" not in healthy.text()

        # 4. The healthy group never stopped for long and ran in one process.
        steps = healthy.steps()
        assert [s["step"] for s in steps] == list(range(1, STEPS + 1)), "one run, every step once"
        assert len(healthy.admitted()) == 1
        stall = max(b["t"] - a["t"] for a, b in zip(steps, steps[1:], strict=False))
        print(f"slurm: the healthy group's longest time between two commits: {stall:.2f}s")
        assert stall < MAX_STALL

        # 5. Both groups committed the last step together, with one state.
        last = {name: o.steps()[-1] for name, o in (("replica-0", healthy), ("replica-1", faulted))}
        assert {s["step"] for s in last.values()} == {STEPS}
        assert last["replica-0"]["checksum"] == last["replica-1"]["checksum"]
        assert last["replica-0"]["contributors"] == last["replica-1"]["contributors"] == 2
        with CoordinatorClient([coordinator.address]) as client:
            status = client.status()
        # The coordinator: the job finished at the last step, and both groups
        # left it finished (ft.close() after their last step), replica-1 in
        # its incarnation since the requeue.
        assert status.finished.step == STEPS, status
        log = JsonLog(coordinator.log_path)
        assert all(log.find_event("replica_left", replica=r, reason="finished") for r in ("replica-0", "replica-1")), \
            coordinator.log_tail()
    finally:
        coordinator.stop()
