"""FTAR with real replica processes: failures at every point of a step.

Three replicas (OS processes, gloo on loopback) train a small MLP against a
real coordinator. One is SIGKILLed before its backward pass, in the middle of
the all-reduce, or after it but before its commit; or SIGSTOPped (a hang).
The survivors must commit the failing step and every later one (no step lost,
none repeated), with bit-identical state at every step.
"""

from __future__ import annotations

import signal

import pytest

from tests.harness.cluster import Cluster
from tests.harness.events import JsonLog

STEPS = 8
DIE_AT = 3  # the step (0-based) during which the victim dies
HIDDEN = "1024"  # 2.1M parameters: an all-reduce long enough to be killed in


@pytest.fixture
def cluster(tmp_path):
    """``start(n, victim_args)``: a coordinator and ``n`` workers, the last one
    with ``victim_args``; everything SIGKILLed at the end (SIGCONTed first)."""
    with Cluster(tmp_path, teardown="kill") as built:

        def start(n: int, victim_args: tuple[str, ...] = (), heartbeat_timeout: str = "1s", steps: int = STEPS,
                  hidden: str = HIDDEN):
            c = built.coordinator("--min-replicas", "2", "--heartbeat-interval", "200ms",
                                  "--heartbeat-timeout", heartbeat_timeout, "--log-format", "json")
            workers = [built.worker(c, i, n, *(victim_args if i == n - 1 else ()), steps=str(steps), hidden=hidden)
                       for i in range(n)]
            return c, workers

        yield start


def assert_consistent(survivors, victim_steps, steps: int = STEPS):
    for w in survivors:
        assert sorted(w.steps) == list(range(1, steps + 1)), f"{w.replica_id} lost or repeated a step"
    for step in range(1, steps + 1):
        checksums = {w.steps[step]["checksum"] for w in survivors}
        if step in victim_steps:
            checksums.add(victim_steps[step]["checksum"])
        assert len(checksums) == 1, f"replicas disagree at step {step}: {checksums}"


@pytest.mark.parametrize("die_in", ["forward", "backward", "allreduce", "commit"])
def test_survivors_commit_every_step_when_a_replica_is_killed(cluster, die_in):
    _, (r0, r1, r2) = cluster(3, ("--die-at", str(DIE_AT), "--die-in", die_in))
    for w in (r0, r1):
        w.finish()
    assert r2.collect_after_exit() == -signal.SIGKILL
    assert_consistent([r0, r1], r2.steps)
    failing = r0.steps[DIE_AT + 1]
    # A kill timed into the all-reduce (--die-after) lands after the sum completed everywhere when the
    # victim was the last to start it (its contribution goes out at once): then, as a kill before the commit,
    # the survivors commit the sum they hold.
    if die_in == "commit" or (die_in == "allreduce" and failing["contributors"] == 3):
        # The victim's gradients were in the finished all-reduce: they count.
        assert failing["contributors"] == 3 and r0.steps[DIE_AT + 2]["contributors"] == 2
    else:
        assert failing["contributors"] == 2, failing
        # Either the survivors had entered the step with the victim and redid
        # it among themselves, or the victim's death reached them first and
        # they entered it in a newer quorum without it (a kill in the forward
        # pass can be seen before the survivors' all-reduce starts).
        redone = failing["abandoned"] >= 1
        seen_first = failing["quorum"] > r0.steps[DIE_AT]["quorum"]
        assert redone or seen_first, f"the step should have been redone among the survivors: {failing}"
    assert all(r0.steps[s]["contributors"] == 2 for s in range(DIE_AT + 2, STEPS + 1))
    # The survivors' next commit came quickly (detection by the closed stream).
    gap = failing["t"] - r0.steps[DIE_AT]["t"]
    assert gap < 3.0, f"survivors took {gap:.2f}s to commit the failing step"


def test_survivors_continue_past_a_hung_replica(cluster):
    _, (r0, r1, r2) = cluster(3)
    r2.read_until(lambda line: line.get("step") == DIE_AT)
    r2.signal(signal.SIGSTOP)
    for w in (r0, r1):
        w.finish()
    assert_consistent([r0, r1], r2.steps)
    failing = r0.steps[DIE_AT + 1]
    assert failing["contributors"] == 2
    # A hang is only seen through the heartbeat timeout (1 s here).
    assert failing["t"] - r0.steps[DIE_AT]["t"] < 1.0 + 2.0
    assert all(r0.steps[s]["contributors"] == 2 for s in range(DIE_AT + 2, STEPS + 1))


def test_replica_whose_state_diverges_is_flagged_and_taken_out(cluster, tmp_path):
    from fthsdp.client import CoordinatorClient

    # The survivors train long enough for heartbeats (every 200 ms) to carry
    # the mismatching checksums to the coordinator.
    c, (r0, r1, r2) = cluster(3, ("--corrupt-at", "2"), steps=1500, hidden="32")
    for w in (r0, r1):
        w.finish()
    assert r2.collect_after_exit() != 0
    assert "does not include this replica" in r2.log_path.read_text()  # Evicted
    with CoordinatorClient([c.address]) as client:
        status = {r.replica_id: r for r in client.status().replicas}
    assert status["r2"].checksum_mismatch_step >= 3
    # Only r2 was flagged (the finished survivors have left the table).
    flagged = JsonLog(c.log_path).events_named("checksum_mismatch")
    assert len(flagged) == 1 and flagged[0]["replica"] == "r2", flagged
    assert_consistent([r0, r1], {}, steps=1500)
    assert r0.steps[1500]["contributors"] == 2
