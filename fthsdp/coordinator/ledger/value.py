"""A job's ledger: everything the coordinator keeps of one job in the store, as one value.

The epoch, the current quorum, the committed step (with the lineage, the
last give-up and restore and the finished mark), the newest complete
checkpoints and the replica records (address, rank count, agents, restart
count, and what outlives an incarnation: the operators' cordon and drain,
the unreachable mark). Each lives under its own key (fthsdp/coordinator/ledger/keys.py),
as a protobuf message. A ``Ledger`` is immutable: a change makes a new
value (``dataclasses.replace``, ``with_record``), and the one writer
(fthsdp/coordinator/ledger/writer.py) turns the difference between two
values into one store transaction. The messages it holds are never
changed in place; whoever needs another builds a new one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Protocol

from fthsdp.coordinator.decisions.quorum_types import Quorum
from fthsdp.coordinator.ledger.codec import decode, quorum_from_pb, quorum_to_pb
from fthsdp.coordinator.ledger.keys import JobKeys
from fthsdp.coordinator.store import Versioned
from fthsdp.protos.v1 import coordinator_pb2 as pb

_NO_RECORDS: Mapping[str, pb.ReplicaRecord] = MappingProxyType({})


@dataclasses.dataclass(frozen=True, eq=False)
class Ledger:
    """One job's durable state, as stored (absent keys: None, empty); compared part by part by the writer."""

    epoch: pb.Epoch | None = None
    """Bumped by every coordinator that takes the job over."""
    quorum: Quorum | None = None
    """The current quorum; its id never decreases."""
    committed: pb.CommittedStep | None = None
    """The committed step (a lower bound), the lineage, the last give-up and restore, the finished mark."""
    checkpoints: tuple[pb.CheckpointRecord, ...] = ()
    """The newest complete checkpoints, newest first."""
    records: Mapping[str, pb.ReplicaRecord] = dataclasses.field(default_factory=lambda: _NO_RECORDS)
    """Each known replica's record, by replica id."""

    # ----- reads -----------------------------------------------------------------------

    @property
    def committed_step(self) -> int:
        return self.committed.step if self.committed is not None else 0

    @property
    def generation(self) -> int:
        """The job's lineage: one more with every restore or give-up."""
        return self.committed.generation if self.committed is not None else 0

    @property
    def lineage_from(self) -> int:
        """The quorum id current when the lineage began."""
        return self.committed.lineage_from if self.committed is not None else 0

    @property
    def finished(self) -> pb.JobFinished | None:
        c = self.committed
        return c.finished if c is not None and c.HasField("finished") else None

    @property
    def last_give_up(self) -> pb.GiveUp | None:
        c = self.committed
        return c.last_give_up if c is not None and c.HasField("last_give_up") else None

    @property
    def last_restore(self) -> pb.Restore | None:
        c = self.committed
        return c.last_restore if c is not None and c.HasField("last_restore") else None

    # ----- changes ---------------------------------------------------------------------

    def with_record(self, record: pb.ReplicaRecord) -> Ledger:
        return dataclasses.replace(self, records=MappingProxyType({**self.records, record.replica_id: record}))

    def without_record(self, replica_id: str) -> Ledger:
        return dataclasses.replace(
            self, records=MappingProxyType({r: rec for r, rec in self.records.items() if r != replica_id}))


def encode(ledger: Ledger, keys: JobKeys) -> dict[str, bytes]:
    """The ledger as the store holds it: key -> serialized message (absent parts have no key)."""
    out: dict[str, bytes] = {}
    if ledger.epoch is not None:
        out[keys.epoch] = ledger.epoch.SerializeToString()
    if ledger.quorum is not None:
        out[keys.quorum] = quorum_to_pb(ledger.quorum).SerializeToString()
    if ledger.committed is not None:
        out[keys.committed] = ledger.committed.SerializeToString()
    if ledger.checkpoints:
        out[keys.checkpoint] = pb.CheckpointList(checkpoints=ledger.checkpoints).SerializeToString()
    for rid, rec in ledger.records.items():
        out[keys.replica(rid)] = rec.SerializeToString()
    return out


def decode_items(items: Mapping[str, Versioned | None], keys: JobKeys, into: Ledger = Ledger()) -> Ledger:
    """``into`` with every key of ``items`` read from the store (None: the key is absent)."""
    changes: dict[str, object] = {}
    records = dict(into.records)
    for key, item in items.items():
        value = item.value if item is not None else None
        if key == keys.epoch:
            changes["epoch"] = decode(pb.Epoch, value, "epoch") if value is not None else None
        elif key == keys.quorum:
            changes["quorum"] = (quorum_from_pb(decode(pb.Quorum, value, f"quorum of job {keys.job}"))
                                 if value is not None else None)
        elif key == keys.committed:
            changes["committed"] = (decode(pb.CommittedStep, value, f"committed step of job {keys.job}")
                                    if value is not None else None)
        elif key == keys.checkpoint:
            changes["checkpoints"] = (tuple(decode(pb.CheckpointList, value, f"checkpoints of job {keys.job}")
                                            .checkpoints) if value is not None else ())
        elif key.startswith(keys.replicas):
            rid = key[len(keys.replicas):]
            if value is None:
                records.pop(rid, None)
            else:
                rec = decode(pb.ReplicaRecord, value, f"record {key}")
                records[rec.replica_id or rid] = rec
    return dataclasses.replace(into, records=MappingProxyType(records), **changes)  # type: ignore[arg-type]


class LedgerView(Protocol):
    """Where the job table reads its ledger: its writer (fthsdp/coordinator/ledger/writer.py) or a fixed value."""

    @property
    def current(self) -> Ledger: ...


@dataclasses.dataclass(frozen=True)
class FixedLedger:
    """A ledger no writer changes: the table of a job made without a store (tests, tools)."""

    current: Ledger = Ledger()
