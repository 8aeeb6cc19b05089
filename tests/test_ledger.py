"""A job's ledger and its one writer (fthsdp/coordinator/ledger/): a change is one
transaction of the keys that changed, conditioned on the leader's key; a
coordinator that loses its leadership between deciding and persisting writes
nothing and applies nothing. In-process, on the memory store and a fake clock."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import pytest

from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.coordinator.decisions.quorum_types import Member, Quorum
from fthsdp.coordinator.engine.runtime import CoordinatorRuntime
from fthsdp.coordinator.ledger.keys import JobKeys
from fthsdp.coordinator.ledger.value import Ledger
from fthsdp.coordinator.ledger.writer import LedgerConflict, LedgerWriter, NotLeading, diff
from fthsdp.coordinator.store.leadership import Leadership
from fthsdp.coordinator.store.memory import MemoryStore
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.jobs import agent_of
from tests.harness.runtimes import FakeClock

KEYS = JobKeys("/t", "job")
LEADER_KEY = "/t/leader"


def record(rid: str, cordoned: bool = False) -> pb.ReplicaRecord:
    return pb.ReplicaRecord(replica_id=rid, address=f"{rid}:1", world_size=1, cordoned=cordoned)


def quorum(qid: int, *ids: str) -> Quorum:
    return Quorum(qid, tuple(Member(i, f"{i}:1", 1, 0, qid) for i in ids))


def test_a_change_writes_only_what_changed_at_one_revision():
    store = MemoryStore()
    writer = LedgerWriter(store, KEYS)
    base = Ledger(quorum=quorum(1, "a"), records={"a": record("a"), "b": record("b")})
    asyncio.run(writer.update(lambda before: base))
    assert set(store.get_prefix(KEYS.root)) == {KEYS.quorum, KEYS.replica("a"), KEYS.replica("b")}
    untouched = store.get(KEYS.replica("a")).revision
    after = dataclasses.replace(writer.current, quorum=quorum(2, "a", "b")).with_record(record("b", cordoned=True))
    change = diff(writer.current, after, KEYS, writer.revisions)
    assert set(change.puts) == {KEYS.quorum, KEYS.replica("b")} and not change.deletes
    asyncio.run(writer.update(lambda before: after))
    assert store.get(KEYS.quorum).revision == store.get(KEYS.replica("b")).revision  # one transaction
    assert store.get(KEYS.replica("a")).revision == untouched
    asyncio.run(writer.update(lambda before: before.without_record("b")))
    assert store.get(KEYS.replica("b")) is None and KEYS.replica("b") not in writer.revisions
    again = LedgerWriter(store, KEYS)
    loaded = again.load()
    assert loaded.quorum == quorum(2, "a", "b") and set(loaded.records) == {"a"}


def test_a_change_that_changes_nothing_writes_nothing():
    store = MemoryStore()
    writer = LedgerWriter(store, KEYS)
    asyncio.run(writer.update(lambda before: before.with_record(record("a"))))
    revision = store.get(KEYS.replica("a")).revision
    same = pb.ReplicaRecord()
    same.CopyFrom(writer.current.records["a"])
    asyncio.run(writer.update(lambda before: before.with_record(same)))  # another object, the same bytes
    assert store.get(KEYS.replica("a")).revision == revision


def test_another_writers_change_is_adopted_and_raised():
    store = MemoryStore()
    ours, theirs = LedgerWriter(store, KEYS), LedgerWriter(store, KEYS)
    asyncio.run(theirs.update(lambda before: dataclasses.replace(before, quorum=quorum(5, "x"))))
    with pytest.raises(LedgerConflict) as raised:
        asyncio.run(ours.update(lambda before: dataclasses.replace(before, quorum=quorum(1, "a"))))
    assert raised.value.keys == {KEYS.quorum}
    assert ours.current.quorum == quorum(5, "x")  # theirs, so that the next id is above it
    asyncio.run(ours.update(lambda before: dataclasses.replace(before, quorum=quorum(6, "a"))))
    assert LedgerWriter(store, KEYS).load().quorum == quorum(6, "a")


def test_a_writer_that_lost_the_leader_key_writes_nothing():
    store = MemoryStore()
    lease = store.grant_lease(60)
    held = store.compare_and_set(LEADER_KEY, b"me", 0, lease).current.revision
    writer = LedgerWriter(store, KEYS, guard=lambda: (LEADER_KEY, held))
    asyncio.run(writer.update(lambda before: before.with_record(record("a"))))
    store.revoke_lease(lease)  # the lease lapsed ...
    store.compare_and_set(LEADER_KEY, b"other", 0)  # ... and another coordinator leads
    with pytest.raises(NotLeading):
        asyncio.run(writer.update(lambda before: before.with_record(record("b"))))
    assert store.get(KEYS.replica("b")) is None and "b" not in writer.current.records


class StolenLeadership(MemoryStore):
    """A store where another coordinator takes the leader key just as the
    next transaction arrives: after this one decided, before it persists."""

    steal = False

    def transact(self, compares, puts, deletes=()):
        if self.steal:
            self.steal = False
            current = self.get(LEADER_KEY)
            self.compare_and_delete(LEADER_KEY, current.revision)
            self.compare_and_set(LEADER_KEY, b"other:1", 0)
        return super().transact(compares, puts, deletes)


def test_a_coordinator_that_loses_its_leadership_between_decide_and_persist_writes_and_applies_nothing(caplog):
    async def scenario():
        store, clock = StolenLeadership(), FakeClock()
        leadership = Leadership(store, LEADER_KEY, "coord:1", 60.0)
        assert await leadership.try_once()
        config = CoordinatorConfig(min_replicas=1, join_settle=0.0, store_prefix="/t")
        runtime = CoordinatorRuntime(config, store, "coord:1", clock=clock, wall=lambda: 1000.0,
                                     guard=leadership.held)
        job = runtime.jobs["default"]
        await runtime._load(job)  # what start() does, without the decision loop: the test decides
        runtime.leading = True
        for rid in ("r0", "r1"):
            req = pb.RegisterRequest(job="default", replica_id=rid, address=f"{rid}:1", world_size=1,
                                     agent_ids=[agent_of(rid)])
            session = (await runtime.register(req)).session_id
            runtime.heartbeat(pb.HeartbeatRequest(job="default", replica_id=rid, session_id=session))
        pushed = job.changes.generation
        stored = store.get_prefix(JobKeys("/t", "default").root)
        store.steal = True
        clock.t = 0.5
        with caplog.at_level(logging.ERROR, logger="fthsdp.coordinator"):
            await runtime.decisions.evaluate(job)
        assert store.get_prefix(JobKeys("/t", "default").root) == stored, "nothing written"
        assert job.state.quorum is None and job.quorum_pb is None, "nothing applied"
        assert job.changes.generation == pushed, "nobody told"
        assert "no longer leads; nothing was written" in caplog.text

    asyncio.run(scenario())
