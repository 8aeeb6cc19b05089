"""`fthsdp agent` running real training replicas against a real coordinator:
a dead rank is restarted by its agent while the other replicas train on, and
SIGTERM drains a replica at a step boundary."""

from __future__ import annotations

import os
import signal

import pytest

from fthsdp.client import CoordinatorClient
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.processes import AgentProcess, CoordinatorProcess
from tests.harness.waiting import wait_until

N = 3


@pytest.fixture
def agents(tmp_path):
    started = []

    def start(steps: int, hidden: str = "64"):
        c = CoordinatorProcess(tmp_path, "--min-replicas", "2", "--heartbeat-interval", "200ms",
                               "--heartbeat-timeout", "1s").start()
        started.append(c)
        procs = []
        for i in range(N):
            a = AgentProcess(tmp_path, c.address, f"r{i}", i, N, "--steps", str(steps), "--wait-for", str(N),
                             "--hidden", hidden).start()
            procs.append(a)
            started.append(a)
        return c, procs

    yield start
    for proc in reversed(started):
        proc.stop()


def test_agent_restarts_a_replica_whose_rank_died_while_the_others_train(agents):
    c, (a0, a1, a2) = agents(steps=400)
    admitted = a2.read_until(lambda line: "admitted" in line)
    a0.read_until(lambda line: line.get("step") == 5)
    os.kill(admitted["pid"], signal.SIGKILL)  # the rank, not the agent
    with CoordinatorClient([c.address]) as client:
        def restarted() -> bool:
            r2 = {r.replica_id: r for r in client.status().replicas}["r2"]
            return r2.restart_count == 1 and r2.agent_state == pb.AGENT_STATE_RUNNING
        wait_until(restarted, 30, message="the agent restarted r2's rank and reported it")
        survivors = {m.replica_id for m in client.status().quorum.members}
    assert survivors == {"r0", "r1"}
    # The survivors never stopped: they finish with every step committed.
    for a in (a0, a1):
        a.finish(timeout=120)
        assert sorted(a.steps) == list(range(1, 401))
    assert all(a0.steps[s]["checksum"] == a1.steps[s]["checksum"] for s in a0.steps)


def test_sigterm_drains_the_replica_at_a_step_boundary(agents):
    c, (a0, a1, a2) = agents(steps=300)
    a2.read_until(lambda line: line.get("step") == 10)
    a2.signal(signal.SIGTERM)
    done = a2.read_until(lambda line: "done" in line)
    assert done["stopped"] is True and a2.proc.wait(timeout=30) == 0
    last = max(a2.steps)
    for a in (a0, a1):
        a.finish(timeout=120)
    # The drained replica's last committed step matches the others' at that step.
    assert a2.steps[last]["checksum"] == a0.steps[last]["checksum"] == a1.steps[last]["checksum"]
    assert a0.steps[last + 1]["contributors"] == 2 and a0.steps[last]["contributors"] == 3
