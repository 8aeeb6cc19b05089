"""A replica that starts after a fresh job's members began training.

The members of a fresh job wait at their step for the replica count their
script passes to ``start(wait_for_replicas=N)``; once the quorum has it they
train, and until their next heartbeat the coordinator still sees them at the
step they started from. A replica that starts then, at that step, is behind
them all the same: it must catch up from one and be admitted when ready,
not be admitted on its step, fail its first all-reduce and be restarted.
Real processes: a coordinator, replicas training over gloo on loopback.
"""

from __future__ import annotations

import signal

from fthsdp.client import CoordinatorClient
from tests.harness.fixtures import FOREVER
from tests.harness.processes import CoordinatorProcess, WorkerProcess

# Slow heartbeats: the members' step as the coordinator knows it stays where
# they started for most of the time a late replica takes to start.
COORDINATOR = ("--heartbeat-interval", "30s", "--heartbeat-timeout", "90s")
WORKER = ("--steps", FOREVER, "--wait-for", "2", "--hidden", "64", "--slow", "0.02")


def reported_step(address: str, replica_id: str) -> int:
    with CoordinatorClient([address]) as client:
        return {r.replica_id: r.step for r in client.status().replicas}[replica_id]


def test_a_replica_that_starts_after_the_members_began_training_catches_up_first(tmp_path):
    c = CoordinatorProcess(tmp_path, *COORDINATOR).start()
    workers = [c]
    try:
        r0, r1 = (WorkerProcess(tmp_path, c.address, f"r{i}", i, *WORKER).start() for i in range(2))
        workers += [r0, r1]
        r0.read_until(lambda line: line.get("step", 0) >= 5)
        # What makes this a test of the race: the members trained past what
        # the coordinator knows of them (their heartbeats are slow here).
        assert reported_step(c.address, "r0") < 5
        r2 = WorkerProcess(tmp_path, c.address, "r2", 2, *WORKER).start()
        workers.append(r2)
        admitted = r2.read_until(lambda line: "admitted" in line, timeout=90)
        first = r2.read_until(lambda line: "step" in line, timeout=30)["step"]
        assert first > 5, f"r2 took its first step at {first}, behind the members"
        assert admitted["catch_up"] is not None, "r2 was admitted on its step, not after catching up"
        assert admitted["catch_up"]["source"] in ("r0", "r1"), admitted
        r2.read_until(lambda line: line.get("step", 0) >= first + 20)
        r0.read_until(lambda line: line.get("step", 0) >= first + 20)
        common = [s for s in range(first, first + 20) if s in r0.steps and s in r2.steps]
        assert len(common) >= 10, f"too few common steps: {common}"
        for s in common:
            assert r2.steps[s]["checksum"] == r0.steps[s]["checksum"], f"r2 differs from r0 at step {s}"
        assert r2.proc.poll() is None, "r2 ended"
    finally:
        for w in workers:
            w.signal(signal.SIGCONT)
            w.kill()
