"""FTAR's phases in-process, table-driven (fthsdp/agent/training/ftar/phases.py).

Each member runs FTAR on a thread of its own over the fake transport of
tests/harness/fake_collectives.py, whose groups are matched by the order their
members post collectives, as gloo's are. The tables kill a member as it is
about to post a given collective of a given group (so: in a given phase),
push a newer quorum in the middle of a collective, let a joiner take its
first step, or give the members different bucket plans; every run must end
with one state per step: every member that commits a step commits the same
sum, the survivors commit every step, and the sum counts the contributors
whose gradients it holds. They run in milliseconds; the real-process tests
(tests/test_ftar.py, tests/test_overlapping_failures.py) stay beside them.

Every test runs twice: with a new group per quorum, and with one group per
member reconfigured in place (fthsdp/agent/training/transport/reconfigure.py).
"""

from __future__ import annotations

import threading

import pytest
import torch

from fthsdp.agent.training.ftar.allreduce import CONTROL_SLOTS, FTAR, StepSum
from fthsdp.agent.training.ftar.buckets import BucketPlan
from fthsdp.agent.training.ftar.overlap import Prelaunched
from fthsdp.agent.training.ftar.protocol import Phase
from fthsdp.core.errors import FtarError
from tests.harness import ftar_members
from tests.harness.ftar_members import (
    FIRST_QUORUM,
    Job,
    Kill,
    Killed,
    Op,
    RecordingJoiner,
    full_sum,
    gradient,
    one_step_apart,
    record_phases,
    run_with_kills,
)


@pytest.fixture(autouse=True, params=["per-quorum", "in-place"])
def groups(request, monkeypatch):
    """How each member's group follows the quorum (both, for every test here)."""
    monkeypatch.setattr(ftar_members, "IN_PLACE", request.param == "in-place")
    return request.param


KILL_TABLE = [
    # kills, step checked, its sum's members (every survivor commits that sum), a phase every survivor runs
    pytest.param([Kill(2, 0, 0)], 0, [0, 1], Phase.AGREE,
                 id="dies-before-the-agree: the survivors redo step 0 without it"),
    pytest.param([Kill(2, 0, 1)], 0, [0, 1], Phase.DATA,
                 id="dies-in-the-data-all-reduce: step 0 summed again by the survivors"),
    pytest.param([Kill(2, 0, 2)], 0, [0, 1, 2], Phase.TAKE_HELD,
                 id="dies-before-its-vote: the survivors hold the sum of three and commit it (take-held), no redo"),
    pytest.param([Kill(2, 0, 3)], 1, [0, 1], Phase.DATA, id="dies-in-step-1s-data-all-reduce"),
    pytest.param([Kill(2, 0, 4)], 1, [0, 1, 2], Phase.TAKE_HELD, id="dies-before-step-1s-vote"),
    pytest.param([Kill(0, 0, 2)], 0, [0, 1, 2], Phase.TAKE_HELD,
                 id="rank-0-dies-before-its-vote: a new first member holds the sum"),
    pytest.param([Kill(3, 0, 2), Kill(2, 1, 1)], 0, [0, 1, 2, 3], Phase.TAKE_HELD,
                 id="a-second-member-dies-in-the-take-held-broadcast: the sum of four is still the one committed"),
    pytest.param([Kill(3, 0, 2), Kill(2, 1, 2)], 0, [0, 1, 2, 3], Phase.VOTE,
                 id="a-second-member-dies-in-the-vote-after-take-held"),
    pytest.param([Kill(3, 0, 1), Kill(2, 1, 0)], 0, [0, 1], Phase.AGREE,
                 id="a-second-member-dies-in-the-next-groups-agree"),
]


@pytest.mark.parametrize("kills, step, contributors, recovered_in", KILL_TABLE)
def test_a_member_dies_in_each_phase(monkeypatch, kills, step, contributors, recovered_in):
    seen = record_phases(monkeypatch)
    members = 4 if any(k.member == 3 for k in kills) else 3
    job = run_with_kills(members, kills, steps=3)
    dead = {k.member for k in kills}
    for i in set(range(members)) - dead:
        assert recovered_in in seen[i], f"r{i} ran {seen[i]}"
        assert job.members[i].committed[step] == (full_sum(step, contributors), len(contributors)), f"r{i}"
        assert job.members[i].committed[2][1] == members - len(dead), "after the deaths every step counts the living"
    for i in dead:
        assert isinstance(job.members[i].ended, Killed)


MID_COLLECTIVE = [
    # (collective index in quorum 2's group, the pushed quorum drops nobody (a regroup), expected step 1 contributors)
    pytest.param(0, id="a-regroup-mid-agree"),
    pytest.param(3, id="a-regroup-mid-data-all-reduce"),
]


@pytest.mark.parametrize("index", MID_COLLECTIVE)
def test_a_newer_quorum_arrives_mid_collective(index):
    """Quorum 3 (the same three: a regroup of a stuck collective) is pushed
    while quorum 2's collective ``index`` has every member posted but none
    completed: every member leaves it for quorum 3's group and the step
    goes on there, from the intact local gradients; nothing is lost."""
    job = Job(3)
    pushed = threading.Event()

    def director(op: Op) -> None:
        if op.group == 0 and op.index == index:
            job.push(range(3), FIRST_QUORUM + 1)
            pushed.set()
            job.wait(lambda: all((0, r) in job.net.left for r in range(3)), "every member leaving quorum 2's group")
            return  # never released: left for the newer quorum, as a stuck gloo collective is
        job.net.release_all(op)

    job.net.director = director
    job.push(range(3), FIRST_QUORUM)
    for i in range(3):
        job.train(i)
    job.wait(lambda: all(3 in job.members[i].committed for i in range(3)), "every member committing step 3")
    job.end()
    assert pushed.is_set()
    job.check_one_state_per_step()
    for step in range(4):
        assert job.members[0].committed[step] == (full_sum(step, range(3)), 3)
    assert len(job.net.sizes) == 2, "exactly one new group, quorum 3's"


def test_a_joiners_first_step_joins_the_members_all_reduce_without_a_gradient():
    """r2 joins (quorum 3 only grows quorum 2: last_drop_id 2). The members
    build its group in the background and switch at a step boundary they
    agree on; r2, at step 0 with no gradient, waits in the new group, reads
    the members' inputs of their step and replays to it while their data
    all-reduce runs. Its first sum is the members' (two contributors) of
    their step, and it trains as a member from the next step on."""
    job = Job(3)
    job.push([0, 1], FIRST_QUORUM)
    for i in (0, 1):
        job.train(i)
    job.wait(lambda: all(2 in job.members[i].committed for i in (0, 1)), "the members committing step 2")
    joiner = RecordingJoiner()
    first = StepSum(0, torch.zeros(4 + CONTROL_SLOTS, dtype=torch.float64), 1, contributes=False, control_slots=True)
    job.push([0, 1, 2], FIRST_QUORUM + 1, last_drop_id=FIRST_QUORUM)
    job.train(2, first=first, joining=joiner)
    job.wait(lambda: len(job.members[2].committed) >= 3, "the joiner committing three steps")
    job.end()
    job.check_one_state_per_step()
    head = min(job.members[2].committed)
    assert joiner.calls == [("enter_step", head), ("replay_to", head)]
    assert job.members[2].committed[head] == (full_sum(head, [0, 1]), 2), "its first sum is the members'"
    assert job.members[2].committed[head + 1] == (full_sum(head + 1, [0, 1, 2]), 3)


def test_replicas_with_different_bucket_plans_are_refused_at_the_agree():
    """A member whose buckets differ (another --bucket-cap-mb) would pair
    collectives of different sizes: every member refuses it, loudly, in the
    first agree, before any data moves."""
    plans = [BucketPlan(7, ((0, 4),)), BucketPlan(7, ((0, 4),)), BucketPlan(8, ((0, 2), (2, 4)))]
    job = Job(3, plans=plans)
    job.push(range(3), FIRST_QUORUM)
    for i in range(3):
        job.train(i)
    job.wait(lambda: len(job.finished) == 3, "every member ending")
    job.end()
    for m in job.members.values():
        assert isinstance(m.ended, FtarError) and "--bucket-cap-mb" in str(m.ended)
        assert not m.committed
    assert [op.kind for op in job.net.groups[0]] == ["allgather"], "nothing but the agree ran"


def test_a_stale_bucket_makes_every_member_sum_the_step_again():
    """A member whose bucket left before its gradient changed (another
    micro-batch's backward pass) says so in the stale slot; every member
    reads the same sum and sums the step again, flat, in the same group:
    the committed sum is the right one."""
    job = Job(3)
    job.push(range(3), FIRST_QUORUM)

    def loop(i: int):
        def train(ftar: FTAR) -> None:
            result = ftar.allreduce(StepSum(0, gradient(i, 0), 1, refill=lambda: gradient(i, 0), control_slots=True))
            job.commit(i, 0, result)
            group = ftar.groups.next_group()
            assert group is not None
            wrong = gradient(i, 1) * 0.5  # the bucket's values before the gradient changed
            pre = Prelaunched(group, wrong, works=(), gradients=0, stale=i == 1)
            result = ftar.allreduce(StepSum(1, wrong, 1, refill=lambda: gradient(i, 1), control_slots=True,
                                            prelaunched=pre))
            job.commit(i, 1, result)
        return train

    for i in range(3):
        job.start(i, loop(i))
    job.wait(lambda: len(job.finished) == 3, "every member ending")
    job.end()
    for i, m in job.members.items():
        assert m.ended is None, f"r{i}: {m.ended!r}"
        assert m.committed[1] == (full_sum(1, range(3)), 3)
    kinds = [op.kind for op in job.net.groups[0]]
    assert kinds == ["allgather", "allreduce", "allreduce", "allreduce", "allreduce", "allreduce"], (
        "step 0: agree, data, vote; step 1: the stale data, the data again, the vote")


def test_members_one_step_apart_serve_and_take_the_last_sum(monkeypatch):
    """r0's vote on step 1 completes; a regroup (quorum 3, the same three) reaches
    r1 and r2 before theirs does, so they leave it holding step 1's sum
    undecided while r0 has committed it and moved on. In quorum 3's group r0
    serves step 1's sum (serve-last) and r1, r2 take it (take-last): the sum
    r0 committed, never one of their own."""
    seen = record_phases(monkeypatch)
    job = Job(3)

    job.net.director = one_step_apart(job, lambda: job.push(range(3), FIRST_QUORUM + 1))
    job.push(range(3), FIRST_QUORUM)
    for i in range(3):
        job.train(i)
    job.wait(lambda: all(3 in job.members[i].committed for i in range(3)), "every member committing step 3")
    job.end()
    job.check_one_state_per_step()
    assert Phase.SERVE_LAST in seen[0] and all(Phase.TAKE_LAST in seen[i] for i in (1, 2)), dict(seen)
    for i in range(3):
        assert job.members[i].committed[1] == (full_sum(1, range(3)), 3)


def test_a_joiner_behind_with_a_gradient_closes_the_gap_then_takes_the_last_sum(monkeypatch):
    """r2 comes with a gradient for step 0 while the members are steps ahead
    (admitted while it still replayed): the agree sends it to close the gap
    (close-gap) to the step before theirs, whose sum it takes from them
    (take-last); it trains their next step with them."""
    seen = record_phases(monkeypatch)
    job = Job(3)
    job.push([0, 1], FIRST_QUORUM)
    for i in (0, 1):
        job.train(i)
    job.wait(lambda: all(3 in job.members[i].committed for i in (0, 1)), "the members committing step 3")
    joiner = RecordingJoiner()
    first = StepSum(0, gradient(2, 0), 1, refill=lambda: gradient(2, 0), control_slots=True)
    job.push([0, 1, 2], FIRST_QUORUM + 1, last_drop_id=FIRST_QUORUM)
    job.train(2, first=first, joining=joiner)
    job.wait(lambda: len(job.members[2].committed) >= 3, "the joiner committing three steps")
    job.end()
    job.check_one_state_per_step()
    head = min(job.members[2].committed) + 1
    assert joiner.calls == [("close_gap", head)]
    assert Phase.CLOSE_GAP in seen[2] and Phase.TAKE_LAST in seen[2]
    assert job.members[2].committed[head - 1] == (full_sum(head - 1, [0, 1]), 2), "the members' sum, not its own"
    assert job.members[2].committed[head] == (full_sum(head, [0, 1, 2]), 3)


def test_a_joiner_follows_the_members_take_held_then_joins_their_next_step(monkeypatch):
    """r2 dies before its vote on step 1, holding back r0's and r1's; the
    quorum that drops it admits joiner r3 (no gradient). r0 and r1 commit
    the sum of three they hold (take-held, vote); r3 takes part without
    using it (follow-held, follow-vote), then joins their step 2 as a joiner
    does, and trains step 3 with its own gradient."""
    seen = record_phases(monkeypatch)
    job = Job(4, kills=[Kill(2, 0, 4)])
    job.push(range(3), FIRST_QUORUM)
    for i in range(3):
        job.train(i)
    job.wait(lambda: job.dead(2), "r2 dying")
    job.push([0, 1, 3], FIRST_QUORUM + 1)
    joiner = RecordingJoiner()
    first = StepSum(0, torch.zeros(4 + CONTROL_SLOTS, dtype=torch.float64), 1, contributes=False, control_slots=True)
    job.train(3, first=first, joining=joiner)
    job.wait(lambda: len(job.members[3].committed) >= 2, "the joiner committing two steps")
    job.end()
    job.check_one_state_per_step()
    assert [Phase.FOLLOW_HELD, Phase.FOLLOW_VOTE] == [p for p in seen[3] if p.name.startswith("FOLLOW")]
    assert all(Phase.TAKE_HELD in seen[i] for i in (0, 1))
    assert job.members[0].committed[1] == (full_sum(1, range(3)), 3)
    assert joiner.calls == [("enter_step", 2), ("replay_to", 2)]
    assert job.members[3].committed[2] == (full_sum(2, [0, 1]), 2)
    assert job.members[3].committed[3] == (full_sum(3, [0, 1, 3]), 3)


def test_a_joiner_whose_members_are_all_gone_has_no_gradient_to_sum(monkeypatch):
    """Every member was lost as r0 joined: the quorum is r0 alone, and nobody
    has a gradient for the step (no-gradient). It is not a step: nothing is
    committed, and the loop runs it again with a gradient of its own."""
    seen = record_phases(monkeypatch)
    job = Job(1)
    job.push([0], FIRST_QUORUM)
    results = []

    def train(ftar: FTAR) -> None:
        zeros = torch.zeros(4 + CONTROL_SLOTS, dtype=torch.float64)
        results.append(ftar.allreduce(StepSum(5, zeros, 1, contributes=False, control_slots=True), RecordingJoiner()))
        results.append(ftar.allreduce(StepSum(5, gradient(0, 5), 1, refill=lambda: gradient(0, 5), control_slots=True)))

    job.start(0, train)
    job.wait(lambda: 0 in job.finished, "r0 ending")
    job.end()
    assert job.members[0].ended is None, repr(job.members[0].ended)
    nothing, alone = results
    assert nothing.contributors == 0 and not nothing.total.any()
    assert seen[0][:2] == [Phase.FIND_GROUP, Phase.AGREE]
    assert (alone.step, alone.contributors, alone.total[:4].tolist()) == (5, 1, full_sum(5, [0]))


def test_a_joiner_follows_the_heal_of_members_one_step_apart(monkeypatch):
    """As in the serve-last test, but the regroup also admits joiner r3 (no
    gradient): it takes part in r0's broadcast of step 1's sum without using
    it (follow-heal), then joins the members' step 2."""
    seen = record_phases(monkeypatch)
    job = Job(4)
    joiner = RecordingJoiner()

    def admit_r3() -> None:
        job.push(range(4), FIRST_QUORUM + 1)  # a regroup that also admits r3
        zeros = torch.zeros(4 + CONTROL_SLOTS, dtype=torch.float64)
        job.train(3, first=StepSum(0, zeros, 1, contributes=False, control_slots=True), joining=joiner)

    job.net.director = one_step_apart(job, admit_r3)
    job.push(range(3), FIRST_QUORUM)
    for i in range(3):
        job.train(i)
    job.wait(lambda: len(job.members[3].committed) >= 2, "the joiner committing two steps")
    job.end()
    job.check_one_state_per_step()
    assert Phase.FOLLOW_HEAL in seen[3] and Phase.SERVE_LAST in seen[0], dict(seen)
    assert joiner.calls == [("enter_step", 2), ("replay_to", 2)]
    assert job.members[3].committed[2] == (full_sum(2, range(3)), 3)
    assert job.members[3].committed[3] == (full_sum(3, range(4)), 4)
