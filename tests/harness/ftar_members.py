"""Replicas running FTAR on threads over the fake transport (tests/test_ftar_phases.py).

Each member is a thread with its own ``QuorumView`` and FTAR; a test pushes
quorums to them, kills one as it is about to post a given collective of a
given group (``Kill``), and reads what each committed. ``record_phases``
lists the step protocol's phases each member ran.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
import uuid
from collections.abc import Callable

import torch
import torch.distributed as dist

from fthsdp.agent.training.ftar import phases
from fthsdp.agent.training.ftar.allreduce import CONTROL_SLOTS, FTAR, StepSum
from fthsdp.agent.training.ftar.buckets import BucketPlan
from fthsdp.agent.training.ftar.protocol import Phase
from fthsdp.agent.training.quorum_view import QuorumView
from fthsdp.core.errors import Evicted
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.fake_collectives import FakeGroup, FakeNetwork, FakeTransport, Op

ADDRESS = "in-process:0"
FIRST_QUORUM = 2
END_QUORUM = 100
"""A quorum that includes nobody: every member stops with ``Evicted``."""
TIMEOUT = 20.0
IN_PLACE = False
"""Whether a Job's members keep one group each, reconfigured per quorum (tests/test_ftar_phases.py runs both)."""


def record_phases(monkeypatch) -> dict[int, list[Phase]]:
    """The phases each member ran (the step protocol's ``after`` sees every one), by member."""
    seen: dict[int, list[Phase]] = collections.defaultdict(list)
    real = phases.after

    def after(phase, end, action=None):
        name = threading.current_thread().name
        if name.startswith("member-r"):
            seen[int(name.removeprefix("member-r"))].append(phase)
        return real(phase, end, action)

    monkeypatch.setattr(phases, "after", after)
    return seen


class Killed(BaseException):
    """The member's process died here (nothing in FTAR catches it)."""


@dataclasses.dataclass(frozen=True)
class Kill:
    member: int
    group: int
    """The fake group's id: the order groups were built in (0 is the first quorum's)."""
    before: int
    """The member dies as it is about to post this collective of that group."""


def gradient(member: int, step: int) -> torch.Tensor:
    """Distinct per member and step: every sum tells its contributors."""
    values = torch.full((4,), float((step + 1) * 10 ** member), dtype=torch.float64)
    return torch.cat([values, torch.zeros(CONTROL_SLOTS, dtype=torch.float64)])


def full_sum(step: int, members) -> list[float]:
    return [float(sum((step + 1) * 10 ** i for i in members))] * 4


class DoomedGroup:
    """A fake group whose member dies before the collective its ``Kill`` names."""

    def __init__(self, inner: FakeGroup, kills: list[Kill], member: int) -> None:
        self.inner, self.kills, self.member = inner, kills, member

    def _check(self) -> None:
        index = self.inner._counters.get(self.inner.gid, -1) + 1
        if Kill(self.member, self.inner.gid, index) in self.kills:
            raise Killed(f"r{self.member} killed before collective {index} of group {self.inner.gid}")

    def allreduce(self, tensors, opts):
        self._check()
        return self.inner.allreduce(tensors, opts)

    def allgather(self, output_tensors, input_tensors):
        self._check()
        return self.inner.allgather(output_tensors, input_tensors)

    def broadcast(self, tensors, opts):
        self._check()
        return self.inner.broadcast(tensors, opts)


class DoomedTransport(FakeTransport):
    def __init__(self, net: FakeNetwork, kills: list[Kill], member: int, in_place: bool = False) -> None:
        super().__init__(net, in_place)
        self.kills, self.member = kills, member

    def wrap(self, group):
        return DoomedGroup(group, self.kills, self.member)

    def abort(self, group: object) -> None:
        assert isinstance(group, DoomedGroup)
        super().abort(group.inner)


@dataclasses.dataclass
class Member:
    committed: dict[int, tuple[list[float], int]] = dataclasses.field(default_factory=dict)
    """Step: (the sum it committed, its contributors)."""
    ended: BaseException | None = None


class Job:
    """Members training on threads; the test pushes quorums and ends the job."""

    def __init__(self, members: int, kills: list[Kill] = (), plans: list[BucketPlan] | None = None) -> None:
        self.net = FakeNetwork()
        self.store = dist.HashStore()
        self.kills = list(kills)
        self.trackers = [QuorumView(f"r{i}") for i in range(members)]
        self.members = {i: Member() for i in range(members)}
        self.finished: set[int] = set()
        self.quorum_id = FIRST_QUORUM
        self.plans = plans or [BucketPlan()] * members
        self.job = f"phases-{uuid.uuid4().hex[:8]}"
        self.threads: dict[int, threading.Thread] = {}

    def push(self, members, quorum_id: int, last_drop_id: int | None = None) -> None:
        """Quorum ``quorum_id`` of ``members`` (ranks in that order) reaches each of them."""
        members = list(members)
        quorum = pb.Quorum(id=quorum_id, member_count=len(members), first_member_address=ADDRESS,
                           last_drop_id=quorum_id if last_drop_id is None else last_drop_id)
        for rank, i in enumerate(members):
            self.trackers[i].update(pb.WatchEvent(quorum=quorum, place=pb.QuorumPlace(rank=rank)))
        self.quorum_id = max(self.quorum_id, quorum_id)

    def ftar(self, i: int) -> FTAR:
        ftar = FTAR(self.trackers[i], self.job, timeout=TIMEOUT / 2,
                    transport=DoomedTransport(self.net, self.kills, i, IN_PLACE), buckets=self.plans[i])
        ftar.groups.connect_store = lambda address, timeout: self.store
        return ftar

    def start(self, i: int, train) -> None:
        def run() -> None:
            try:
                train(self.ftar(i))
            except BaseException as e:  # noqa: BLE001 - recorded for the assertions
                self.members[i].ended = e
            with self.net.changed:
                self.finished.add(i)
                self.net.changed.notify_all()

        self.threads[i] = threading.Thread(target=run, name=f"member-r{i}", daemon=True)
        self.threads[i].start()

    def train(self, i: int, steps_from: int = 0, first: StepSum | None = None, joining=None):
        """A member's loop: every step summed with its own gradient, committed, the next."""
        def loop(ftar: FTAR) -> None:
            start = steps_from
            if first is not None:
                result = ftar.allreduce(first, joining)
                self.commit(i, result.step, result)
                start = result.step + 1
            for step in itertools.count(start):
                result = ftar.allreduce(StepSum(step, gradient(i, step), 1, refill=lambda s=step: gradient(i, s),
                                                control_slots=True))
                self.commit(i, step, result)
        self.start(i, loop)

    def commit(self, i: int, step: int, result) -> None:
        with self.net.changed:
            self.members[i].committed[step] = (result.total[:4].tolist(), result.contributors)
            self.net.changed.notify_all()

    def dead(self, i: int) -> bool:
        return i in self.finished and isinstance(self.members[i].ended, Killed)

    def wait(self, until, what: str) -> None:
        self.net.wait(until, what, TIMEOUT)

    def end(self) -> None:
        for t in self.trackers:
            t.update(pb.WatchEvent(quorum=pb.Quorum(id=END_QUORUM, member_count=1, last_drop_id=END_QUORUM)))
        for t in self.threads.values():
            t.join(TIMEOUT)
            assert not t.is_alive(), "a member did not end"
        assert not self.net.errors, self.net.errors

    def check_one_state_per_step(self) -> None:
        for step in range(max(len(m.committed) for m in self.members.values())):
            states = {i: m.committed[step] for i, m in self.members.items() if step in m.committed}
            assert len({repr(s) for s in states.values()}) == 1, f"step {step} committed differently: {states}"


def run_with_kills(members: int, kills: list[Kill], steps: int) -> Job:
    """Train until the survivors committed ``steps`` steps; after each death the coordinator
    pushes the quorum of the living (the dead member's place taken out)."""
    job = Job(members, kills)
    job.push(range(members), FIRST_QUORUM)
    for i in range(members):
        job.train(i)
    living = set(range(members))
    for _ in kills:
        job.wait(lambda alive=frozenset(living): any(job.dead(i) for i in alive), "a member dying")
        living = {i for i in living if not job.dead(i)}
        job.push(sorted(living), job.quorum_id + 1)
    job.wait(lambda: all(steps - 1 in job.members[i].committed or i in job.finished for i in living),
             f"every survivor committing step {steps - 1}")
    job.end()
    for i in living:
        m = job.members[i]
        assert isinstance(m.ended, Evicted) and f"({END_QUORUM})" in str(m.ended), f"r{i} failed: {m.ended!r}"
        assert sorted(m.committed) == list(range(len(m.committed))), f"r{i} skipped a step"
    job.check_one_state_per_step()
    return job


# Quorum 2's group (0), in order: step 0's agree (0), data all-reduce (1), vote (2),
# step 1's data all-reduce (3), vote (4). Quorum 3's group (1) after a death in
# step s: the agree (0), then the step's phases in the order the agree chose.


class RecordingJoiner:
    """A joiner's answers (a ``Joining``), recorded: it replays to the head it is asked for."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def close_gap(self, step: int, head: int) -> int:
        self.calls.append(("close_gap", head))
        return head - 1

    def enter_step(self, head: int) -> None:
        self.calls.append(("enter_step", head))

    def replay_to(self, head: int) -> int:
        self.calls.append(("replay_to", head))
        return head

    def while_waiting(self) -> None:
        """Nothing to replay in this test: the members' commits are not read."""


def one_step_apart(job: Job, then: Callable[[], None]) -> Callable[[Op], None]:
    """A director: r0's vote on step 1 (quorum 2's group, collective 4) completes and
    r0 commits step 1; then ``then`` runs (a regroup pushed), before any other
    member's vote completes: theirs never do, and they leave for the newer quorum.
    Every other collective completes at once."""
    def director(op: Op) -> None:
        if op.group == 0 and op.index == 4:
            job.net.release(op, 0)
            job.net.wait(lambda: job.net.seen_or_left(op, 0), "r0 seeing its vote complete")
            job.wait(lambda: 1 in job.members[0].committed, "r0 committing step 1")
            then()
            return
        job.net.release_all(op)
    return director
