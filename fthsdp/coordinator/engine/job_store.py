"""What the runtime changes of a job's ledger: the epoch, the quorum, the replica records.

The epoch (bumped by every coordinator that takes the job over), the quorum
(stored *before* it is applied and pushed: a quorum id that reached a
replica is durable, so ids never go backwards after a restart) and the
replica records (address and the operators' flags, kept when two writers
race). Each is a change of the job's ledger, stored by its one writer
(fthsdp/coordinator/ledger/writer.py) in one transaction; the committed
step and the checkpoints are changed in fthsdp/coordinator/engine/committed.py
and fthsdp/coordinator/engine/checkpoints.py. Apart from the runtime
(fthsdp/coordinator/engine/runtime.py) and its decision loop
(fthsdp/coordinator/engine/decision_loop.py), which both change records, so
that the races over a job's keys are read in one place.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from fthsdp.coordinator.engine.served_job import ServedJob
from fthsdp.coordinator.ledger.codec import decode
from fthsdp.coordinator.ledger.keys import JobKeys
from fthsdp.coordinator.ledger.value import Ledger
from fthsdp.coordinator.ledger.writer import LedgerConflict
from fthsdp.coordinator.store import Store
from fthsdp.core.errors import LostOwnership
from fthsdp.protos.v1 import coordinator_pb2 as pb


async def bump_epoch(job: ServedJob, leader: str, wall: Callable[[], float]) -> int:
    """Take the job over: the stored epoch plus one, with ``leader`` as its coordinator."""
    def change(before: Ledger) -> Ledger:
        previous = before.epoch.epoch if before.epoch is not None else 0
        return dataclasses.replace(before, epoch=pb.Epoch(epoch=previous + 1, coordinator=leader,
                                                          started_unix_ms=int(wall() * 1000)))

    while True:
        try:
            after = await job.ledger.update(change)
        except LedgerConflict:
            continue  # another coordinator bumped it meanwhile: one more than theirs
        assert after.epoch is not None  # just set
        return after.epoch.epoch


def records(job: ServedJob) -> dict[str, tuple[pb.ReplicaRecord, int]]:
    """Every replica record of the loaded ledger, with its revision, by replica id."""
    return {rid: (rec, job.ledger.revisions.get(job.keys.replica(rid), 0))
            for rid, rec in job.ledger.current.records.items()}


async def stored_quorum(store: Store, keys: JobKeys, name: str) -> pb.Quorum | None:
    """The quorum as stored, undecoded into the domain type (a follower's answer: a read, no ledger)."""
    stored = await asyncio.to_thread(store.get, keys.quorum)
    if stored is not None:
        return decode(pb.Quorum, stored.value, f"quorum of job {name}")
    return None


async def write_record(job: ServedJob, rec: pb.ReplicaRecord) -> int:
    """Store a replica's record; returns its new revision."""
    key = job.keys.replica(rec.replica_id)
    try:
        await job.ledger.update(lambda before: before.with_record(rec))
    except LedgerConflict:
        # Someone else (an earlier coordinator, an operator) wrote it; keep
        # their flags, which are the newer intent, and write ours over them.
        current = job.ledger.current.records.get(rec.replica_id)
        if current is not None:
            rec.cordoned = rec.cordoned or current.cordoned
            rec.drain_requested = rec.drain_requested or current.drain_requested
        try:
            await job.ledger.update(lambda before: before.with_record(rec))
        except LedgerConflict as e:
            raise LostOwnership(f"record {key} keeps changing under this coordinator") from e
    return job.ledger.revisions[key]


async def delete_record(job: ServedJob, replica_id: str) -> None:
    """Delete a replica's record (a replica gone for good), unless another writer changed it since."""
    if replica_id not in job.ledger.current.records:
        return
    try:
        await job.ledger.update(lambda before: before.without_record(replica_id))
    except LedgerConflict:
        pass  # theirs stands, as a failed compare-and-delete left it
