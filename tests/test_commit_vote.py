"""One commit decision per step (fthsdp/agent/training/ftar/vote.py), raced in-process.

Three members train in quorum 2, each FTAR on a thread of its own over a
fake transport (tests/harness/fake_collectives.py) whose collectives complete on
each member when the test says. A newer quorum 3 (one member dropped, cut
from the coordinator so that it never hears of it; or a regroup of all
three) reaches some members at every point between step 1's data all-reduce
and its commit: before any member's part of the all-reduce or of the vote
completed, between the members' parts in every order, or just as a member
sees its part complete. Every race must end with one state per step: every
member that commits a step commits the same sum (the dropped member too,
until it hears that it is out: then it commits nothing more), and the
survivors commit every step.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import uuid

import pytest
import torch
import torch.distributed as dist

from fthsdp.agent.training.ftar.allreduce import CONTROL_SLOTS, FTAR, StepSum
from fthsdp.agent.training.ftar.vote import Verdict, verdict
from fthsdp.agent.training.quorum_view import QuorumView
from fthsdp.core.errors import Evicted
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.fake_collectives import FakeNetwork, FakeTransport, Op

MEMBERS = 3
STEPS = 3
RACED_STEP = 1
TARGET = {"data": 3, "vote": 4}
"""Quorum 2's collectives, in order: step 0's agree (0), data all-reduce (1)
and vote (2), then step 1's data all-reduce (3) and vote (4)."""
END_QUORUM = 100
"""The quorum that ends a race: it includes nobody, so every member stops with ``Evicted``."""
SEEN = -1
"""``Race.at``: the push comes as the first informed member sees its part completed."""


@dataclasses.dataclass(frozen=True)
class Race:
    op: str
    """Which of step 1's collectives in quorum 2 the push races: "data" or "vote"."""
    order: tuple[int, ...]
    """The order the members' parts of it complete in."""
    at: int
    """The push reaches ``informed`` after this many parts completed (SEEN: see above)."""
    informed: tuple[int, ...]
    """Who hears of quorum 3 then; the other survivors hear once every part completed."""
    dropped: int | None
    """The member quorum 3 leaves out (None: a regroup of all three)."""

    def __str__(self) -> str:
        at = "seen" if self.at == SEEN else self.at
        out = f"r{self.dropped}" if self.dropped is not None else "none"
        return f"{self.op}-order{''.join(map(str, self.order))}-at{at}-told{''.join(map(str, self.informed))}-out_{out}"


@dataclasses.dataclass
class Member:
    committed: dict[int, tuple[list[float], int]] = dataclasses.field(default_factory=dict)
    """Step: (the sum it committed, contributors)."""
    ended: BaseException | None = None


def gradient(member: int, step: int) -> torch.Tensor:
    """Distinct per member and step, so that every sum tells its contributors."""
    values = torch.full((4,), float((step + 1) * 10 ** member), dtype=torch.float64)
    return torch.cat([values, torch.zeros(CONTROL_SLOTS, dtype=torch.float64)])


def run(race: Race, timeout: float = 20.0) -> dict[int, Member]:
    net = FakeNetwork()
    store = dist.HashStore()  # the members' rendezvous, in-process (QuorumGroups.connect_store)
    address = "in-process:0"
    trackers = [QuorumView(f"r{i}") for i in range(MEMBERS)]
    q2 = pb.Quorum(id=2, member_count=MEMBERS, first_member_address=address, last_drop_id=2)
    for i, t in enumerate(trackers):
        t.update(pb.WatchEvent(quorum=q2, place=pb.QuorumPlace(rank=i)))
    survivors = [i for i in range(MEMBERS) if i != race.dropped]
    q3 = pb.Quorum(id=3, member_count=len(survivors), first_member_address=address, last_drop_id=3)
    told: set[int] = set()
    finished: set[int] = set()

    def push(members, op: Op | None = None) -> None:
        """Quorum 3 reaches ``members``; with ``op``: wait until each has left quorum 2's group for it."""
        for i in members:
            if i not in told:
                told.add(i)
                place = {"place": pb.QuorumPlace(rank=survivors.index(i))} if i in survivors else {}
                trackers[i].update(pb.WatchEvent(quorum=q3, **place))
        for i in members if op is not None else ():
            net.wait(lambda i=i: (0, i) in net.left or i in finished, f"r{i} leaving quorum 2's group")

    def raced(op: Op) -> bool:
        return op.group == 0 and op.index == TARGET[race.op]

    def director(op: Op) -> None:
        """Release the raced collective part by part, each seen (or left) before the next."""
        if not raced(op):
            net.release_all(op)
            return
        assert op.kind == "allreduce"
        for n, rank in enumerate(race.order):
            if n == race.at:
                push(race.informed, op)
            net.release(op, rank)
            net.wait(lambda rank=rank: net.seen_or_left(op, rank), f"r{rank} seeing its part complete")
        if race.at != SEEN:
            push(race.informed, op)
            push(survivors)

    def on_observe(op: Op, rank: int) -> None:
        """The member's own thread, just as it sees its part complete."""
        if race.at == SEEN and raced(op) and rank == race.informed[0]:
            push(race.informed)
            push(survivors)

    net.director, net.on_observe = director, on_observe
    members = {i: Member() for i in range(MEMBERS)}
    job = f"race-{uuid.uuid4().hex[:8]}"

    def train(i: int) -> None:
        """Train until the test ends the job (a quorum that leaves everyone out)."""
        ftar = FTAR(trackers[i], job, timeout=timeout / 2, transport=FakeTransport(net))
        ftar.groups.connect_store = lambda address, timeout: store
        try:
            for step in itertools.count():
                result = ftar.allreduce(StepSum(step, gradient(i, step), 1, refill=lambda s=step: gradient(i, s),
                                                control_slots=True))
                with net.changed:
                    members[i].committed[step] = (result.total.tolist(), result.contributors)
                    net.changed.notify_all()
        except BaseException as e:  # noqa: BLE001 - recorded for the assertions
            members[i].ended = e
        with net.changed:
            finished.add(i)
            net.changed.notify_all()

    threads = {i: threading.Thread(target=train, args=(i,), daemon=True) for i in range(MEMBERS)}
    for t in threads.values():
        t.start()
    net.wait(lambda: all(STEPS - 1 in members[i].committed or i in finished for i in survivors),
             f"{race}: every survivor committing step {STEPS - 1}", timeout)
    push(range(MEMBERS))  # the dropped member's link to the coordinator heals: it hears that it is out
    for i in range(MEMBERS):  # the end of the job
        trackers[i].update(pb.WatchEvent(quorum=pb.Quorum(id=END_QUORUM, member_count=1, last_drop_id=END_QUORUM)))
    for t in threads.values():
        t.join(timeout)
        assert not t.is_alive(), f"{race}: a member did not end"
    assert not net.errors, net.errors
    return members


def races():
    for op in TARGET:
        for dropped in [*range(MEMBERS), None]:
            survivors = tuple(i for i in range(MEMBERS) if i != dropped)
            for order in itertools.permutations(range(MEMBERS)):
                for informed in [survivors, *((m,) for m in survivors)]:
                    for at in [*range(MEMBERS + 1), SEEN]:
                        race = Race(op, order, at, informed, dropped)
                        yield pytest.param(race, id=str(race))


def check_one_state_per_step(race: Race, members: dict[int, Member]) -> None:
    survivors = [i for i in range(MEMBERS) if i != race.dropped]
    for i in survivors:
        assert isinstance(members[i].ended, Evicted) and f"({END_QUORUM})" in str(members[i].ended), (
            f"survivor r{i} failed: {members[i].ended!r}")
        assert sorted(members[i].committed) == list(range(len(members[i].committed))), f"r{i} skipped a step"
        assert len(members[i].committed) >= STEPS, f"survivor r{i} lost a step"
    for step in range(max(len(m.committed) for m in members.values())):
        states = {i: m.committed[step] for i, m in members.items() if step in m.committed}
        assert len({repr(s) for s in states.values()}) == 1, f"step {step} committed differently: {states}"
    if race.dropped is not None:
        out = members[race.dropped]
        assert isinstance(out.ended, Evicted), f"the dropped member ended with {out.ended!r}"


@pytest.mark.parametrize("race", list(races()))
def test_every_member_commits_the_same_sum_or_nothing(race):
    check_one_state_per_step(race, run(race))


def full_sum(step: int, members) -> list[float]:
    return [float(sum((step + 1) * 10 ** i for i in members))] * 4


def test_the_issues_race_a_member_cut_from_the_coordinator_commits_nothing():
    """The race behind the issue: r0 and r1 hear that r2 is out before their
    part of step 1's all-reduce completes; r2's completes. r2 commits
    nothing (it used to commit the sum of three that the others then redid
    between the two of them)."""
    members = run(Race("data", (2, 0, 1), 0, (0, 1), 2))
    check_one_state_per_step(Race("data", (2, 0, 1), 0, (0, 1), 2), members)
    assert RACED_STEP not in members[2].committed
    assert members[0].committed[RACED_STEP] == (full_sum(RACED_STEP, [0, 1]), 2)


def test_a_sum_committed_by_a_dropped_member_is_the_survivors_sum():
    """r2's vote completes (nobody had heard of quorum 3 when it voted); r0
    and r1 hear before theirs does and leave it, holding the sum: they
    commit that sum, of three contributors, not one of their own."""
    race = Race("vote", (2, 0, 1), 1, (0, 1), 2)
    members = run(race)
    check_one_state_per_step(race, members)
    assert members[2].committed[RACED_STEP] == (full_sum(RACED_STEP, [0, 1, 2]), 3)
    assert members[0].committed[RACED_STEP] == (full_sum(RACED_STEP, [0, 1, 2]), 3)


def test_a_member_learns_from_its_peers_that_it_is_out():
    """r1 hears of quorum 3 as it sees step 1's sum complete, and votes
    knowing it; r2, cut from the coordinator, learns of quorum 3 from that
    vote and commits nothing, while r0 and r1 commit the sum of three."""
    race = Race("data", (0, 1, 2), SEEN, (1,), 2)
    members = run(race)
    check_one_state_per_step(race, members)
    assert RACED_STEP not in members[2].committed
    assert "it commits nothing of quorum 2's step" in str(members[2].ended)
    assert members[0].committed[RACED_STEP] == (full_sum(RACED_STEP, [0, 1, 2]), 3)


@pytest.mark.parametrize("seen, known, included, expected", [
    (2, 2, True, Verdict.COMMIT),  # nobody knew of a newer quorum: the usual step
    (3, 3, True, Verdict.COMMIT),  # a newer one that keeps this member: commit, switch at the boundary
    (2, 3, True, Verdict.COMMIT),  # this member heard of it after voting: the decided step stands
    (3, 3, False, Verdict.OUT),  # the push came (after a wait): it leaves this member out
    (2, 3, False, Verdict.OUT),
    (3, 2, True, Verdict.UNHEARD),  # its peers know quorum 3, its push never came: cut from the coordinator
    (3, 2, False, Verdict.UNHEARD),
])
def test_verdict_after_a_completed_vote(seen, known, included, expected):
    assert verdict(seen, known, included) is expected
