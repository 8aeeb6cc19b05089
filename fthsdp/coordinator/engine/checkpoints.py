"""The job's complete checkpoints, and the restore of a lost state from the newest.

Replicas write checkpoints themselves (fthsdp/agent/training/checkpoint/);
the one that seals a checkpoint reports it on its heartbeats
(``HeartbeatRequest.checkpoint``). The coordinator keeps the newest few
under ``PREFIX/jobs/JOB/checkpoint`` (a ``CheckpointList`` in the job's ledger, written
after the decision, outside the job's lock, and retried
after a failure like the committed step: fthsdp/coordinator/engine/committed.py).

Restore. When the job's committed state is lost (no live replica holds
it) and a complete checkpoint is recorded, the coordinator restores it,
unless ``--no-auto-restore``: the committed step becomes the checkpoint's
and the restore is stored with it (``CommittedStep.last_restore``) before
it is acted on; then every watcher is sent ``WatchEvent.restore`` until the
quorum formed at that step has trained past it. A replica not at that step
loads the checkpoint (checking every file and the state's checksum) and so
holds the state; meanwhile no replica is given a peer to copy (a quorum
formed at the checkpoint's step may still wait for more replicas before it
trains, and a member that waits serves no copy).
The steps committed after the checkpoint are lost; the log line and the
status say how many. The first quorum after a restore waits for the
members of the quorum whose state was lost, up to ``join_timeout``
(fthsdp/coordinator/decisions/restore_wait.py); a coordinator that starts meanwhile
finds the restore under way in the store (``under_way``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from fthsdp.coordinator.ledger.value import Ledger
from fthsdp.coordinator.ledger.writer import LedgerConflict, LedgerWriter
from fthsdp.core.errors import LostOwnership, NotFound, StateNotLost, StoreError
from fthsdp.protos.v1 import coordinator_pb2 as pb

if TYPE_CHECKING:
    from fthsdp.coordinator.decisions.quorum_types import Quorum
    from fthsdp.coordinator.engine.committed import CommittedRecord
    from fthsdp.coordinator.job.state import JobState

log = logging.getLogger("fthsdp.coordinator")

KEPT = 8
"""Records kept in the store (the replicas keep their own number on disk)."""
RETRY_AFTER = 1.0
"""Seconds before a failed write is tried again."""


@dataclasses.dataclass
class CheckpointBook:
    """The job's complete checkpoints: the stored ones (in its ledger) and those reported since."""

    ledger: LedgerWriter
    """The job's ledger and its one writer (fthsdp/coordinator/ledger/writer.py)."""
    pending: list[pb.CheckpointRecord] = dataclasses.field(default_factory=list)
    """Reported, not stored yet, oldest first."""
    refused: set[str] = dataclasses.field(default_factory=set)
    """Digests a replica could not restore: dropped at the next write."""
    logged_refusals: set[str] = dataclasses.field(default_factory=set)
    fenced: set[str] = dataclasses.field(default_factory=set)
    """Digests reported from outside the job's lineage, logged once (``lineage_refusal``)."""
    retry_at: float = float("-inf")
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock, repr=False, compare=False)
    """One ``sync`` at a time: it takes what is pending, writes it and drops what it wrote."""

    @property
    def records(self) -> list[pb.CheckpointRecord]:
        """Stored, newest first."""
        return list(self.ledger.current.checkpoints)

    @property
    def newest(self) -> pb.CheckpointRecord | None:
        """The newest known, stored or not."""
        if self.pending:
            return self.pending[-1]
        usable = self.usable
        return usable[0] if usable else None

    @property
    def usable(self) -> list[pb.CheckpointRecord]:
        """The stored ones no replica refused, newest first."""
        return [r for r in self.ledger.current.checkpoints if r.digest not in self.refused]

    @property
    def dirty(self) -> bool:
        return bool(self.pending) or any(r.digest in self.refused for r in self.ledger.current.checkpoints)

    def report(self, record: pb.CheckpointRecord) -> bool:
        """A sealer's report, of the job's lineage (``lineage_refusal``): kept
        if it is newer than every record; True if it was."""
        newest = self.newest
        if not record.step or not record.path or not record.digest:
            return False
        if newest is not None and (record.generation, record.step) <= (newest.generation, newest.step):
            return False
        self.pending.append(record)
        return True

    def refuse(self, digest: str) -> pb.CheckpointRecord | None:
        """A replica could not restore this checkpoint: it is dropped (stored
        at the next ``sync``), so that a restore takes the one before. Returns it
        if it was recorded."""
        for record in self.ledger.current.checkpoints:
            if record.digest == digest:
                self.refused.add(digest)
                return record
        return None

    async def write(self, reported: list[pb.CheckpointRecord]) -> bool:
        """Store ``reported`` (newest last) before the records (heartbeats
        may report more meanwhile, on the loop, and ``sync`` drops only these
        from ``pending``). False if another coordinator wrote meanwhile: the
        ledger holds its records now."""
        def change(before: Ledger) -> Ledger:
            newer = list(reversed(reported))
            usable = [r for r in before.checkpoints if r.digest not in self.refused]
            older = [r for r in usable if not newer or r.step < newer[-1].step]
            records = [*newer, *older]
            kept = records[0].kept if records and records[0].kept > 0 else KEPT
            return dataclasses.replace(before, checkpoints=tuple(records[:min(KEPT, kept)]))  # replicas delete older

        try:
            await self.ledger.update(change)
        except LedgerConflict:
            return False
        return True


def lineage_refusal(record: pb.CheckpointRecord, sender: str, state: JobState) -> str:
    """Why a sealed checkpoint that ``sender`` reports is not the job's, or
    "": it must be of the job's lineage (its generation, and a quorum formed
    since that lineage began: a quorum cut from the coordinator that trained
    on wrote it otherwise) and come from a member of the quorum that
    committed its step."""
    if record.generation != state.generation:
        return f"it is of lineage {record.generation}, the job's is {state.generation} (restored since)"
    if record.quorum_id <= state.lineage_from:
        return (f"quorum {record.quorum_id} wrote it, before lineage {state.generation} began in quorum "
                f"{state.lineage_from + 1}")
    if not state.was_member(sender, record.quorum_id):
        return f"{sender} was not a member of quorum {record.quorum_id}, which committed step {record.step}"
    return ""


async def sync(book: CheckpointBook, job: str, now: float) -> None:
    """Store a reported checkpoint (after the decision, outside the job's lock)."""
    async with book.lock:
        if not book.dirty or now < book.retry_at:
            return
        reported = list(book.pending)
        try:
            stored = await book.write(reported)
        except StoreError as e:
            book.retry_at = now + RETRY_AFTER
            log.debug("job %s: the checkpoint records are not stored yet: %s", job, e)
            return
        newest = book.records[0].step if book.records else 0
        written = reported if stored else []  # else tried again, unless the other coordinator has newer ones
        book.pending = [r for r in book.pending if r not in written and r.step > newest]
        for record in reported if stored else []:
            log.info("job %s: checkpoint of step %d complete (%d shares, %.1f MB, sealed by %s): %s", job,
                     record.step, record.shares, record.bytes / 1e6, record.sealed_by, record.path,
                     extra={"event": "checkpoint", "job": job, "step": record.step, "path": record.path})


def to_restore(book: CheckpointBook, committed: CommittedRecord, lost: int) -> tuple[pb.CheckpointRecord | None, bool]:
    """The checkpoint to restore a state lost at step ``lost`` from (None:
    none, or the state is not lost), and whether the restore is still to be
    stored (False: it is under way since before a coordinator restart, and
    is only offered again)."""
    record = book.usable[0] if book.usable else None
    if not lost or record is None or record.step > lost:
        return None, False
    last = committed.last_restore
    if last is not None and last.checkpoint.digest == record.digest and lost == record.step:
        return record, False
    return record, True


async def restore_if_lost(book: CheckpointBook, committed: CommittedRecord, state: JobState,
                          now: float, wall: Callable[[], float]) -> bool:
    """Restore the newest checkpoint if the state is lost now (the caller
    holds the job's lock and checks the setting). True if it did."""
    record, to_store = to_restore(book, committed, state.state_lost_step)
    if record is None:
        return False
    if not to_store:
        if state.restore is None:
            state.restore = record  # under way since before a coordinator restart: offered again
        return False
    try:
        await restore(book, committed, state, record, state.state_lost_step, now, wall, "automatic")
    except StoreError as e:
        log.warning("job %s: restoring the checkpoint of step %d is pending: %s", state.name, record.step, e)
        return False
    return True


def under_way(book: CheckpointBook, committed: CommittedRecord, quorum: Quorum | None) -> pb.CheckpointRecord | None:
    """The checkpoint a stored restore is loading, as a coordinator finds
    it when it starts: the restore reset the committed step to its step,
    naming the quorum whose state was lost, and no quorum formed since
    (one would have a higher id). None if there is none, or no replica
    may load it any more (refused, or no longer kept)."""
    last = committed.last_restore
    if last is None or quorum is None or quorum.id != committed.quorum_id or committed.stored != last.checkpoint.step:
        return None
    if not any(r.digest == last.checkpoint.digest for r in book.usable):
        return None
    return last.checkpoint


async def restore_by_request(book: CheckpointBook, committed: CommittedRecord, state: JobState,
                             req: pb.RestoreCheckpointRequest, peer: str, now: float,
                             wall: Callable[[], float]) -> pb.Restore:
    """An operator's restore (`fthsdp restore`): refused unless the state is
    lost now and a complete checkpoint of ``req.step`` is recorded. The
    caller holds the job's lock."""
    lost = state.lost_step_now(now)
    if not lost:
        raise StateNotLost(f"job {state.name}'s state is not lost (a live replica holds step "
                           f"{state.committed_step}): there is nothing to restore")
    record = next((r for r in book.usable if r.step == req.step), None)
    if record is None:
        steps = ", ".join(str(r.step) for r in book.usable) or "none"
        raise NotFound(f"job {state.name} has no complete checkpoint of step {req.step} (recorded: {steps})")
    if record.step > lost:
        raise StateNotLost(f"the checkpoint of step {record.step} is newer than the state lost at step {lost}")
    who = req.requested_by or "an unnamed operator"
    return await restore(book, committed, state, record, lost, now, wall, f"{who} (from {peer})")


def restore_message(record: pb.CheckpointRecord, lost: int, unix_ms: int, requested_by: str) -> pb.Restore:
    return pb.Restore(checkpoint=record, lost_step=lost, unix_ms=unix_ms, requested_by=requested_by)


async def restore(book: CheckpointBook, committed: CommittedRecord, state: JobState,
                  record: pb.CheckpointRecord, lost: int, now: float, wall: Callable[[], float],
                  requested_by: str) -> pb.Restore:
    """Store the restore with the committed step reset to the checkpoint's,
    then act on it. StoreError if it could not be stored (nothing changed)."""
    unix_ms = int(wall() * 1000)
    msg = restore_message(record, lost, unix_ms, requested_by)
    quorum_id = state.quorum.id if state.quorum else 0
    if await committed.write(record.step, quorum_id, unix_ms, None, restore=msg, new_lineage=True) is not None:
        raise LostOwnership(f"the committed step of job {state.name} was changed by another coordinator; "
                            "look at the status and try again")
    restored(committed, state, msg, now)
    return msg


def restored(committed: CommittedRecord, state: JobState, msg: pb.Restore, now: float) -> None:
    """Act on a restore once it is stored: the committed step is the checkpoint's, the loss is over, and
    every watcher is sent the checkpoint to load."""
    record = msg.checkpoint
    committed.written_at = now
    state.give_up_state(record.step)
    state.restore = record
    log.warning(
        "job %s: state lost at step %d: restoring the checkpoint of step %d (%d committed steps lost; %s): %s",
        state.name, msg.lost_step, record.step, msg.lost_step - record.step, msg.requested_by, record.path,
        extra={"event": "restore", "job": state.name, "lost_step": msg.lost_step, "step": record.step,
               "path": record.path, "requested_by": msg.requested_by, "generation": state.generation},
    )
