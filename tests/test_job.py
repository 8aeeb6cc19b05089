"""JobState: sessions, incarnations, streams and states (pure logic, injected time)."""

from __future__ import annotations

import pytest

from coordinator.errors import NotFound, StaleSession
from coordinator.job import JobState
from coordinator.quorum import Rules
from protos.fthsdp.v1 import coordinator_pb2 as pb

RULES = Rules(min_replicas=1, heartbeat_timeout=5.0, join_timeout=10.0)


def formed(job: JobState, now: float):
    decision = job.evaluate(now)
    assert decision.members is not None, decision.reason
    from coordinator.quorum import Quorum

    prev = job.quorum
    quorum = Quorum((prev.id if prev else 0) + 1, decision.members)
    job.apply(decision, quorum, revision=quorum.id)
    return quorum


def test_sessions_replace_each_other():
    job = JobState("j", RULES)
    old = job.register("r0", "h:1", 1, 0, 0, now=0.0)
    new = job.register("r0", "h:1", 1, 0, 0, now=1.0)
    with pytest.raises(StaleSession):
        job.heartbeat("r0", old, 1, False, "", 0, now=1.5)
    assert job.heartbeat("r0", new, 1, False, "", 0, now=1.5).quorum_id == 0
    with pytest.raises(NotFound):
        job.heartbeat("ghost", new, 1, False, "", 0, now=1.5)


def test_member_reregistering_in_its_quorum_keeps_its_place_but_a_restart_does_not():
    job = JobState("j", RULES)
    for rid in ("a", "b"):
        job.register(rid, f"{rid}:1", 1, 0, 0, now=0.0)
    q = formed(job, 0.1)
    # after a coordinator restart the member says it still trains in q
    job.register("a", "a:1", 1, 50, q.id, now=1.0)
    assert job.evaluate(1.1).members is None
    # a new process of b says it trains in nothing: it lost its state
    job.register("b", "b:1", 1, 0, 0, now=2.0)
    assert job.replica_state(job.replicas["b"], 2.0) != pb.REPLICA_STATE_HEALTHY
    decision = job.evaluate(2.1)
    assert [m.replica_id for m in decision.members] == ["a"] and "b (restarted)" in decision.reason


def test_stream_loss_counts_only_for_the_current_session():
    job = JobState("j", RULES)
    s1 = job.register("a", "a:1", 1, 0, 0, now=0.0)
    job.watch_opened("a", s1)
    s2 = job.register("a", "a:1", 1, 0, 0, now=1.0)
    job.watch_closed("a", s1, now=1.5)  # the old session's stream ending
    assert job.replicas["a"].disconnected_at is None
    job.watch_opened("a", s2)
    job.watch_closed("a", s2, now=2.0)
    assert job.replicas["a"].disconnected_at == 2.0
    assert job.replica_state(job.replicas["a"], 2.0) == pb.REPLICA_STATE_FAILED


def test_leave_and_states():
    job = JobState("j", RULES)
    sa = job.register("a", "a:1", 1, 0, 0, now=0.0)
    sb = job.register("b", "b:1", 1, 0, 0, now=0.0)
    formed(job, 0.1)
    rec, _ = job.admin_record("b", drain=True)
    job.apply_record(rec, 7)
    assert job.replica_state(job.replicas["b"], 0.2) == pb.REPLICA_STATE_DRAINING
    assert job.leave("b", sb, failed=False, now=0.3) is True and "b" not in job.replicas
    assert job.leave("a", sa, failed=True, now=0.4) is False
    assert job.replica_state(job.replicas["a"], 0.5) == pb.REPLICA_STATE_FAILED
    with pytest.raises(NotFound):
        job.admin_record("zz", cordoned=True)


def test_load_presumes_known_replicas_alive_for_one_timeout():
    from coordinator.quorum import Member, Quorum

    job = JobState("j", RULES)
    q = Quorum(9, (Member("a", "a:1", 1, 40, 3), Member("b", "b:1", 1, 40, 5)), step=40)
    job.load(q, 11, {}, now=100.0)
    assert job.evaluate(104.0).members is None  # within the grace: unchanged
    decision = job.evaluate(106.0)  # nobody came back; 2 of 2 silent -> guard waits
    assert decision.members is None and "split-brain guard" in decision.reason
    late = job.evaluate(116.0)  # past join_timeout: shrinking would leave nobody
    assert late.members is None and "0 healthy replicas, need min_replicas 1" in late.reason


def test_agent_failure_report_fails_the_replica_at_once():
    job = JobState("j", RULES)
    for rid in ("a", "b"):
        job.register(rid, f"{rid}:1", 1, 0, 0, now=0.0)
    formed(job, 0.1)
    assert job.agent_event("b", pb.AGENT_STATE_RUNNING, 0, "", now=0.2) is False
    assert job.agent_event("b", pb.AGENT_STATE_FAILED, 0, "rank 1 exited with -9", now=0.3) is True
    decision = job.evaluate(0.31)
    assert [m.replica_id for m in decision.members] == ["a"] and "b (reported failed)" in decision.reason
    status = {r.replica_id: r for r in job.replica_statuses(0.4)}
    assert status["b"].agent_state == pb.AGENT_STATE_FAILED and status["b"].agent_detail == "rank 1 exited with -9"
    # a second report for the same dead session changes nothing
    assert job.agent_event("b", pb.AGENT_STATE_RESTARTING, 1, "", now=0.5) is False


def test_a_silent_rank_makes_the_whole_replica_silent():
    job = JobState("j", RULES)
    s = job.register("a", "a:1", 2, 0, 0, now=0.0)
    job.heartbeat("a", s, 1, False, "", 0, now=4.0)
    job.heartbeat("a", "", 0, False, "", 0, now=1.0, shard_rank=1)  # rank 1 last heard of at 1.0
    assert job.replica_state(job.replicas["a"], 5.5) != pb.REPLICA_STATE_FAILED
    assert job.replica_state(job.replicas["a"], 6.5) == pb.REPLICA_STATE_FAILED  # 1.0 + 5 s timeout
    job.heartbeat("a", s, 1, False, "", 0, now=6.6)
    job.heartbeat("a", "", 0, False, "", 0, now=6.6, shard_rank=1)
    assert job.replica_state(job.replicas["a"], 6.7) != pb.REPLICA_STATE_FAILED
    with pytest.raises(Exception, match="outside replica"):
        job.heartbeat("a", "", 0, False, "", 0, now=5.8, shard_rank=2)


def test_a_settled_quorum_is_decided_again_only_when_something_changes():
    """At 10,000 replicas a decision costs tens of milliseconds, so the
    coordinator skips it while nothing it reads changed and no heartbeat ran out."""
    job = JobState("j", RULES)
    sessions = {rid: job.register(rid, f"{rid}:1", 1, 0, 0, now=0.0) for rid in ("a", "b")}
    formed(job, 0.1)
    assert job.needs_decision(0.2)  # a new quorum is always looked at again
    assert job.evaluate(0.2).settled and not job.needs_decision(0.3)
    job.heartbeat("a", sessions["a"], 7, False, "", 0, now=1.0)  # a member's progress: nothing to decide
    assert not job.needs_decision(1.0)
    assert job.needs_decision(5.0)  # b's heartbeat timeout ran out (last heard at 0.0)
    job.heartbeat("b", sessions["b"], 7, False, "", 0, now=1.0)
    assert not job.needs_decision(5.0)
    job.register("c", "c:1", 1, 7, 0, now=2.0)  # a newcomer, up to date
    assert job.needs_decision(2.0)
    decision = job.evaluate(2.0)
    assert decision.members is not None and not decision.settled
    formed(job, 2.1)
    job.evaluate(2.2)
    job.watch_closed("b", sessions["b"], now=2.5)  # only counts with no stream open
    assert job.needs_decision(2.5)


def test_replicas_loaded_after_a_restart_time_out_without_a_session():
    """A coordinator that restarted presumes the stored replicas alive for one
    heartbeat timeout; one that never comes back must still be dropped."""
    from coordinator.quorum import Member, Quorum

    job = JobState("j", RULES)
    quorum = Quorum(4, (Member("a", "a:1", 1, 10, 1), Member("b", "b:1", 1, 10, 1)))
    job.load(quorum, 4, {}, now=100.0)
    assert job.evaluate(100.1).settled
    session = job.register("a", "a:1", 1, 10, 4, now=101.0)
    job.evaluate(101.1)
    job.heartbeat("a", session, 11, False, "", 0, now=104.0)
    assert not job.needs_decision(104.9)
    assert job.needs_decision(105.0)  # b, loaded at 100 and never heard from, timed out
    decision = job.evaluate(105.0)
    assert [m.replica_id for m in decision.members] == ["a"] and "b (heartbeat timeout)" in decision.reason
