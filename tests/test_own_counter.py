"""A step is a step: loops that keep their own counter recover, with real processes.

nanoGPT's loop reads ``ft.step`` once, after ``start()``, and then counts
its own iterations (tests/own_counter_worker.py). ``start()`` returns at the
step the replica trains next as a member, and every committed iteration
advances ``ft.step`` by exactly one, so such a loop stays in step through any
catch-up. Each loop here is killed twice under its agent; after each rejoin
its state equals the members' at every step for 100 steps, its learning rate
is theirs, and nothing but the two kills restarted it (no eviction).
"""

from __future__ import annotations

import os
import random
import signal

import pytest

from fthsdp.client import CoordinatorClient
from tests.harness.fixtures import FOREVER, HIDDEN
from tests.harness.processes import AgentProcess, CoordinatorProcess
from tests.harness.replicas import status_of

AFTER_REJOIN = 100


@pytest.fixture
def job(tmp_path):
    started = []

    def start(loop: str):
        c = CoordinatorProcess(tmp_path, "--min-replicas", "2", "--heartbeat-interval", "200ms",
                               "--heartbeat-timeout", "1s", "--join-timeout", "2s").start()
        started.append(c)
        agents = []
        for i in range(3):
            a = AgentProcess(tmp_path, c.address, f"r{i}", i, 3, "--steps", FOREVER, "--wait-for", "3",
                             "--hidden", HIDDEN, "--loop", loop, worker="tests.own_counter_worker").start()
            started.append(a)
            agents.append(a)
        return c, agents

    yield start
    for proc in reversed(started):
        proc.stop()


def assert_in_step_after_rejoin(joiner, members, rejoined_at: int) -> None:
    """For ``AFTER_REJOIN`` steps from the rejoin: the joiner's own counter is
    ``ft.step``, and its learning rate and state checksum are the members'."""
    end = rejoined_at + AFTER_REJOIN
    joiner.read_until(lambda line: line.get("step", 0) >= end, timeout=120)
    for m in members:
        m.read_until(lambda line: line.get("step", 0) >= end, timeout=120)
    for s in range(rejoined_at + 1, end + 1):
        mine = joiner.steps[s]
        assert mine["ft_step"] == s, f"{joiner.replica_id}'s loop counts {s}, ft.step is {mine['ft_step']}"
        for m in members:
            theirs = m.steps[s]
            assert mine["lr"] == theirs["lr"], f"lr at step {s}: {mine['lr']} vs {m.replica_id}'s {theirs['lr']}"
            assert mine["checksum"] == theirs["checksum"], (
                f"{joiner.replica_id} differs from {m.replica_id} at step {s}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("loop", ["counter", pytest.param("range", marks=pytest.mark.slow)])
def test_a_loop_with_its_own_counter_stays_in_step_through_two_rejoins(job, loop):
    c, (a0, a1, a2) = job(loop)
    rng = random.Random(f"own-counter-{loop}")
    first = a2.read_until(lambda line: "admitted" in line)
    a0.read_until(lambda line: line.get("step", 0) >= 10 + rng.randrange(20))
    pid = first["pid"]
    with CoordinatorClient([c.address]) as client:
        for kill in (1, 2):
            os.kill(pid, signal.SIGKILL)
            back = a2.read_until(lambda line, pid=pid: "admitted" in line and line["pid"] != pid, timeout=90)
            assert back["catch_up"] is not None, "the restarted replica should have caught up from a peer"
            pid = back["pid"]
            # The first line after start(): the loop's counter starts at ft.step, which is the members' next step.
            first_step = a2.read_until(lambda line, back=back: "step" in line and line["t"] > back["t"])["step"]
            assert first_step == back["at"] + 1
            assert_in_step_after_rejoin(a2, (a0, a1), back["at"])
            _, r2 = status_of(client, "r2")
            assert r2.restart_count == kill, f"r2 was restarted {r2.restart_count} times for {kill} kills"
            assert not r2.checksum_mismatch_step
        status = client.status()
        assert {m.replica_id for m in status.quorum.members} == {"r0", "r1", "r2"}
