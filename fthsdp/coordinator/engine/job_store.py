"""A job's keys in the store: what the runtime reads and writes there.

The epoch (bumped by every coordinator that takes the job over), the quorum
(written with a revision check *before* it is applied and pushed: a quorum
id that reached a replica is durable, so ids never go backwards after a
restart) and the replica records (address and the operators' flags, kept
when two writers race). Store calls are blocking (etcd client) and go to
worker threads, so an unreachable etcd delays these but never heartbeats or
status. The committed step has its own record and module
(fthsdp/coordinator/engine/committed.py). Apart from the runtime
(fthsdp/coordinator/engine/runtime.py) and its decision loop
(fthsdp/coordinator/engine/decision_loop.py), which both write records, so that the
layout of a job's keys and the races over them are read in one place.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from fthsdp.coordinator.decisions.quorum_types import Decision, Quorum, next_last_drop_id
from fthsdp.coordinator.engine.served_job import ServedJob
from fthsdp.coordinator.ledger.codec import decode, quorum_from_pb, quorum_to_pb
from fthsdp.coordinator.ledger.keys import JobKeys
from fthsdp.coordinator.store import Store
from fthsdp.core.errors import LostOwnership
from fthsdp.protos.v1 import coordinator_pb2 as pb


async def _call(fn, *args):
    return await asyncio.to_thread(fn, *args)


def bump_epoch(store: Store, keys: JobKeys, leader: str, wall: Callable[[], float]) -> int:
    """Take the job over: the stored epoch plus one, with ``leader`` as its coordinator (blocking)."""
    while True:
        current = store.get(keys.epoch)
        previous = decode(pb.Epoch, current.value, "epoch").epoch if current else 0
        msg = pb.Epoch(epoch=previous + 1, coordinator=leader, started_unix_ms=int(wall() * 1000))
        result = store.compare_and_set(keys.epoch, msg.SerializeToString(), current.revision if current else 0)
        if result.succeeded:
            return msg.epoch


async def read(
    store: Store, job: ServedJob
) -> tuple[Quorum | None, int, dict[str, tuple[pb.ReplicaRecord, int]]]:
    """The stored quorum (None if there is none) with its revision, and every
    replica record with its revision, by replica id."""
    keys = job.keys
    stored = await asyncio.to_thread(store.get, keys.quorum)
    quorum, revision = None, 0
    if stored is not None:
        quorum = quorum_from_pb(decode(pb.Quorum, stored.value, f"quorum of job {job.state.name}"))
        revision = stored.revision
    records = {}
    for key, item in (await asyncio.to_thread(store.get_prefix, keys.replicas)).items():
        rec = decode(pb.ReplicaRecord, item.value, f"record {key}")
        records[rec.replica_id] = (rec, item.revision)
    return quorum, revision, records


async def stored_quorum(store: Store, keys: JobKeys, name: str) -> pb.Quorum | None:
    """The quorum as stored, undecoded into the domain type (a follower's answer)."""
    stored = await _call(store.get, keys.quorum)
    if stored is not None:
        return decode(pb.Quorum, stored.value, f"quorum of job {name}")
    return None


async def write_record(store: Store, job: ServedJob, rec: pb.ReplicaRecord, expected: int) -> int:
    """Store a replica's record over the one at revision ``expected``; returns its new revision."""
    key = job.keys.replica(rec.replica_id)
    result = await _call(store.compare_and_set, key, rec.SerializeToString(), expected)
    if not result.succeeded:
        # Someone else (an earlier coordinator, an operator) wrote it; keep
        # their flags, which are the newer intent, and write ours over them.
        current = decode(pb.ReplicaRecord, result.current.value, key) if result.current else None
        if current is not None:
            rec.cordoned = rec.cordoned or current.cordoned
            rec.drain_requested = rec.drain_requested or current.drain_requested
        retry_expected = result.current.revision if result.current else 0
        result = await _call(store.compare_and_set, key, rec.SerializeToString(), retry_expected)
        if not result.succeeded:
            raise LostOwnership(f"record {key} keeps changing under this coordinator")
    return result.current.revision


async def delete_record(store: Store, job: ServedJob, replica_id: str, revision: int) -> None:
    """Delete a replica's record if it is still at ``revision`` (a replica gone for good)."""
    await _call(store.compare_and_delete, job.keys.replica(replica_id), revision)


async def publish(store: Store, job: ServedJob, decision: Decision, created_unix_ms: int) -> tuple[Quorum, int]:
    """Store the quorum that ``decision`` forms, numbered after the current
    one, with a revision check; returns it with its revision. If another
    writer moved the quorum on, theirs is adopted and ``LostOwnership`` raised."""
    prev = job.state.quorum
    members = decision.members or ()
    new_id = (prev.id if prev else 0) + 1
    quorum = Quorum(
        id=new_id,
        members=members,
        # Members that stay keep the step they were admitted at.
        step=max([decision.head_step, *(m.step for m in members)]),
        created_unix_ms=created_unix_ms,
        reason=decision.reason,
        epoch=job.epoch,
        generation=job.state.generation,
        # A regroup drops nobody, but its members must leave the old group at once.
        last_drop_id=new_id if decision.regroup else next_last_drop_id(prev, new_id, members),
    )
    data = quorum_to_pb(quorum).SerializeToString()
    result = await _call(store.compare_and_set, job.keys.quorum, data, job.state.quorum_revision)
    if result.succeeded:
        return quorum, result.current.revision
    # Another writer moved the quorum on: adopt theirs so our next id is
    # above it, and decide again on the next tick.
    if result.current is not None:
        theirs = quorum_from_pb(decode(pb.Quorum, result.current.value, "quorum"))
        job.state.set_quorum(theirs, result.current.revision)
        job.set_quorum(quorum_to_pb(theirs))
        job.notify()
    raise LostOwnership(f"quorum of job {job.state.name} was changed by another coordinator; re-deciding")
