"""A restore's first quorum holds every replica that comes back in time (issue 38), with real processes.

Three replicas under ``fthsdp agent`` (real processes, gloo, a real
coordinator) save a checkpoint every 10 steps; every replica's training
process is SIGKILLed at once and the agents restart them. The coordinator
restores the newest checkpoint and its first quorum waits for the members
whose state was lost (fthsdp/coordinator/decisions/restore_wait.py): the first step
after the restore is trained by all three, and so each step redone equals
the same step before the kill, bit for bit: the same loss and the same
state checksum. When one replica does not
come back (its agent is gone with it), the two others train once
``join_timeout`` (2 s here) has passed since the first of them loaded it.
"""

from __future__ import annotations

import os
import signal

from fthsdp.client import CoordinatorClient
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.processes import AgentProcess
from tests.harness.waiting import wait_until

EVERY = 10


def status(c) -> pb.StatusResponse:
    with CoordinatorClient([c.address]) as client:
        return client.status("default")


def checkpointing(tmp_path) -> dict[str, str]:
    # A checksum at every step: each redone step is compared with the same step before the kill.
    return {"FTHSDP_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "FTHSDP_CHECKPOINT_EVERY": str(EVERY),
            "FTHSDP_CHECKSUM_EVERY": "1"}


class Lines:
    """Every JSON line an agent passed on, in order, split at each admission (one per incarnation)."""

    def __init__(self, agent: AgentProcess) -> None:
        self.agent = agent
        self.incarnations: list[list[dict]] = []

    def _see(self, line: dict) -> None:
        if "admitted" in line:
            self.incarnations.append([])
        if self.incarnations:
            self.incarnations[-1].append(line)

    def until(self, predicate, timeout: float = 60.0) -> dict:
        def seen(line: dict) -> bool:
            self._see(line)
            return predicate(line)

        return self.agent.read_until(seen, timeout)

    def admission(self, n: int) -> dict:
        """The admission line of incarnation ``n`` (0: the first)."""
        return self.incarnations[n][0]

    def steps(self, n: int) -> dict[int, dict]:
        return {line["step"]: line for line in self.incarnations[n] if "step" in line}


def started(cluster, tmp_path, join_timeout: str):
    coordinator, agent, _ = cluster
    # min_replicas 1: without the restore's wait the first replica to load the checkpoint trained alone.
    c = coordinator("--min-replicas", "1", "--join-timeout", join_timeout)
    agents = [agent(c, i, 3, env=checkpointing(tmp_path)) for i in range(3)]
    lines = [Lines(a) for a in agents]
    pids = [ln.until(lambda line: "admitted" in line)["pid"] for ln in lines]
    wait_until(lambda: status(c).checkpoint.step >= 2 * EVERY, 90, message="two checkpoints recorded")
    return c, agents, lines, pids


def restored_step(c) -> int:
    wait_until(lambda: status(c).HasField("last_restore"), 60, message="the lost state restored")
    return status(c).last_restore.checkpoint.step


def first_steps_after_restore(lines: list[Lines]) -> list[dict]:
    """Each replica's first step line after the restore (its second incarnation's)."""
    out = []
    for ln in lines:
        ln.until(lambda line, ln=ln: "admitted" in line and len(ln.incarnations) == 2, 90)
        out.append(ln.until(lambda line: "step" in line, 60))
    return out


def test_every_rank_killed_at_once_the_restore_trains_its_first_step_with_all_three(cluster, tmp_path):
    # A join timeout well above how far apart three processes starting on two loaded cores load it.
    c, _, lines, pids = started(cluster, tmp_path, "20s")
    for pid in pids:  # at once, as a power loss would
        os.kill(pid, signal.SIGKILL)
    restored = restored_step(c)
    firsts = first_steps_after_restore(lines)
    # Each loaded the checkpoint (none copied a peer), and the first step had all three in it.
    assert [ln.admission(1)["catch_up"] for ln in lines] == [None, None, None]
    assert [(line["step"], line["contributors"]) for line in firsts] == [(restored + 1, 3)] * 3, firsts
    # Every step redone after the restore is the step before the kill: the same global batch on
    # the same state, so the same loss and the same state after it, bit for bit (a third of the
    # batch would give another; so would a sum of other bits: ftar.py's _start_sum).
    killed_at = max(max(ln.steps(0)) for ln in lines)
    assert killed_at > restored  # the members trained past the checkpoint before they were killed
    for ln in lines:
        ln.until(lambda line: line.get("step", 0) >= killed_at, 60)
    redone = [s for s in range(restored + 1, killed_at + 1) if all(s in ln.steps(0) for ln in lines)]
    assert redone and redone[0] == restored + 1
    for ln in lines:
        before, after = ln.steps(0), ln.steps(1)
        assert [after[s]["loss"] for s in redone] == [before[s]["loss"] for s in redone], ln.agent.replica_id
        assert [after[s]["checksum"] for s in redone] == [before[s]["checksum"] for s in redone], ln.agent.replica_id
        assert all(after[s]["contributors"] == 3 for s in redone)
    for s in redone:  # and the three agree on the state after each
        assert len({ln.steps(1)[s]["checksum"] for ln in lines}) == 1
    assert not any(r.checksum_mismatch_step for r in status(c).replicas)


def test_a_replica_that_does_not_come_back_is_waited_for_join_timeout_then_the_others_train(cluster, tmp_path):
    c, agents, lines, pids = started(cluster, tmp_path, "2s")
    agents[2].kill()  # r2's host goes down: nothing restarts its rank
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    restored = restored_step(c)
    firsts = first_steps_after_restore(lines[:2])
    assert [ln.admission(1)["catch_up"] for ln in lines[:2]] == [None, None]  # both loaded it
    assert [(line["step"], line["contributors"]) for line in firsts] == [(restored + 1, 2)] * 2, firsts
    log = (tmp_path / "coordinator.log").read_text()
    waited = f"restored the checkpoint of step {restored}: waiting up to join_timeout 2s"
    assert waited in log and "for r2 (a member when the state was lost" in log
    assert (f"join_timeout 2s passed since the first replica loaded the checkpoint of step {restored}; "
            "r2 (a member when the state was lost") in status(c).quorum.reason
