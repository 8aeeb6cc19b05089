"""The coordinator's record of a job's checkpoints: what is stored, what a restore takes."""

from __future__ import annotations

import asyncio

import pytest

from fthsdp.coordinator.decisions.quorum_types import Rules
from fthsdp.coordinator.engine import checkpoints
from fthsdp.coordinator.engine.checkpoints import CheckpointBook
from fthsdp.coordinator.engine.committed import CommittedRecord
from fthsdp.coordinator.job.state import JobState
from fthsdp.coordinator.ledger.keys import JobKeys
from fthsdp.coordinator.ledger.writer import LedgerWriter
from fthsdp.coordinator.store.memory import MemoryStore
from fthsdp.core.errors import NotFound, StateNotLost
from fthsdp.protos.v1 import coordinator_pb2 as pb

KEYS = JobKeys("/t", "job")


def book_on(store: MemoryStore) -> CheckpointBook:
    """The checkpoint book of a coordinator that loaded the job's ledger from ``store``."""
    ledger = LedgerWriter(store, KEYS)
    ledger.load()
    return CheckpointBook(ledger)


def record(step: int) -> pb.CheckpointRecord:
    return pb.CheckpointRecord(step=step, path=f"/ckpt/job/step-{step:010d}", digest=f"d{step}", shares=2,
                               sealed_unix_ms=1000 * step)


def stored(store: MemoryStore) -> list[int]:
    item = store.get(KEYS.checkpoint)
    return [r.step for r in pb.CheckpointList.FromString(item.value).checkpoints] if item else []


def test_reports_are_stored_newest_first_none_lost_however_fast_they_come():
    store = MemoryStore()
    book = book_on(store)
    assert book.report(record(10)) and book.report(record(20))  # two before any write
    assert not book.report(record(20)) and not book.report(record(15))  # not newer: ignored
    assert not book.report(pb.CheckpointRecord(step=30))  # no path or digest: ignored
    asyncio.run(checkpoints.sync(book, "job", 0.0))
    assert stored(store) == [20, 10] and book.newest.step == 20
    book.report(record(30))
    asyncio.run(checkpoints.sync(book, "job", 0.0))
    assert stored(store) == [30, 20, 10]
    again = book_on(store)  # a coordinator that takes the job over
    assert [r.step for r in again.records] == [30, 20, 10]


def test_only_the_newest_few_are_kept():
    store = MemoryStore()
    book = book_on(store)
    for step in range(1, checkpoints.KEPT + 4):
        book.report(record(step))
        asyncio.run(checkpoints.sync(book, "job", 0.0))
    assert stored(store) == list(range(checkpoints.KEPT + 3, 3, -1))


def test_no_more_are_recorded_than_the_replicas_keep_on_disk():
    store = MemoryStore()
    book = book_on(store)
    for step in (10, 20, 30):
        r = record(step)
        r.kept = 2
        book.report(r)
        asyncio.run(checkpoints.sync(book, "job", 0.0))
    assert stored(store) == [30, 20]


def test_a_refused_checkpoint_is_dropped():
    store = MemoryStore()
    book = book_on(store)
    for step in (10, 20):
        book.report(record(step))
    asyncio.run(checkpoints.sync(book, "job", 0.0))
    assert book.refuse("d20").step == 20 and book.refuse("unknown") is None
    assert book.newest.step == 10
    asyncio.run(checkpoints.sync(book, "job", 0.0))
    assert stored(store) == [10]


def test_another_coordinators_write_is_adopted_and_the_report_tried_again():
    store = MemoryStore()
    book = book_on(store)
    other = book_on(store)
    other.report(record(10))
    asyncio.run(checkpoints.sync(other, "job", 0.0))
    book.report(record(20))
    asyncio.run(checkpoints.sync(book, "job", 0.0))  # loses the compare-and-swap, adopts [10]
    assert [r.step for r in book.records] == [10] and book.newest.step == 20
    asyncio.run(checkpoints.sync(book, "job", 0.0))
    assert stored(store) == [20, 10]


def lost_job(step: int) -> JobState:
    state = JobState("job", Rules())
    state.committed_step = state.state_lost_step = step
    return state


@pytest.mark.parametrize(
    "recorded, lost, restores",
    [
        ([], 25, None),  # nothing recorded: the job waits (for a replica or an operator)
        ([10, 20], 25, 20),  # the newest
        ([10, 20], 20, 20),  # lost exactly at a checkpoint: nothing lost
        ([10, 30], 25, None),  # newer than the state lost (never happens: sealed after commit) -> not used
        ([10, 20], 0, None),  # not lost
    ],
)
def test_automatic_restore_takes_the_newest_at_or_below_the_lost_step(recorded, lost, restores):
    store = MemoryStore()
    book = book_on(store)
    for step in recorded:
        book.report(record(step))
    asyncio.run(checkpoints.sync(book, "job", 0.0))
    committed, state = CommittedRecord(book.ledger), lost_job(lost)
    did = asyncio.run(checkpoints.restore_if_lost(book, committed, state, 0.0, lambda: 5.0))
    assert did == (restores is not None)
    if restores is not None:
        assert state.restore.step == restores and state.committed_step == restores
        assert state.state_lost_step == 0  # until the next decision says who holds it
        assert committed.last_restore.lost_step == lost and committed.stored == restores
        # Stored before acted on: a coordinator that takes over knows it.
        again = book_on(store)  # a coordinator that takes over
        again = CommittedRecord(again.ledger)
        assert again.last_restore.checkpoint.step == restores


def test_an_operator_restore_needs_a_lost_state_and_a_recorded_step(monkeypatch):
    store = MemoryStore()
    book = book_on(store)
    for step in (10, 20):
        book.report(record(step))
    asyncio.run(checkpoints.sync(book, "job", 0.0))
    state = lost_job(25)
    monkeypatch.setattr(state, "lost_step_now", lambda now: 0)
    request = pb.RestoreCheckpointRequest(job="job", step=10, requested_by="alice@host")
    with pytest.raises(StateNotLost, match="not lost"):
        asyncio.run(checkpoints.restore_by_request(book, CommittedRecord(book.ledger), state, request, "ipv4:1",
                                                   0.0, lambda: 5.0))
    monkeypatch.setattr(state, "lost_step_now", lambda now: 25)
    with pytest.raises(NotFound, match="no complete checkpoint of step 15 \\(recorded: 20, 10\\)"):
        asyncio.run(checkpoints.restore_by_request(book, CommittedRecord(book.ledger), state,
                                                   pb.RestoreCheckpointRequest(job="job", step=15), "", 0.0,
                                                   lambda: 5.0))
    done = asyncio.run(checkpoints.restore_by_request(book, CommittedRecord(book.ledger), state, request, "ipv4:1",
                                                      0.0, lambda: 5.0))
    assert done.checkpoint.step == 10 and done.lost_step == 25 and done.requested_by == "alice@host (from ipv4:1)"
    assert state.restore.step == 10 and state.committed_step == 10
