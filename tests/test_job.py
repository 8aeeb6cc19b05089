"""JobState: sessions, incarnations, streams and states (pure logic, injected time)."""

from __future__ import annotations

import pytest

from fthsdp.coordinator.decisions.quorum_types import Rules
from fthsdp.coordinator.job.state import JobState
from fthsdp.core.errors import NotFound, StaleSession
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.jobs import agent_of, formed, registered

RULES = Rules(min_replicas=1, heartbeat_timeout=5.0, join_timeout=10.0)






B = agent_of("b")
"""b's node agent (its failure reports count for b)."""


def test_sessions_replace_each_other():
    job = JobState("j", RULES)
    old = registered(job, "r0", "h:1", 1, 0, 0, now=0.0)
    new = registered(job, "r0", "h:1", 1, 0, 0, now=1.0)
    with pytest.raises(StaleSession):
        job.heartbeat("r0", old, 1, False, "", 0, now=1.5)
    assert job.heartbeat("r0", new, 1, False, "", 0, now=1.5).quorum_id == 0
    with pytest.raises(NotFound):
        job.heartbeat("ghost", new, 1, False, "", 0, now=1.5)


def test_member_reregistering_in_its_quorum_keeps_its_place_but_a_restart_does_not():
    job = JobState("j", RULES)
    for rid in ("a", "b"):
        registered(job, rid, f"{rid}:1", 1, 0, 0, now=0.0)
    q = formed(job, 0.1)
    # after a coordinator restart the member says it still trains in q
    registered(job, "a", "a:1", 1, 50, q.id, now=1.0)
    assert job.evaluate(1.1).members is None
    # a new process of b says it trains in nothing: it lost its state
    registered(job, "b", "b:1", 1, 0, 0, now=2.0)
    assert job.replica_state(job.replicas["b"], 2.0) != pb.REPLICA_STATE_HEALTHY
    decision = job.evaluate(2.1)
    assert [m.replica_id for m in decision.members] == ["a"] and "b (restarted)" in decision.reason


def test_stream_loss_counts_only_for_the_current_session():
    job = JobState("j", RULES)
    s1 = registered(job, "a", "a:1", 1, 0, 0, now=0.0)
    job.watch_opened("a", s1)
    s2 = registered(job, "a", "a:1", 1, 0, 0, now=1.0)
    job.watch_closed("a", s1, now=1.5)  # the old session's stream ending
    assert job.replicas["a"].incarnation.disconnected_at is None
    job.watch_opened("a", s2)
    job.watch_closed("a", s2, now=2.0)
    assert job.replicas["a"].incarnation.disconnected_at == 2.0
    assert job.replica_state(job.replicas["a"], 2.0) == pb.REPLICA_STATE_FAILED


def test_leave_and_states():
    job = JobState("j", RULES)
    sa = registered(job, "a", "a:1", 1, 0, 0, now=0.0)
    sb = registered(job, "b", "b:1", 1, 0, 0, now=0.0)
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
    from fthsdp.coordinator.decisions.quorum_types import Member, Quorum

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
        registered(job, rid, f"{rid}:1", 1, 0, 0, now=0.0)
    formed(job, 0.1)
    assert job.agent_event("b", pb.AGENT_STATE_RUNNING, 0, "", now=0.2, agent_id=B) is False
    assert job.agent_event("b", pb.AGENT_STATE_FAILED, 0, "rank 1 exited with -9", now=0.3, agent_id=B) is True
    decision = job.evaluate(0.31)
    assert [m.replica_id for m in decision.members] == ["a"] and "b (reported failed)" in decision.reason
    status = {r.replica_id: r for r in job.replica_statuses(0.4)}
    assert status["b"].agent_state == pb.AGENT_STATE_FAILED and status["b"].agent_detail == "rank 1 exited with -9"
    # a second report for the same dead session changes nothing
    assert job.agent_event("b", pb.AGENT_STATE_RESTARTING, 1, "", now=0.5, agent_id=B) is False


def test_a_failure_report_of_an_incarnation_already_replaced_fails_nothing():
    # The agent sends a FAILED again after a coordinator outage; meanwhile its
    # restarted incarnation (restart count 1) registered: it stays.
    job = JobState("j", RULES)
    for rid in ("a", "b"):
        registered(job, rid, f"{rid}:1", 1, 0, 0, now=0.0)
    formed(job, 0.1)
    registered(job, "b", "b:1", 1, 0, 0, now=0.2, restart_count=1)
    assert job.agent_event("b", pb.AGENT_STATE_FAILED, 0, "rank 0 exited with -9", now=0.3, agent_id=B) is False
    assert job.agent_event("b", pb.AGENT_STATE_FAILED, 1, "rank 0 exited with -9", now=0.4, agent_id=B) is True


def test_a_failed_replica_shows_no_phase_it_was_in():
    """`fthsdp status` showed a killed replica's last phase ("all-reduce 2.4s")
    next to "failed" while it restarted. (A hung one still shows where it
    hangs: tests/test_cli.py.)"""
    job = JobState("j", RULES)
    sessions = {rid: registered(job, rid, f"{rid}:1", 1, 0, 0, now=0.0) for rid in ("a", "b")}
    formed(job, 0.1)
    for rid in ("a", "b"):
        job.heartbeat(rid, sessions[rid], 3, False, "", 0, now=0.2,
                      progress=pb.Progress(phase=pb.PHASE_ALLREDUCE, phase_age_s=0.1, step=3))
    assert {r.replica_id: r.phase for r in job.replica_statuses(0.3)} == {"a": pb.PHASE_ALLREDUCE,
                                                                          "b": pb.PHASE_ALLREDUCE}
    job.agent_event("b", pb.AGENT_STATE_FAILED, 0, "local rank 0 exited with signal SIGKILL", now=0.4, agent_id=B)
    status = {r.replica_id: r for r in job.replica_statuses(0.5)}
    assert status["b"].state == pb.REPLICA_STATE_FAILED and status["b"].phase == pb.PHASE_UNSPECIFIED
    assert status["a"].phase == pb.PHASE_ALLREDUCE
    job.watch_closed("a", sessions["a"], now=0.6)  # its stream lost: the process is gone too
    assert {r.replica_id: r.phase for r in job.replica_statuses(0.7)}["a"] == pb.PHASE_UNSPECIFIED


def test_a_silent_rank_makes_the_whole_replica_silent():
    job = JobState("j", RULES)
    s = registered(job, "a", "a:1", 2, 0, 0, now=0.0)
    job.heartbeat("a", s, 1, False, "", 0, now=4.0)
    job.heartbeat("a", "", 0, False, "", 0, now=1.0, shard_rank=1)  # rank 1 last heard of at 1.0
    assert job.replica_state(job.replicas["a"], 5.5) != pb.REPLICA_STATE_FAILED
    assert job.replica_state(job.replicas["a"], 6.5) == pb.REPLICA_STATE_FAILED  # 1.0 + 5 s timeout
    job.heartbeat("a", s, 1, False, "", 0, now=6.6)
    job.heartbeat("a", "", 0, False, "", 0, now=6.6, shard_rank=1)
    assert job.replica_state(job.replicas["a"], 6.7) != pb.REPLICA_STATE_FAILED
    with pytest.raises(Exception, match="outside replica"):
        job.heartbeat("a", "", 0, False, "", 0, now=5.8, shard_rank=2)


def test_a_rank_that_left_with_its_group_is_no_longer_awaited():
    """Rank 1 says it left (its group finishes cleanly) while rank 0 still
    writes its checkpoint share: the replica lives on rank 0's heartbeats
    alone, and a late ping of rank 1 does not bring its clock back."""
    job = JobState("j", RULES)
    s = registered(job, "a", "a:1", 2, 0, 0, now=0.0)
    job.heartbeat("a", "", 0, False, "", 0, now=1.0, shard_rank=1, left=True)
    job.heartbeat("a", "", 0, False, "", 0, now=1.1, shard_rank=1)  # a ping that was already on its way
    for t in (4.0, 8.0, 12.0):
        job.heartbeat("a", s, 6, False, "", 0, now=t)
    assert job.replica_state(job.replicas["a"], 12.5) != pb.REPLICA_STATE_FAILED  # rank 1 silent since 1.1
    assert job.replica_state(job.replicas["a"], 17.5) == pb.REPLICA_STATE_FAILED  # rank 0's own timeout
    s = registered(job, "a", "a:1", 2, 6, 0, now=20.0)  # a new incarnation: every rank is awaited again
    job.heartbeat("a", s, 6, False, "", 0, now=24.0)
    assert job.replica_state(job.replicas["a"], 25.5) == pb.REPLICA_STATE_FAILED  # rank 1 silent since 20.0


def test_a_settled_quorum_is_decided_again_only_when_something_changes():
    """At 10,000 replicas a decision costs tens of milliseconds, so the
    coordinator skips it while nothing it reads changed and no heartbeat ran out."""
    job = JobState("j", RULES)
    sessions = {rid: registered(job, rid, f"{rid}:1", 1, 0, 0, now=0.0) for rid in ("a", "b")}
    formed(job, 0.1)
    assert job.needs_decision(0.2)  # a new quorum is always looked at again
    assert job.evaluate(0.2).settled and not job.needs_decision(0.3)
    job.heartbeat("a", sessions["a"], 7, False, "", 0, now=1.0)  # a member's progress: nothing to decide
    assert not job.needs_decision(1.0)
    assert job.needs_decision(5.0)  # b's heartbeat timeout ran out (last heard at 0.0)
    job.heartbeat("b", sessions["b"], 7, False, "", 0, now=1.0)
    assert not job.needs_decision(5.0)
    registered(job, "c", "c:1", 1, 7, 0, now=2.0)  # a newcomer, up to date
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
    from fthsdp.coordinator.decisions.quorum_types import Member, Quorum

    job = JobState("j", RULES)
    quorum = Quorum(4, (Member("a", "a:1", 1, 10, 1), Member("b", "b:1", 1, 10, 1)))
    job.load(quorum, 4, {}, now=100.0)
    assert job.evaluate(100.1).settled
    session = registered(job, "a", "a:1", 1, 10, 4, now=101.0)
    job.evaluate(101.1)
    job.heartbeat("a", session, 11, False, "", 0, now=104.0)
    assert not job.needs_decision(104.9)
    assert job.needs_decision(105.0)  # b, loaded at 100 and never heard from, timed out
    decision = job.evaluate(105.0)
    assert [m.replica_id for m in decision.members] == ["a"] and "b (heartbeat timeout)" in decision.reason


def test_the_timeout_scan_runs_only_once_the_earliest_expiry_is_due():
    """needs_decision skips the scan of every replica until the earliest
    heartbeat expiry it found, and still sees every timeout when it runs out."""
    job = JobState("j", RULES)
    sessions = {rid: registered(job, rid, f"{rid}:1", 1, 0, 0, now=0.0) for rid in ("a", "b")}
    formed(job, 0.1)
    assert job.evaluate(0.15).settled
    assert not job.needs_decision(0.2)  # earliest expiry at 5.0
    job.heartbeat("a", sessions["a"], 1, False, "", 0, now=3.0)
    assert not job.needs_decision(4.9)
    assert job.needs_decision(5.0)  # b's timeout ran out (a's runs out at 8.0)
    assert [m.replica_id for m in formed(job, 5.0).members] == ["a"]
    assert job.evaluate(5.05).settled and not job.needs_decision(5.1)
    # A shorter timeout (the runtime marks the job dirty too): the bound found
    # under the old one (8.0) no longer holds; a's expiry is now 5.5.
    job.rules = Rules(min_replicas=1, heartbeat_timeout=2.5, join_timeout=10.0)
    assert job.needs_decision(5.6)


def test_joiners_are_decided_on_at_the_poll_time_a_lost_member_at_once():
    """A joiner's heartbeats wait for the poll time (the runtime sets it from a
    decision's cost); a member's stream closing does not."""
    job = JobState("j", RULES)
    sessions = {rid: registered(job, rid, f"{rid}:1", 1, 0, 0, now=0.0) for rid in ("a", "b")}
    formed(job, 0.1)
    assert job.evaluate(0.15).settled
    job.schedule.poll_after(1.0)
    registered(job, "c", "c:1", 1, 0, 0, now=0.2)  # a newcomer, heartbeating
    assert not job.needs_decision(0.3)
    assert job.needs_decision(1.0)
    assert not job.evaluate(1.0).settled  # waiting for arrivals to settle...
    job.schedule.poll_after(2.0)
    assert not job.needs_decision(1.5)  # ...polled again at the poll time only
    job.watch_opened("b", sessions["b"])
    job.watch_closed("b", sessions["b"], now=1.6)
    assert job.needs_decision(1.6)  # a member lost: at once


def test_a_shorter_timeout_finds_members_that_ran_out_before_the_last_decision():
    job = JobState("j", RULES)
    sessions = {rid: registered(job, rid, f"{rid}:1", 1, 0, 0, now=0.0) for rid in ("a", "b")}
    formed(job, 0.1)
    job.heartbeat("a", sessions["a"], 1, False, "", 0, now=3.0)
    assert job.evaluate(3.5).settled and not job.needs_decision(3.6)
    job.set_pace(heartbeat_timeout=2.0, join_settle=RULES.join_settle)  # b's heartbeat at 0.0 ran out at 2.0
    assert job.needs_decision(3.6)
    assert [m.replica_id for m in formed(job, 3.6).members] == ["a"]
    assert job.evaluate(3.65).settled
    job.schedule.poll_after(10.0)
    job.set_pace(heartbeat_timeout=9.0, join_settle=RULES.join_settle)  # longer: nothing urgent
    assert not job.needs_decision(3.7) and job.needs_decision(10.0)


def test_stored_replicas_still_coming_back_keep_the_grace_of_those_not_back_yet():
    """A new leader's grace for the replicas in its store lasts while they
    keep returning: at thousands of hosts their reconnections queue longer
    than any fixed grace, and a member still in that queue is not silent."""
    from fthsdp.coordinator.decisions.quorum_types import Member, Quorum
    from fthsdp.coordinator.job.replica_entry import grant_reconnect_grace

    job = JobState("j", RULES)
    stored = Quorum(3, tuple(Member(i, f"{i}:1", 1, 10, 1) for i in ("a", "b", "c", "d")), step=10)
    job.load(stored, 1, {}, now=100.0, committed_step=10)
    grant_reconnect_grace(job.replicas, 115.0)  # the heartbeat timeout 5 s + join_timeout 10 s
    a = registered(job, "a", "a:1", 1, 10, 3, now=101.0)
    for t in (105.0, 109.0):
        job.heartbeat("a", a, 10, False, "", 0, now=t)
    b = registered(job, "b", "b:1", 1, 10, 3, now=113.0)
    assert job.replicas["b"].view().returned
    registered(job, "j", "j:1", 1, 0, 0, now=114.5)  # a fresh joiner, found in no store
    assert not job.replicas["j"].view().returned
    for rid, session in (("a", a), ("b", b)):
        job.heartbeat(rid, session, 10, False, "", 0, now=113.5)
        job.heartbeat(rid, session, 10, False, "", 0, now=117.0)
    # The grace (115) is over, but b came back at 113: c and d wait until 118.
    assert job.evaluate(117.9).members is None
    assert job.replica_state(job.replicas["c"], 117.9, job.last_return()) != pb.REPLICA_STATE_FAILED
    decision = job.evaluate(118.0)
    assert decision.members is not None and {m.replica_id for m in decision.members} == {"a", "b"}
    assert "c (not reconnected since the coordinator started)" in decision.reason
    assert job.replica_state(job.replicas["c"], 118.0, job.last_return()) == pb.REPLICA_STATE_FAILED


def test_a_member_back_after_a_takeover_has_until_the_grace_ends_for_its_other_ranks_pings():
    """Rank 0 of a group comes back on its Session before its hosts' Pings streams do (each reopens after
    its own back-off, thousands at once): its other ranks are judged silent from the grace's end, not a
    heartbeat timeout after the registration. A group registered afresh has the heartbeat timeout."""
    from fthsdp.coordinator.decisions.quorum_types import Member, Quorum
    from fthsdp.coordinator.job.replica_entry import grant_reconnect_grace

    job = JobState("j", RULES)
    stored = Quorum(3, tuple(Member(i, f"{i}:1", 1, 10, 1) for i in ("a", "b")), step=10)
    job.load(stored, 1, {}, now=100.0, committed_step=10)
    grant_reconnect_grace(job.replicas, 130.0)  # a long grace: thousands of hosts coming back
    sessions = {rid: registered(job, rid, f"{rid}:1", 4, 10, 3, now=101.0) for rid in ("a", "b")}
    fresh = registered(job, "j", "j:1", 4, 0, 0, now=101.0)
    for t in (104.0, 108.0, 112.0, 116.0, 120.0, 124.0, 128.0):
        for rid, session in (*sessions.items(), ("j", fresh)):
            job.heartbeat(rid, session, 10 if rid != "j" else 0, False, "", 0, now=t)
        if t <= 112.0:
            job.rank_pinged("b", 1, t, None)
            job.rank_pinged("b", 2, t, None)
            job.rank_pinged("b", 3, t, None)
    assert job.replicas["a"].view_heartbeat() == 125.0, "a's ranks: silent only from the grace's end"
    assert job.replicas["j"].view_heartbeat() == 101.0, "a fresh group: from its registration"
    assert job.replicas["b"].view_heartbeat() == 112.0, "ranks heard from: their own pings count"
