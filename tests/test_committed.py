"""The committed step: how JobState tracks it, how it is stored (write
policy, load, conflicts) and how a lost state is given up. Pure logic on the
memory store, with injected times; the end-to-end run against etcd is in
tests/test_state_lost.py."""

from __future__ import annotations

import asyncio
import logging

import pytest

from fthsdp.coordinator.decisions.quorum_types import Member, Quorum, Rules
from fthsdp.coordinator.engine import committed
from fthsdp.coordinator.job.state import JobState
from fthsdp.coordinator.ledger.keys import JobKeys
from fthsdp.coordinator.ledger.writer import LedgerWriter
from fthsdp.coordinator.store import MemoryStore
from fthsdp.core.errors import LostOwnership, StateNotLost, StoreUnavailable
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.jobs import formed, registered

RULES = Rules(min_replicas=1, heartbeat_timeout=5.0, join_timeout=0.0)
KEYS = JobKeys("/t", "j")


def on(store: MemoryStore) -> committed.CommittedRecord:
    """The committed record of a coordinator that loaded the job's ledger from ``store``."""
    ledger = LedgerWriter(store, KEYS)
    ledger.load()
    return committed.CommittedRecord(ledger)


def stored_at(step: int, quorum_id: int, written_at: float) -> committed.CommittedRecord:
    """A record that stored ``step`` in quorum ``quorum_id`` at ``written_at``."""
    record = on(MemoryStore())
    assert asyncio.run(record.write(step, quorum_id, 0)) is None
    record.written_at = written_at
    return record


def trained(job: JobState, step: int, now: float) -> dict[str, str]:
    """Replicas a and b in a quorum, having reported ``step``; their sessions."""
    sessions = {rid: registered(job, rid, f"{rid}:1", 1, 0, 0, now=now) for rid in ("a", "b")}
    formed(job, now + 0.1)
    for rid, session in sessions.items():
        job.heartbeat(rid, session, step, False, "", 0, now=now + 0.2)
    return sessions


def lose_everyone(job: JobState, sessions: dict[str, str], now: float) -> None:
    """Every member's process dies and a fresh one registers at step 0."""
    for rid, session in sessions.items():
        job.leave(rid, session, failed=True, now=now)
        registered(job, rid, f"{rid}:1", 1, 0, 0, now=now + 0.1)


def lost_job(step: int = 40) -> JobState:
    job = JobState("j", RULES)
    lose_everyone(job, trained(job, step, 0.0), 1.0)
    decision = job.evaluate(2.0)
    job.apply(decision, None, job.quorum_revision)
    assert job.state_lost_step == step, decision.reason
    return job


# ----- JobState ------------------------------------------------------------------------


def test_only_members_raise_the_committed_step():
    job = JobState("j", RULES)
    sessions = trained(job, 40, 0.0)
    assert job.committed_step == 40
    joiner = registered(job, "x", "x:1", 1, 0, 0, now=1.0)
    job.heartbeat("x", joiner, 90, False, "", 0, now=1.1)  # not a member: its step is not the job's
    assert job.committed_step == 40
    # A member that restarted (registers in no quorum) lost its state: its step does not count either.
    job.leave("a", sessions["a"], failed=True, now=2.0)
    restarted = registered(job, "a", "a:1", 1, 0, 0, now=2.1)
    job.heartbeat("a", restarted, 95, False, "", 0, now=2.2)
    assert job.committed_step == 40
    job.heartbeat("b", sessions["b"], 41, False, "", 0, now=2.3)
    assert job.committed_step == 41


def test_a_member_back_after_a_failover_reports_its_step_by_registering():
    job = JobState("j", RULES)
    q = Quorum(3, (Member("a", "a:1", 1, 10, 2),), step=10)
    job.load(q, 5, {}, now=0.0, committed_step=30)
    assert job.committed_step == 30
    job.register("a", "a:1", 1, 35, 3, now=1.0)  # still trains in quorum 3
    assert job.committed_step == 35


def test_every_holder_lost_then_a_give_up_starts_over():
    job = lost_job(40)
    assert job.state_lost == "no live replica holds it; a at step 0, b at step 0"
    assert job.reason.startswith("state lost at step 40: ")
    assert job.watch_event("a", "me").state_lost_step == 40
    assert job.lost_step_now(3.0) == 40
    job.give_up_state(0)
    assert (job.committed_step, job.state_lost_step, job.watch_event("a", "me").state_lost_step) == (0, 0, 0)
    decision = job.evaluate(3.0)
    assert [m.replica_id for m in decision.members] == ["a", "b"], decision.reason


# ----- the stored record ---------------------------------------------------------------


def test_write_policy_every_quorum_change_else_once_a_second_while_it_grows():
    record = stored_at(40, 3, written_at=10.0)
    assert not record.due(45, 3, 10.5)  # within the second
    assert record.due(45, 3, 11.0)
    assert not record.due(40, 3, 99.0)  # a stalled job writes nothing
    assert record.due(40, 4, 10.1)  # a new quorum, at once
    record.retry_at = 15.0  # a write failed: the store is likely down
    assert not record.due(40, 4, 14.9) and record.due(40, 4, 15.0)


def test_a_failed_write_is_retried_later_and_costs_nothing_meanwhile():
    class Down(MemoryStore):
        calls, down = 0, True

        def transact(self, *args, **kwargs):
            if not Down.down:
                return super().transact(*args, **kwargs)
            Down.calls += 1
            raise StoreUnavailable("etcd at h:1 is unreachable")

    job, record = JobState("j", RULES), on(Down())
    trained(job, 40, 0.0)
    for t in range(50):  # 5 s of ticks
        asyncio.run(committed.sync(record, job, now=1.0 + t / 10, unix_ms=0))
    assert Down.calls == 1 and record.stored == 0
    Down.down = False
    asyncio.run(committed.sync(record, job, now=1.0 + committed.RETRY_AFTER, unix_ms=0))
    assert record.stored == 40


def test_sync_writes_at_most_once_a_second_and_load_reads_it_back():
    store, job = MemoryStore(), JobState("j", RULES)
    record = on(store)
    sessions = trained(job, 40, 0.0)
    asyncio.run(committed.sync(record, job, now=1.0, unix_ms=1000))  # the quorum: at once
    writes = [store.get(KEYS.committed).revision]
    for t in range(1, 20):  # 2 s of heartbeats, each a step further
        job.heartbeat("a", sessions["a"], 40 + t, False, "", 0, now=1.0 + t / 10)
        asyncio.run(committed.sync(record, job, now=1.0 + t / 10, unix_ms=1000 + t * 100))
        writes.append(store.get(KEYS.committed).revision)
    assert len(set(writes)) == 2  # the quorum change, then one more a second later
    assert record.stored == 50 and job.committed_step == 59  # a lower bound, a second behind
    loaded = on(store)
    assert loaded.load(job.quorum) == 50 and loaded.revision == record.revision


def test_a_quorum_stored_after_the_record_vouches_for_its_step():
    store = MemoryStore()
    record = on(store)
    assert asyncio.run(record.write(30, 4, 0)) is None
    newer, named = Quorum(5, (), step=38), Quorum(4, (), step=38)
    assert on(store).load(newer) == 38  # a crash between the two writes
    assert on(store).load(named) == 30
    assert on(MemoryStore()).load(newer) == 38  # stored by an older version


def test_a_conflicting_writer_keeps_the_higher_step_and_its_give_up_wins():
    store, job = MemoryStore(), JobState("j", RULES)
    ours, theirs = on(store), on(store)
    trained(job, 40, 0.0)
    assert asyncio.run(theirs.write(60, 1, 0)) is None
    asyncio.run(committed.sync(ours, job, now=1.0, unix_ms=0))
    assert job.committed_step == 60 and ours.revision == theirs.revision  # adopted, retried next turn
    assert asyncio.run(theirs.write(0, 1, 0, pb.GiveUp(step=60, requested_by="op"))) is None
    job.committed_step = 70
    asyncio.run(committed.sync(ours, job, now=3.0, unix_ms=0))
    assert job.committed_step == 0 and ours.last_give_up.requested_by == "op"


# ----- give-up -------------------------------------------------------------------------


def give_up(record, job, step, **kw):
    request = pb.GiveUpStateRequest(job="j", step=step, requested_by="alice@host")
    return asyncio.run(committed.give_up(record, job, request, "ipv4:10.0.0.1:5000", "coord:1", 2,
                                         now=kw.get("now", 3.0), wall=lambda: 1700000000.0))


def test_give_up_is_refused_unless_lost_at_exactly_that_step():
    store = MemoryStore()
    record = on(store)
    healthy = JobState("j", RULES)
    trained(healthy, 40, 0.0)
    with pytest.raises(StateNotLost, match="has not lost its state \\(committed step 40\\)"):
        give_up(record, healthy, 40)
    job = lost_job(40)
    with pytest.raises(StateNotLost, match="lost its state at step 40, not 39"):
        give_up(record, job, 39)
    assert store.get(KEYS.committed) is None and job.committed_step == 40  # nothing written, nothing reset


def test_give_up_is_stored_before_it_is_applied_and_logged_once(caplog):
    store = MemoryStore()
    record = on(store)
    job = lost_job(40)
    with caplog.at_level(logging.WARNING, "fthsdp.coordinator"):
        given = give_up(record, job, 40)
    assert (given.step, given.requested_by, given.peer, given.coordinator, given.epoch) == (
        40, "alice@host", "ipv4:10.0.0.1:5000", "coord:1", 2)
    stored = pb.CommittedStep.FromString(store.get(KEYS.committed).value)
    assert stored.step == 0 and stored.last_give_up == given
    assert job.committed_step == 0 and job.state_lost_step == 0
    [line] = [r for r in caplog.records if "given up" in r.getMessage()]
    assert "state loss at step 40 ended: given up by alice@host" in line.getMessage()
    assert committed.report_transition(job, 0) is False  # the give-up's line ended it; no second one


def test_give_up_refused_when_another_coordinator_wrote_the_record():
    store = MemoryStore()
    record = on(store)
    job = lost_job(40)
    assert asyncio.run(on(store).write(40, 1, 0)) is None  # someone else's write
    with pytest.raises(LostOwnership, match="try again"):
        give_up(record, job, 40)
    assert job.committed_step == 40 and job.state_lost_step == 40


def test_a_loss_is_logged_when_it_begins_and_when_it_ends(caplog):
    job = lost_job(40)
    with caplog.at_level(logging.WARNING, "fthsdp.coordinator"):
        assert committed.report_transition(job, 0) is True
        assert committed.report_transition(job, 40) is False  # the same loss, decided again
        job.state_lost_step = 0
        assert committed.report_transition(job, 40) is True
    began, ended = caplog.records
    assert began.levelno == logging.ERROR and began.getMessage().startswith("job j: STATE LOST at step 40: ")
    assert "`fthsdp give-up-state --job j --step 40` starts over" in began.getMessage()
    assert began.event == "state_lost" and ended.event == "state_loss_ended"
    assert "ended: a replica holding it is back" in ended.getMessage()


def test_a_restarted_member_waiting_for_a_lost_state_is_given_no_place():
    """The stored quorum lists it until a new one is formed, which a lost
    state puts off: it must not take its old place (and train from step 0)."""
    job = lost_job(40)
    assert job.is_member("a") and not job.watch_event("a", "me").HasField("place")


def test_after_a_coordinator_restart_a_place_waits_for_the_incarnation_to_register():
    """A listed replica's watcher may be a fresh process that has not
    registered yet: it gets the place once it says it trains in the quorum."""
    job = JobState("j", RULES)
    job.load(Quorum(3, (Member("a", "a:1", 1, 40, 2),), step=40), 5, {}, now=0.0, committed_step=40)
    assert not job.watch_event("a", "me").HasField("place")
    job.register("a", "a:1", 1, 40, 3, now=1.0)
    assert job.watch_event("a", "me").place.rank == 0


def test_members_that_all_leave_on_purpose_end_the_state_rather_than_lose_it(caplog):
    """A finished (or wholly drained) job is not a lost one: the committed
    step starts over, is stored so, and the next replicas are admitted."""
    store = MemoryStore()
    record = on(store)
    job = JobState("j", RULES)
    sessions = trained(job, 40, 0.0)
    asyncio.run(committed.sync(record, job, now=0.5, unix_ms=0))
    for rid, session in sessions.items():
        job.leave(rid, session, failed=False, now=1.0)  # "finished"
    decision = job.evaluate(1.1)
    assert decision.state_ended and not decision.state_lost_step, decision.reason
    job.apply(decision, None, job.quorum_revision)
    with caplog.at_level(logging.INFO, "fthsdp.coordinator"):
        assert committed.report_transition(job, 0, ended=40) is False
    assert "every member left at step 40 (finished or drained)" in caplog.text
    assert job.committed_step == 0
    asyncio.run(committed.sync(record, job, now=2.0, unix_ms=0))
    assert pb.CommittedStep.FromString(store.get(KEYS.committed).value).step == 0
    registered(job, "c", "c:1", 1, 0, 0, now=3.0)
    assert [m.replica_id for m in job.evaluate(3.1).members] == ["c"]


def test_a_last_member_that_leaves_saying_it_failed_loses_the_state_rather_than_ends_it():
    """A training script that raised leaves with reason "failed: ...": that is
    no finished job, and the next replicas must not start over."""
    job = JobState("j", RULES)
    sessions = trained(job, 40, 0.0)
    job.leave("a", sessions["a"], failed=False, now=1.0, reason="finished")
    assert job.leave("b", sessions["b"], failed=False, now=1.0, reason="failed: StateNotHeld(...)") is False
    registered(job, "c", "c:1", 1, 0, 0, now=1.5)
    decision = job.evaluate(2.0)
    assert decision.state_lost_step == 40 and not decision.state_ended, decision.reason
    assert decision.reason.startswith("state lost at step 40: no live replica holds it; c at step 0.")
    assert job.replica_state(job.replicas["b"], 2.0) == pb.REPLICA_STATE_FAILED  # listed as failed, not forgotten
