"""Two replica groups of two hosts of two ranks, every rank behind its
agent's relay (fthsdp/agent/node/relay/): a rank killed, a rank hung and a
host dropped, one after the other in the same job, and for each the time
from the fault until every rank of the other group committed a step in the
quorum without the failed group (told, and acting on it). After each, the
failed group comes back and both train together again.

Real coordinator, agents (--nnodes 2, the hosts meet through the
coordinator) and FSDP2 ranks (tests/hsdp_worker.py, every rank printing
its steps). The bounds are generous, a check that the news arrives at all
by the path it must take: a kill is reported by the dead rank's agent at
once; a hang (the rank's process stopped) when its pings to its own agent
stop (--rank-silence 2s), long before the coordinator's heartbeat timeout
(30 s here, as the pace stretches it at thousands of hosts); a host dropped
when its Host stream closes. The measured times are printed, not asserted tight: figures belong
in benchmarks/ (benchmarks/README.md). Each group sends its pings as one
stream, through its host 0 (fthsdp/agent/node/relay/tree.py), with its
hosts' heartbeats in it: the coordinator's metrics show 2 ping streams
and 4 hosts whose heartbeats ride in batches, at the start and once the
dropped host is back.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.harness.ending import end_started
from tests.harness.events import JsonLog
from tests.harness.processes import AgentProcess, CoordinatorProcess
from tests.harness.waiting import wait_until
from tests.test_metrics import scrape

pytestmark = pytest.mark.slow

HEARTBEAT_TIMEOUT = 30.0
RANK_SILENCE = 2.0
BOUND = {"kill": 10.0, "hang": RANK_SILENCE + 15.0, "host": 15.0}
"""Seconds within which every rank of the other group must have committed in the new quorum."""
RANKS = 4
"""Ranks of a group: 2 hosts of 2."""


def group_host(tmp_path, address: str, group: str, rank: int, host_id: str) -> AgentProcess:
    a = AgentProcess(tmp_path, address, group, rank, 2, "--hidden", "32", "--wait-for", "2", "--steps", "1000000",
                     "--every-rank-prints", "--step-sleep", "0.02",
                     agent_args=("--nproc", "2", "--nnodes", "2", "--host-id", host_id, "--max-restarts", "10",
                                 "--hang-grace", "1s", "--rank-silence", f"{RANK_SILENCE:g}s"),
                     worker="tests.hsdp_worker")
    a.log_path = tmp_path / f"agent-{host_id}.log"
    return a


def steps_of(agents: list[AgentProcess]) -> list[dict]:
    """Every rank's step lines printed so far through ``agents``."""
    for a in agents:
        a.drain()
    return [line for a in agents for line in a.step_lines]


def told(agents: list[AgentProcess], quorum_id: int, since: float, timeout: float) -> float:
    """Seconds from ``since`` until every rank behind ``agents`` committed a step in quorum ``quorum_id`` or later."""
    first: dict[int, float] = {}

    def every_rank() -> bool:
        for line in steps_of(agents):
            if line["quorum"] >= quorum_id and line["time"] >= since:
                first.setdefault(line["from_rank"], line["time"])
        return len(first) == RANKS
    wait_until(every_rank, timeout + 30, interval=0.05,
               message=f"every rank committing in quorum {quorum_id} (so far: {sorted(first)})")
    return max(first.values()) - since


def quorum_without(log: JsonLog, group: str, since: float) -> int:
    return log.wait_event("quorum_change", 60, since=since, members=lambda m: m is not None and group not in m
                          and len(m) == 1)["quorum_id"]


def together_again(log: JsonLog, agents: list[AgentProcess], since: float) -> None:
    q = log.wait_event("quorum_change", 120, since=since, members=lambda m: m is not None and len(m) == 2)
    told(agents, q["quorum_id"], since, 120)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def rank_pid(agent: AgentProcess) -> int:
    """The pid of a live rank behind ``agent`` (an earlier incarnation's are gone)."""
    return agent.read_until(lambda line: "pid" in line and "rank" in line and alive(line["pid"]), 60)["pid"]


def one_stream_per_group(url: str) -> None:
    """Each group's pings come on one stream, its host 0's, carrying its 2 hosts' heartbeats."""
    def streams() -> tuple[float | None, float | None]:
        m = scrape(url)
        carried = 'fthsdp_host_streams{beats="in-batches",job="default"}'
        return m.get('fthsdp_ping_streams{job="default"}'), m.get(carried)
    wait_until(lambda: streams() == (2, 4), 30, message="one ping stream per group, every host's heartbeats in it")


def test_every_rank_of_the_other_group_is_told_of_a_killed_rank_a_hung_rank_and_a_dropped_host(tmp_path):
    c = CoordinatorProcess(tmp_path, "--min-replicas", "1", "--heartbeat-timeout", f"{HEARTBEAT_TIMEOUT:g}s",
                           "--heartbeat-interval", "200ms", "--spare-wait", "60s", "--log-format", "json",
                           "--metrics-port", "0").start()
    log = JsonLog(c.log_path)
    hosts = {h: group_host(tmp_path, c.address, g, k, h)
             for g, k, pair in (("r0", 0, ("h-a", "h-b")), ("r1", 1, ("h-c", "h-d"))) for h in pair}
    survivors = [hosts["h-a"], hosts["h-b"]]
    times: dict[str, float] = {}
    stopped: int | None = None
    try:
        for a in hosts.values():
            a.start()
        together_again(log, survivors, 0.0)
        one_stream_per_group(c.metrics_url)

        # 1. A rank of r1 killed: its agent reports it at once.
        victim = rank_pid(hosts["h-d"])
        since = time.time()
        os.kill(victim, signal.SIGKILL)
        times["kill"] = told(survivors, quorum_without(log, "r1", since), since, BOUND["kill"])
        together_again(log, survivors, time.time())

        # 2. A rank of r1 hung (stopped): its pings to its agent stop; the agent ends the group's ranks.
        stopped = rank_pid(hosts["h-c"])
        since = time.time()
        os.kill(stopped, signal.SIGSTOP)
        times["hang"] = told(survivors, quorum_without(log, "r1", since), since, BOUND["hang"])
        together_again(log, survivors, time.time())

        # 3. Host h-d dropped: its agent SIGKILLed (its ranks die with it); it comes back later.
        since = time.time()
        hosts["h-d"].proc.send_signal(signal.SIGKILL)
        times["host"] = told(survivors, quorum_without(log, "r1", since), since, BOUND["host"])
        back = group_host(tmp_path, c.address, "r1", 1, "h-d")
        back.log_path = tmp_path / "agent-h-d-again.log"
        hosts["h-d-again"] = back.start()
        together_again(log, survivors, time.time())
        one_stream_per_group(c.metrics_url)
    finally:
        end_started()  # everything it started, the stopped rank too, killed at once (tests/harness/ending.py)
    print("every rank of r0 committing in the quorum without r1, seconds after the fault:", times)
    for fault, seconds in times.items():
        assert seconds <= BOUND[fault], f"{fault}: {seconds:.2f}s > {BOUND[fault]}s"
    # The stopped rank was found by its own agent, not by the coordinator's timeout.
    assert "sent its agent no ping" in hosts["h-c"].log_path.read_text()
    for rank in range(RANKS):  # r0 never lost or repeated a step
        steps = [line["step"] for line in steps_of(survivors) if line["from_rank"] == rank]
        assert steps == list(range(steps[0], steps[0] + len(steps))), f"r0's rank {rank} skipped or repeated a step"
