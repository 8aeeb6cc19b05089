"""Quorum rule 9: a restore's first quorum waits for the members whose state
was lost (fthsdp/coordinator/decisions/restore_wait.py), table-driven on an injected
clock; and the same through JobState, a restore stored and a coordinator
that starts in the middle of the wait."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from fthsdp.coordinator.decisions.quorum_types import Member, Quorum, Restoring
from fthsdp.coordinator.engine import checkpoints
from fthsdp.coordinator.engine.checkpoints import CheckpointBook
from fthsdp.coordinator.engine.committed import CommittedRecord
from fthsdp.coordinator.job.replica_entry import grant_reconnect_grace
from fthsdp.coordinator.job.state import JobState
from fthsdp.coordinator.ledger.keys import JobKeys
from fthsdp.coordinator.ledger.writer import LedgerWriter
from fthsdp.coordinator.store.memory import MemoryStore
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.jobs import agent_of
from tests.harness.quorum_cases import NOW, RULES, Case, alive, check, quorum, table

STEP = 40
"""The checkpoint restored; the members of quorum 7 were past it when their state was lost."""


def held(rid: str, since: float = 1.0, **kw):
    """A new incarnation that registered, then loaded the checkpoint in 4 s, ``since`` seconds ago."""
    kw = {"restarted": True, "registered_at": NOW - since - 4, "first_heartbeat": NOW - since - 3.8,
          "step_since": NOW - since, **kw}
    return alive(rid, STEP, **kw)


def loading(rid: str, **kw):
    """A new incarnation still loading the checkpoint (at step 0 since it registered)."""
    kw = {"restarted": True, "registered_at": NOW - 5, "first_heartbeat": NOW - 4.8, "step_since": NOW - 5, **kw}
    return alive(rid, 0, **kw)


def gone(rid: str):
    """The old incarnation, killed; nothing registered since."""
    return alive(rid, 45, failed_at=NOW - 8)


LOST = Restoring(frozenset({"a", "b", "c"}), 7)
"""The members when the state was lost: quorum 7's, which trained the last step."""


def restore_case(name, replicas, expect, reason, prev=None, **kw) -> Case:
    return Case(name, prev or quorum("a", "b", "c"), replicas, expect, reason, committed=STEP, restoring=LOST, **kw)


CASES = [
    restore_case(
        "the first to load waits for the other members of the lost quorum",
        table(held("a"), loading("b"), gone("c")), None,
        "restored the checkpoint of step 40: waiting up to join_timeout 10s for b, c "
        "(members when the state was lost; quorum 7 trained the last step) before admitting a.",
        catch_up={"b": "a"},  # computed, but JobState sends no source while it restores: each loads
    ),
    restore_case(
        "killed at once, the members were dropped one quorum at a time: all of them are waited for",
        table(held("a"), loading("b"), loading("c")), None,
        "waiting up to join_timeout 10s for b, c (members when the state was lost; "
        "quorum 7 trained the last step)",
        prev=quorum("a", qid=9), catch_up={"b": "a", "c": "a"},
    ),
    restore_case(
        "every member back with the checkpoint: one quorum of all of them",
        table(held("a", 3), held("b", 2), held("c", 0.1)), ("a", "b", "c"),
        "members leaving: a (restarted), b (restarted), c (restarted); admitting a, b, c; "
        "every member when the state was lost is back with the checkpoint of step 40.",
    ),
    restore_case(
        "a member that does not come back is left out join_timeout after the first one loaded",
        table(held("a", 10), held("b", 3), gone("c")), ("a", "b"),
        "admitting a, b; join_timeout 10s passed since the first replica loaded the checkpoint of step 40; "
        "c (a member when the state was lost; quorum 7 trained the last step) not back.",
    ),
    restore_case(
        "the timeout counts from loading the checkpoint, not from registering: a long load is no reason to go alone",
        table(held("a", 2, registered_at=NOW - 60, first_heartbeat=NOW - 60), loading("b", registered_at=NOW - 60),
              loading("c", registered_at=NOW - 60)), None,
        "waiting up to join_timeout 10s for b, c",
        catch_up={"b": "a", "c": "a"},
    ),
    restore_case(
        "a member still loading when the timeout runs out catches up from the others later",
        table(held("a", 12), held("b", 11), loading("c")), ("a", "b"),
        "c (a member when the state was lost; quorum 7 trained the last step) not back",
        catch_up={"c": "a"},
    ),
    restore_case(
        "a cordoned member is not waited for: it would not be admitted",
        table(held("a"), held("b"), held("c", cordoned=True)), ("a", "b"),
        "every member that may join when the state was lost is back with the checkpoint of step 40",
    ),
    restore_case(
        "a holder that was no member is admitted with the members, never waited for",
        table(held("a"), held("b"), held("c"), held("d")), ("a", "b", "c", "d"),
        "every member when the state was lost is back",
    ),
    restore_case(
        "min_replicas still holds once the timeout ran out",
        table(held("a", 11), gone("b"), gone("c")), None, "no quorum: 1 healthy replicas, need min_replicas 2",
        rules=dataclasses.replace(RULES, min_replicas=2),
    ),
    restore_case(
        "nobody loaded it yet: the state is lost until one does, as without the rule",
        table(loading("a"), loading("b"), gone("c")), None,
        "state lost at step 40: no live replica holds it; a at step 0, b at step 0.",
        lost=STEP,
    ),
    Case(
        "without a restore under way, a holder alone forms the quorum at once (rule 8)",
        quorum("a", "b", "c"), table(held("a"), loading("b"), gone("c")), ("a",),
        "admitting a.", committed=STEP, catch_up={"b": "a"},
    ),
    Case(
        "once the restore's quorum formed, a late loader joins it as any joiner does",
        Quorum(8, (Member("a", "a:1", 1, STEP, 8), Member("b", "b:1", 1, STEP, 8)), step=STEP, last_drop_id=8),
        table(alive("a", STEP + 3), alive("b", STEP + 3), held("c")), None,
        "quorum 8 unchanged", committed=STEP, restoring=LOST, catch_up={"c": "a"},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_restore_first_quorum(case: Case):
    check(case)


# ----- through JobState: the restore stored, the replicas' calls, a coordinator restart -----

KEYS = JobKeys("/t", "job")
MEMBERS = ("r0", "r1", "r2")


def checkpoint(step: int) -> pb.CheckpointRecord:
    return pb.CheckpointRecord(step=step, path=f"/ckpt/job/step-{step:010d}", digest=f"d{step}", shares=3)


def lost_job(store: MemoryStore, cascade: bool = False) -> tuple[JobState, CheckpointBook, CommittedRecord, Quorum]:
    """Quorum 7 of r0, r1, r2 trained to step 45 with a checkpoint at 40; every process was killed.
    ``cascade``: their streams closed one after another, and the coordinator dropped r2, then r1
    (quorums 8 and 9) before r0's agent reported it failed."""
    ledger = LedgerWriter(store, KEYS)
    state = JobState("job", RULES, ledger=ledger)
    members = tuple(Member(rid, f"{rid}:1", 1, 0, 1) for rid in MEMBERS)
    q = Quorum(7, members, step=0, last_drop_id=1)
    state.set_quorum(q, 7)
    for rid in MEMBERS:
        session = state.register(rid, f"{rid}:1", 1, 0, 1, now=0.0, agent_ids=(agent_of(rid),))
        state.heartbeat(rid, session, STEP + 5, False, "", 0, now=0.5)
    assert state.committed_step == STEP + 5 and state.trained is q
    if cascade:
        for qid in (8, 9):
            state.set_quorum(Quorum(qid, members[:9 - qid + 1], step=STEP + 5, last_drop_id=qid), qid)
        assert state.quorum.member_ids == ("r0",)
    for rid in MEMBERS:
        state.agent_event(rid, pb.AGENT_STATE_FAILED, 0, "killed", now=1.0, agent_id=agent_of(rid))
    book, committed = CheckpointBook(ledger), CommittedRecord(ledger)
    book.report(checkpoint(STEP))
    asyncio.run(checkpoints.sync(book, "job", 0.0))
    return state, book, committed, state.quorum


def decide_and_apply(state: JobState, now: float):
    decision = state.evaluate(now)
    quorum = None
    if decision.members is not None:
        prev = state.quorum
        quorum = Quorum(prev.id + 1 if prev else 1, decision.members, step=decision.head_step)
    state.apply(decision, quorum, quorum.id if quorum else state.quorum_revision)
    return decision


def back(state: JobState, rid: str, now: float) -> str:
    """A restarted process registers (at step 0, in no quorum) and heartbeats."""
    session = state.register(rid, f"{rid}:1", 1, 0, 0, now=now)
    state.heartbeat(rid, session, 0, False, "", 0, now=now)
    return session


@pytest.mark.parametrize("cascade", [False, True], ids=["dropped-at-once", "dropped-one-by-one"])
def test_the_restored_job_forms_its_first_quorum_with_every_member_that_loads_in_time(cascade):
    store = MemoryStore()
    state, book, committed, _ = lost_job(store, cascade)
    assert decide_and_apply(state, 2.0).state_lost_step == STEP + 5
    assert asyncio.run(checkpoints.restore_if_lost(book, committed, state, 2.0, lambda: 100.0))
    sessions = {rid: back(state, rid, 3.0 + i * 0.1) for i, rid in enumerate(MEMBERS)}
    # r0 loads first (a long load: 20 s, twice the join timeout), the others 1 s and 2 s later.
    state.heartbeat("r0", sessions["r0"], STEP, False, "", 0, now=23.0)
    waiting = decide_and_apply(state, 23.5)
    assert waiting.members is None and "waiting up to join_timeout 10s" in waiting.reason, waiting.reason
    assert state.catch_up == {} and state.reason == waiting.reason  # nobody copies r0: each loads it
    state.heartbeat("r1", sessions["r1"], STEP, False, "", 0, now=24.0)
    assert decide_and_apply(state, 24.5).members is None
    state.heartbeat("r2", sessions["r2"], STEP, False, "", 0, now=25.0)
    formed = decide_and_apply(state, 25.1)
    assert [m.replica_id for m in formed.members] == list(MEMBERS), formed.reason
    assert "every member when the state was lost is back" in formed.reason


def test_a_coordinator_that_starts_mid_wait_goes_on_waiting():
    store = MemoryStore()
    state, book, committed, q = lost_job(store)
    decide_and_apply(state, 2.0)
    asyncio.run(checkpoints.restore_if_lost(book, committed, state, 2.0, lambda: 100.0))
    # The coordinator stops; a new one loads what the store has.
    ledger2 = LedgerWriter(store, KEYS)
    ledger2.load()
    book2, committed2 = CheckpointBook(ledger2), CommittedRecord(ledger2)
    step = committed2.load(q)
    assert step == STEP and checkpoints.under_way(book2, committed2, q).digest == f"d{STEP}"
    later = Quorum(8, q.members[:2], step=STEP, last_drop_id=8)
    assert checkpoints.under_way(book2, committed2, later) is None  # the restore's quorum formed: over
    assert checkpoints.under_way(book2, committed2, None) is None
    book2.refuse(f"d{STEP}")
    assert checkpoints.under_way(book2, committed2, q) is None  # refused: a restore takes another one

    book2 = CheckpointBook(ledger2)
    fresh = JobState("job", RULES, ledger=ledger2)
    fresh.load(q, 7, {}, 50.0, step)
    grant_reconnect_grace(fresh.replicas, 50.0 + RULES.heartbeat_timeout + RULES.join_timeout)
    fresh.restore = checkpoints.under_way(book2, committed2, q)  # as the runtime does when it loads the job
    sessions = {rid: fresh.register(rid, f"{rid}:1", 1, STEP, 0, now=51.0)  # r0 and r1 had loaded it
                for rid in MEMBERS[:2]}

    def beat(now: float) -> None:
        for rid, session in sessions.items():
            fresh.heartbeat(rid, session, STEP, False, "", 0, now=now)

    beat(51.0)
    # r2's host is down. A member a restarted coordinator has not heard from is presumed to train
    # on, but not while a restore is under way: r2 is no quorum by itself, nor is anyone admitted
    # while it may still reconnect; it is judged lost a heartbeat timeout after the others were
    # back (56), and still waited for until join_timeout after r0 and r1 held the state (61).
    assert decide_and_apply(fresh, 52.0).members is None and fresh.quorum.id == 7
    for now in (56.0, 57.0, 60.9):
        beat(now - 0.5)
        waiting = decide_and_apply(fresh, now)
        assert waiting.members is None, (now, waiting.reason)
        assert "for r2 (a member when the state was lost; quorum 7 trained" in waiting.reason, (now, waiting.reason)
    beat(60.95)
    formed = decide_and_apply(fresh, 61.0)
    assert [m.replica_id for m in formed.members] == ["r0", "r1"], formed.reason
    assert "join_timeout 10s passed" in formed.reason
