"""What one decision does, as one value: what to store, then what to apply and tell.

The decision loop (fthsdp/coordinator/engine/decision_loop.py) runs each
decision as check -> decide -> persist -> apply -> notify. ``Outcome`` is
what decide hands to the rest: the quorum decision, and what of it is
durable: the finished mark (every member left finished), the next quorum
(numbered after the current one), the restore of a lost state from the
newest checkpoint; and the replica records the checks before it changed
(unreachable marks, stragglers' cordons). At most one of the first three in
practice (a finished job forms no quorum; a lost state forms none either),
but whatever there is goes to the store in one transaction of the job's
ledger (``change``), conditioned on the leader's key: a coordinator that
lost its leadership between deciding and persisting writes nothing, and
nothing of the decision is applied or pushed before it is stored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from fthsdp.coordinator.decisions.quorum_types import Decision, Quorum, next_last_drop_id
from fthsdp.coordinator.engine.committed import next_record
from fthsdp.coordinator.ledger.value import Ledger
from fthsdp.protos.v1 import coordinator_pb2 as pb


@dataclasses.dataclass(frozen=True)
class Checked:
    """What the checks before a decision changed, to store with it (``Outcome.records``, ``Outcome.stragglers``)."""

    records: tuple[pb.ReplicaRecord, ...] = ()
    stragglers: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Outcome:
    decision: Decision
    """The quorum decision (with the finished mark, already what a finished job does)."""
    finished: pb.JobFinished | None = None
    """The finished mark to store before anything is applied."""
    quorum: Quorum | None = None
    """The quorum to store, then apply and push."""
    restore: pb.Restore | None = None
    """The restore of the lost state to store (the committed step reset to its checkpoint's, a new lineage)."""
    offer: pb.CheckpointRecord | None = None
    """A restore under way since before this coordinator started: offered again, nothing stored."""
    records: tuple[pb.ReplicaRecord, ...] = ()
    """Replica records the checks changed (unreachable marks set or cleared, stragglers' cordons): stored in
    the same transaction, before the quorum that takes those replicas out is pushed."""
    stragglers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The stragglers among ``records`` (replica -> why), taken out only once their cordons are stored."""

    @property
    def durable(self) -> bool:
        return (self.finished is not None or self.quorum is not None or self.restore is not None
                or bool(self.records))

    def change(self, before: Ledger) -> Ledger:
        """The job's ledger once this outcome is stored."""
        after = before
        for record in self.records:
            after = after.with_record(record)
        if self.finished is not None:
            # The committed step starts over with the members' state, which ended with them.
            mark = self.finished
            after = dataclasses.replace(after, committed=next_record(after, 0, mark.quorum_id, mark.unix_ms,
                                                                     finished=mark))
        if self.quorum is not None:
            after = dataclasses.replace(after, quorum=self.quorum)
        if self.restore is not None:
            quorum_id = after.quorum.id if after.quorum is not None else 0
            after = dataclasses.replace(after, committed=next_record(
                after, self.restore.checkpoint.step, quorum_id, self.restore.unix_ms, restore=self.restore,
                new_lineage=True))
        return after


def numbered(previous: Quorum | None, decision: Decision, epoch: int, generation: int,
             created_unix_ms: int) -> Quorum:
    """The quorum ``decision`` forms, numbered after ``previous``."""
    members = decision.members or ()
    new_id = (previous.id if previous else 0) + 1
    return Quorum(
        id=new_id,
        members=members,
        # Members that stay keep the step they were admitted at.
        step=max([decision.head_step, *(m.step for m in members)]),
        created_unix_ms=created_unix_ms,
        reason=decision.reason,
        epoch=epoch,
        generation=generation,
        # A regroup drops nobody, but its members must leave the old group at once.
        last_drop_id=new_id if decision.regroup else next_last_drop_id(previous, new_id, members),
    )
