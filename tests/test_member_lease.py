"""Member leases (fthsdp/coordinator/decisions/lease.py, fthsdp/agent/training/session/lease.py).

In process: the quorum decision waits out the leases of the previous
quorum's members before any quorum none of them continues in (a state loss,
a restore, holders from outside), table-driven on an injected clock; the
coordinator grants leases only to members it holds to be training, echoes
the heartbeat's number, releases a lease on a failure report and presumes
one after a start; and the member's side: a lease counted from when the
heartbeat was sent, a commit held while it is out, renewed or evicted.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest

from fthsdp.agent.training.session.lease import MemberLease, commit_guard
from fthsdp.coordinator.decisions import lease
from fthsdp.coordinator.decisions.quorum import decide
from fthsdp.coordinator.decisions.quorum_types import Member, Quorum, Rules
from fthsdp.coordinator.job.state import JobState
from fthsdp.core.errors import Evicted
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.quorum_cases import NOW, RULES, Case, alive, check, quorum, silent, table

LEASE = 5.0


def leased(view, left: float):
    """``view`` holding a lease that lapses ``left`` seconds after NOW."""
    return dataclasses.replace(view, lease_until=NOW + left)


def cut(rid: str, left: float, step: int = 100):
    """A member cut from the coordinator: silent past the split-brain guard, its lease ``left`` seconds to run."""
    return leased(silent(rid, since=RULES.join_timeout + 1, step=step), left)


CASES = [
    Case("every member cut, leases running: the state is not declared lost yet",
         quorum("a", "b"), table(cut("a", 2.0), cut("b", 0.5), alive("c", 0)), None,
         "member lease: waiting for a, b of quorum 7 to stop committing", committed=100),
    Case("every member cut, leases run out: the state is lost",
         quorum("a", "b"), table(cut("a", -0.1), cut("b", -1.0), alive("c", 0)), None,
         "no live replica holds it", committed=100, lost=100),
    Case("a member whose agent reported it failed holds no lease (released): no wait for it",
         quorum("a", "b"), table(cut("a", -1), alive("b", failed_at=NOW - 0.5), alive("c", 0)), None,
         "no live replica holds it", committed=100, lost=100),
    Case("holders outside the cut quorum wait for its leases too",
         quorum("a", "b"), table(cut("a", 3.0), cut("b", 3.0), alive("c", 100)), None,
         "member lease: waiting for a, b of quorum 7 to stop committing (cut from the coordinator, they may "
         "train on until their leases run out) before a quorum without them", committed=100),
    Case("holders outside the cut quorum form one once the leases ran out",
         quorum("a", "b"), table(cut("a", -0.1), cut("b", -0.2), alive("c", 100)), ("c",),
         "members leaving: a (heartbeat timeout), b (heartbeat timeout); admitting c", committed=100),
    Case("one member carries on: the others' leases are no reason to wait",
         quorum("a", "b", "c"), table(leased(silent("a", since=0.1), 4.0), alive("b"), alive("c")), ("b", "c"),
         "members leaving: a (heartbeat timeout)", committed=100),
    Case("a fresh job (nothing committed) waits too: a cut quorum would train its own steps 1, 2, ...",
         quorum("a"), table(cut("a", 1.0, step=3), alive("b", 0)), None,
         "member lease: waiting for a of quorum 7", committed=0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_decision_waits_out_the_leases(case):
    check(case)


def test_the_decision_names_the_leased_members_and_its_reason_does_not_count_down():
    """The reason is logged each time it changes (fthsdp/coordinator/engine/decision_loop.py): one line for the wait."""
    prev = quorum("a", "b")
    views = table(cut("a", 2.0), cut("b", 2.0), alive("c", 0))
    first = decide(prev, views, NOW, RULES, committed_step=100)
    later = decide(prev, views, NOW + 1.0, RULES, committed_step=100)
    assert first.leased == ("a", "b") and first.members is None
    assert first.reason == later.reason


# ----- the coordinator's grants -----------------------------------------------------------


def member_job(*ids: str, lease_s: float = LEASE) -> JobState:
    state = JobState("job", Rules(member_lease=lease_s, heartbeat_timeout=5.0))
    sessions = {i: state.register(i, f"{i}:1", 1, 0, 0, 10.0, 1, agent_ids=(f"agent-of-{i}",)) for i in ids}
    state.set_quorum(Quorum(1, tuple(Member(i, f"{i}:1", 1, 0, 1) for i in ids)), 2)
    state.sessions = sessions  # type: ignore[attr-defined]  # the tests' handle on each session
    return state


def beat(state: JobState, rid: str, now: float, seq: int = 7) -> pb.HeartbeatResponse:
    return state.heartbeat(rid, state.sessions[rid], 0, False, "", 0, now, lease_seq=seq)  # type: ignore[attr-defined]


def test_an_answer_grants_a_member_its_lease_and_the_coordinator_counts_it_longer():
    state = member_job("a")
    response = beat(state, "a", 20.0, seq=41)
    assert response.lease_seq == 41 and response.lease_s == LEASE
    assert state.replicas["a"].standing.lease_until == pytest.approx(lease.lapses_at(20.0, LEASE))
    assert state.replicas["a"].standing.lease_until > 20.0 + LEASE  # the clock-rate margin and the slack
    assert beat(state, "a", 21.0, seq=0).lease_s == 0  # a heartbeat that does not ask is not an answer


def test_no_lease_for_an_outsider_or_a_member_taken_out():
    state = member_job("a", "b")
    outsider = state.register("c", "c:1", 1, 0, 0, 10.0, 1)
    response = state.heartbeat("c", outsider, 0, False, "", 0, 20.0, lease_seq=3)
    assert response.lease_seq == 3 and response.lease_s == 0
    assert state.replicas["c"].standing.lease_until == 0
    state.replicas["b"].incarnation.hung_at = 19.0
    assert beat(state, "b", 20.0).lease_s == 0


def test_the_lease_is_longer_where_heartbeats_are_paced_further_apart():
    state = member_job("a", lease_s=1.0)
    state.set_pace(heartbeat_timeout=20.0, join_settle=0.0, heartbeat_interval=4.0)
    assert beat(state, "a", 20.0).lease_s == lease.LEASE_INTERVALS * 4.0


def test_a_failure_report_releases_the_lease_and_a_new_incarnation_keeps_the_old_ones():
    state = member_job("a", "b")
    beat(state, "a", 20.0)
    beat(state, "b", 20.0)
    assert state.agent_event("a", pb.AGENT_STATE_FAILED, 0, "rank 0 exited -9", 20.5, agent_id="agent-of-a")
    assert state.replicas["a"].standing.lease_until == 0
    until = state.replicas["b"].standing.lease_until
    state.register("b", "b:1", 1, 0, 0, 21.0, 1)  # a new process: the old one may still be out there, cut off
    assert state.replicas["b"].standing.lease_until == until


def test_a_coordinator_that_starts_presumes_every_member_holds_the_longest_lease():
    state = JobState("job", Rules(member_lease=LEASE))
    state.load(Quorum(4, (Member("a", "a:1", 1, 10, 1),)), 9, {}, now=100.0, committed_step=10)
    assert state.replicas["a"].standing.lease_until == pytest.approx(lease.presumed(100.0, LEASE))


# ----- the member's side ------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_the_lease_counts_from_the_heartbeat_sent_not_the_answer_read():
    clock = Clock()
    ml = MemberLease("r0", clock)
    assert not ml.valid()  # none granted yet
    seq = ml.sending()
    clock.now += 1.5  # the answer took 1.5 s
    ml.answered(seq, 4.0)
    assert ml.valid()
    clock.now = 50.0 + 4.0 - commit_guard(4.0) - 0.01
    assert ml.valid()
    clock.now += 0.02
    assert not ml.valid()


def test_an_answer_without_a_lease_or_to_an_older_heartbeat_renews_nothing():
    clock = Clock()
    ml = MemberLease("r0", clock)
    first, second = ml.sending(), ml.sending()
    ml.answered(second, 0.0)  # not a member
    assert not ml.valid()
    ml.answered(first, 4.0)  # answered out of order: dropped when the later one came
    assert not ml.valid()
    ml.answered(99, 4.0)  # never sent
    assert not ml.valid()


def test_a_held_commit_goes_on_once_an_answer_renews_the_lease(caplog):
    clock = Clock()
    ml = MemberLease("r0", clock)
    ml.answered(ml.sending(), 4.0)
    ml.hold(lambda: "")  # valid: returns at once
    clock.now += 10.0  # the coordinator went quiet
    done = threading.Event()

    def commit() -> None:
        ml.hold(lambda: "")
        done.set()

    t = threading.Thread(target=commit)
    with caplog.at_level("WARNING", logger="fthsdp.agent.lease"):
        t.start()
        assert not done.wait(0.3), "the commit went on without a lease"
        ml.answered(ml.sending(), 4.0)
        assert done.wait(5), "the renewed lease did not release the commit"
        t.join(5)
    text = caplog.text
    assert "member lease lapsed" in text and "member lease renewed" in text


def test_a_held_commit_is_evicted_when_a_push_takes_the_replica_out():
    clock = Clock()
    ml = MemberLease("r0", clock)
    ml.answered(ml.sending(), 4.0)
    clock.now += 10.0
    out = threading.Event()
    threading.Timer(0.2, out.set).start()
    with pytest.raises(Evicted, match="while its member lease was out, quorum 9 leaves it out"):
        ml.hold(lambda: "quorum 9 leaves it out" if out.is_set() else "")


def test_a_coordinator_that_starts_presumes_the_lease_of_the_pace_its_predecessor_ran_at():
    """At scale the heartbeats were stretched, and the leases with them: the
    new leader presumes what the recorded replicas' ranks called for."""
    import asyncio

    from fthsdp.coordinator.config import CoordinatorConfig
    from fthsdp.coordinator.engine.runtime import CoordinatorRuntime
    from fthsdp.coordinator.store.memory import MemoryStore

    async def scenario() -> float:
        store = MemoryStore()
        config = CoordinatorConfig(min_replicas=1, join_settle=0.0, heartbeat_budget=100.0)
        first = CoordinatorRuntime(config, store, "c:1", clock=lambda: 10.0, wall=lambda: 1000.0)
        first.leading = True
        for i in range(4):  # 4 groups of 100 ranks: 400 senders against a budget of 100/s
            await first.register(pb.RegisterRequest(job="default", replica_id=f"r{i}", address=f"r{i}:1",
                                                     world_size=100))
        second = CoordinatorRuntime(config, store, "c:1", clock=lambda: 50.0, wall=lambda: 1100.0)
        await second._load(second.jobs["default"])
        return second.jobs["default"].state.lease_s

    assert asyncio.run(scenario()) == lease.granted(LEASE, 4.0), "4 s between heartbeats: a 12 s lease"


def test_the_heartbeat_thread_says_once_that_the_lease_ran_out_and_once_that_it_was_renewed(caplog):
    """A member whose training thread waits in a collective (for one that
    holds) never reaches ``hold``: its heartbeat thread says so all the same."""
    clock = Clock()
    ml = MemberLease("r0", clock)
    with caplog.at_level("WARNING", logger="fthsdp.agent.lease"):
        ml.watch()  # no lease granted yet: nothing to say
        ml.answered(ml.sending(), 4.0)
        ml.watch()
        clock.now += 10.0
        stale = ml.sending()  # a heartbeat sent while cut off, answered late: its lease has run out too
        for _ in range(3):
            ml.watch()
        clock.now += 10.0
        ml.answered(stale, 4.0)
        ml.watch()
        ml.answered(ml.sending(), 4.0)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "member lease lapsed: no answer from the coordinator for 10.0s (lease 4s)" in lines[0]
    assert "member lease renewed after 16.5s without the coordinator" in lines[1]  # since it ran out (50 + 4 - 0.5)


def test_a_wait_for_leases_is_logged_once_though_a_replica_registers_during_it(caplog):
    """r2 fails and quorum 2 is r0 and r1; both go silent holding their
    leases, so the decision waits them out. r2 registers again during the
    wait: the reason's summary of the job changes ("0 alive" to "1 alive"),
    the wait does not, and it is one ``lease_wait`` event, not two."""
    import asyncio

    from tests.harness.jobs import agent_of
    from tests.harness.runtimes import joined_runtime

    def waits() -> list:
        return [r for r in caplog.records if getattr(r, "event", None) == "lease_wait"]

    async def scenario() -> tuple[list, list, str]:
        runtime, clock, sessions = await joined_runtime(3, member_lease=30.0, heartbeat_timeout=2.0,
                                                        join_timeout=1.0)
        job = runtime.jobs["default"]
        clock.t = 1.0
        for rid in sessions:  # every member asks for its lease and is granted it
            runtime.heartbeat(pb.HeartbeatRequest(job="default", replica_id=rid, session_id=sessions[rid], step=3,
                                                  lease_seq=1, ack=True))
        runtime.agent_event(pb.AgentEventRequest(job="default", replica_id="r2", agent_id=agent_of("r2"),
                                                 state=pb.AGENT_STATE_FAILED))
        clock.t = 1.5
        await runtime.evaluate(job)
        assert job.state.quorum.member_ids == ("r0", "r1"), job.state.reason
        clock.t = 6.0  # r0 and r1 silent past the heartbeat and join timeouts, their leases running
        await runtime.evaluate(job)
        first = [r.getMessage() for r in waits()]
        clock.t = 6.5
        sessions["r2"] = (await runtime.register(pb.RegisterRequest(
            job="default", replica_id="r2", address="h2:1", world_size=1,
            agent_ids=[agent_of("r2")]))).session_id
        runtime.heartbeat(pb.HeartbeatRequest(job="default", replica_id="r2", session_id=sessions["r2"]))
        for t in (7.0, 7.5, 8.0):
            clock.t = t
            await runtime.evaluate(job)
        return first, [r.getMessage() for r in waits()], job.state.reason

    with caplog.at_level("INFO", logger="fthsdp.coordinator"):
        first, after, reason = asyncio.run(scenario())
    assert len(first) == 1 and "r0, r1" in first[0], first
    assert "member lease" in reason and "1 alive" in reason, reason  # still waiting, the summary changed
    assert after == first, after
