"""One job, one lineage, on the coordinator's side (in process, a memory store).

A restore or a give-up begins a new generation, stored with the committed
step before it is applied; quorums carry it to the members, whose
checkpoints go to that generation's folders; a sealed checkpoint is
recorded only from a member of the quorum that committed its step, of the
job's generation and of a quorum formed since it began
(fthsdp/coordinator/engine/checkpoints.py ``lineage_refusal``).
"""

from __future__ import annotations

import asyncio

import pytest

from fthsdp.coordinator.decisions.quorum_types import Member, Quorum, Rules
from fthsdp.coordinator.engine import checkpoints, committed
from fthsdp.coordinator.engine.checkpoints import CheckpointBook, lineage_refusal
from fthsdp.coordinator.engine.committed import CommittedRecord
from fthsdp.coordinator.job.state import JobState
from fthsdp.coordinator.ledger.codec import quorum_from_pb, quorum_to_pb
from fthsdp.coordinator.ledger.keys import JobKeys
from fthsdp.coordinator.ledger.value import FixedLedger, Ledger
from fthsdp.coordinator.ledger.writer import LedgerWriter
from fthsdp.coordinator.store.memory import MemoryStore
from fthsdp.protos.v1 import coordinator_pb2 as pb

KEYS = JobKeys("/t", "job")


def quorum(qid: int, *ids: str, generation: int = 0) -> Quorum:
    return Quorum(qid, tuple(Member(i, f"{i}:1", 1, 0, 1) for i in ids), generation=generation)


def record(step: int, qid: int, generation: int = 0) -> pb.CheckpointRecord:
    return pb.CheckpointRecord(step=step, path=f"/ckpt/job/step-{step:010d}", digest=f"d{step}-{generation}",
                               quorum_id=qid, shares=2, generation=generation)


def job_in_lineage(generation: int, lineage_from: int) -> JobState:
    stored = Ledger(committed=pb.CommittedStep(generation=generation, lineage_from=lineage_from))
    state = JobState("job", Rules(), ledger=FixedLedger(stored))
    for qid, members in ((lineage_from, ("a", "b")), (lineage_from + 1, ("c",)), (lineage_from + 2, ("c", "d"))):
        state.set_quorum(quorum(qid, *members, generation=generation), qid)
    return state


REFUSALS = [
    ("a member of the quorum that committed it, in the lineage", record(50, 6, 1), "c", ""),
    ("the lineage a restore replaced (a quorum cut from the coordinator trained on)", record(50, 5, 0), "a",
     "it is of lineage 0, the job's is 1"),
    ("the right generation but a quorum from before it began", record(50, 5, 1), "a",
     "quorum 5 wrote it, before lineage 1 began in quorum 6"),
    ("not a member of that quorum (a forged report)", record(50, 7, 1), "a", "a was not a member of quorum 7"),
    ("a quorum the coordinator never formed", record(50, 99, 1), "c", "c was not a member of quorum 99"),
]


@pytest.mark.parametrize("what, rec, sender, why", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_a_checkpoint_is_recorded_only_from_the_jobs_lineage(what, rec, sender, why):
    state = job_in_lineage(1, 5)
    got = lineage_refusal(rec, sender, state)
    assert got.startswith(why) if why else got == ""


def test_a_newer_lineage_orders_after_the_older_whatever_the_steps():
    book = CheckpointBook(LedgerWriter(MemoryStore(), KEYS))
    assert book.report(record(300, 4, 0))
    assert book.report(record(290, 8, 1)), "the restored lineage's first checkpoint is newer than the old one's"
    assert not book.report(record(280, 8, 1))


def test_quorums_carry_the_generation_through_the_store_codec():
    q = quorum(3, "a", generation=4)
    assert quorum_from_pb(quorum_to_pb(q)).generation == 4 and quorum_to_pb(q).generation == 4


def test_a_restore_begins_a_new_lineage_stored_before_it_is_applied():
    store = MemoryStore()
    ledger = LedgerWriter(store, KEYS)
    state = JobState("job", Rules(), ledger=ledger)
    state.set_quorum(quorum(7, "a", "b"), 7)
    book, rec = CheckpointBook(ledger), CommittedRecord(ledger)
    book.report(record(40, 7))
    asyncio.run(checkpoints.sync(book, "job", 0.0))
    asyncio.run(checkpoints.restore(book, rec, state, book.usable[0], 45, 1.0, lambda: 100.0, "automatic"))
    assert (state.generation, state.lineage_from) == (1, 7)
    again = CommittedRecord(LedgerWriter(store, KEYS))
    again.ledger.load()
    assert (again.generation, again.lineage_from) == (1, 7), "a coordinator that starts next knows the lineage"
    assert lineage_refusal(record(50, 7, 0), "a", state).startswith("it is of lineage 0")


def test_a_give_up_begins_a_new_lineage_too():
    store = MemoryStore()
    ledger = LedgerWriter(store, KEYS)
    state = JobState("job", Rules(), ledger=ledger)
    state.set_quorum(quorum(3, "a"), 3)
    state.committed_step, state.state_lost_step = 20, 20
    state.lost_step_now = lambda now: 20  # type: ignore[method-assign]  # the decision's verdict, as of now
    rec = CommittedRecord(ledger)
    asyncio.run(committed.give_up(rec, state, pb.GiveUpStateRequest(job="job", step=20), "peer", "c1", 1,
                                  1.0, lambda: 100.0))
    assert (state.generation, state.lineage_from) == (1, 3)
