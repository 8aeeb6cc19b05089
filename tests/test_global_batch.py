"""A constant global batch while a replica is out: ``Manager.participation()``
(fthsdp/agent/training/session/participation.py) and fthsdp.examples.gpt.train ``--global-batch``.

The participation's rules are table-tested on pushed quorums; a real job (a
coordinator, 3 agents training the example) shows that the survivors of a
kill take the missing replica's share, so that every step but the one the
replica died in trains on the whole global batch.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fthsdp.agent.training.quorum_view import KEEP_PLACES, QuorumView
from fthsdp.agent.training.session.participation import Participation, participation
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.ending import end_started
from tests.harness.processes import AgentProcess, CoordinatorProcess

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # benchmarks/ is not an installed package

from benchmarks.accuracy_job import JobSpec, Outage, run_job  # noqa: E402

TRAIN = [sys.executable, "-m", "fthsdp.examples.gpt.train"]
"""The example, run as a module."""


def push(record: QuorumView, quorum_id: int, *members: str, count: int = 0) -> None:
    """A Watch event as the coordinator pushes it to ``record``'s replica:
    the quorum without its list, and the replica's place if it is a member
    (``count`` alone: a quorum it is not in)."""
    event = pb.WatchEvent(quorum=pb.Quorum(id=quorum_id, member_count=count or len(members)))
    if record.replica_id in members:
        event.place.rank = members.index(record.replica_id)
    record.update(event)


def test_the_basis_is_the_quorum_of_the_last_step_not_the_newest_push():
    record = QuorumView("r1")
    push(record, 4, "r0", "r1", "r2")
    assert participation(record, 4, joining=False) == Participation(1, 3)
    push(record, 5, "r1", "r2")  # r0 lost: pushed, but the step in flight was split among 3
    assert participation(record, 4, joining=False) == Participation(1, 3)
    assert participation(record, 5, joining=False) == Participation(0, 2)  # the next step, committed in 5
    push(record, 6, "r0", "r1", "r2")  # r0 back: it joins at a boundary the members agree on
    assert participation(record, 5, joining=False) == Participation(0, 2)
    assert participation(record, 6, joining=False) == Participation(1, 3)


def test_every_member_of_a_quorum_has_its_own_index():
    members = ("r0", "r1", "r2", "r3")
    places = []
    for me in members:
        record = QuorumView(me)
        push(record, 9, *members)
        places.append(participation(record, 9, joining=False))
    assert sorted(p.index for p in places) == [0, 1, 2, 3] and {p.count for p in places} == {4}


def test_a_joiner_contributes_nothing_and_gets_an_estimate_of_its_place():
    record = QuorumView("r2")
    push(record, 7, count=2)  # not a member: the quorum without its list
    assert participation(record, 0, joining=True) == Participation(2, 3, contributes=False)
    push(record, 8, "r0", "r1", "r2")  # admitted: its place in the quorum that includes it
    assert participation(record, 0, joining=True) == Participation(2, 3, contributes=False)
    assert participation(record, 8, joining=False) == Participation(2, 3)


def test_only_the_recent_member_lists_are_kept():
    record = QuorumView("r0")
    for q in range(1, KEEP_PLACES + 11):
        push(record, q, "r0", *(f"x{i}" for i in range(q % 3)))
    newest = KEEP_PLACES + 10
    assert participation(record, newest, joining=False) == Participation(0, 1 + newest % 3)
    # A basis trimmed away falls back on the newest quorum that includes this replica.
    assert participation(record, 1, joining=False) == Participation(0, 1 + newest % 3)


def test_bad_global_batch_is_one_line():
    p = subprocess.run([*TRAIN, "--global-batch", "-1"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--global-batch must be 0 or more" in p.stderr and "Traceback" not in p.stderr


def test_a_global_batch_smaller_than_the_replicas_says_so(tmp_path):
    c = CoordinatorProcess(tmp_path, "--min-replicas", "2").start()
    agents = [AgentProcess(tmp_path, c.address, f"r{i}", i, 2, agent_args=("--max-restarts", "0")) for i in range(2)]
    try:
        for a in agents:
            rank = a.argv.index("--") + 1  # the rank runs the example module, not the test worker
            a.argv[rank:] = [*TRAIN, "--steps", "5", "--global-batch", "1", "--n-layer", "1"]
            a.start()
        for a in agents:
            assert a.proc.wait(timeout=90) != 0
        logs = "".join(a.log_tail() for a in agents)
        assert "--global-batch 1 leaves no sample for each of 2 replicas" in logs, logs
        assert "Traceback" not in logs
    finally:
        end_started()  # everything it started, killed at once (tests/harness/ending.py)


@pytest.mark.slow
def test_survivors_take_a_killed_replicas_share(tmp_path):
    """r1 dies at the start of step 6 and is restarted by its agent. Only
    that step trains on fewer samples (the 2 survivors' shares of 8); while
    r1 is out the 2 others take 12 each, and once it is back 8 each again.
    Every replica computed the same share at every step (checked by
    run_job), counts the same samples, and evaluates the same state."""
    spec = JobSpec("kill", 0, samples=24 * 30, replicas=3, eval_every=10, global_batch=24, outages=(Outage(1, 6),))
    r = run_job(spec, tmp_path, timeout=300)
    assert r.failures == 1 and r.replica_steps_out > 0
    short = [i + 1 for i, n in enumerate(r.step_samples) if n != 24]
    assert short == [7] and r.step_samples[6] == 16, r.step_samples  # committed step 7 is step index 6
    assert r.contributors[7] == 2 and 3 in r.contributors[8:]  # out, then back
    assert r.samples == r.samples_from_steps == 24 * 30 + 16  # one step more, for the lost share
    assert r.val_disagreements == 0 and r.val[-1][0] == r.samples
