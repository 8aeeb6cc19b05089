"""The job's newest committed step: kept in the store, given up only on purpose.

The committed step is the highest step any member of a quorum has reported
(``JobState.committed_step``, exact, in memory: heartbeats and registrations
of members raise it). ``fthsdp.coordinator.decisions.quorum.decide`` takes it as an input:
once no member of the previous quorum continues, only replicas at or above
it may form a quorum, so the job never silently starts over from replicas
that lost its state (quorum rule 8).

Write policy. The store (``PREFIX/jobs/JOB/committed``, a ``CommittedStep``
written in the job's ledger, fthsdp/coordinator/ledger/writer.py) holds a *lower bound*:

* with every quorum change, after the quorum itself is stored and pushed
  (never in the way of a push);
* otherwise at most once every ``WRITE_EVERY`` while it grows (or was
  reset: every member left on purpose), and never while it stays (a
  stalled job writes nothing);
* at once on a give-up, before it is acted on or answered;
* after a failed write, not again for ``RETRY_AFTER`` (the store is likely
  down, and the write runs outside the job's lock, so it delays nothing).

So a job costs at most one store write a second for this, whatever its
replica count, against a write per heartbeat's step were it exact. The
price is that the stored step lags the replicas by up to a second: if every
replica is lost *during a failover*, before the new coordinator heard a
member's heartbeat, a replica a second's steps behind would count as
holding the state. A lower bound still catches the case that matters: fresh
replicas at step 0 are never taken for the job.

A coordinator taking a job over loads the record (``load``); a stored
quorum newer than the record (a crash between the two writes) vouches for
its own step as well.

The finished mark. When every member of the last quorum left and at least
one left "finished" (``JobState.finish_mark``), the record is written with
``finished`` set *before* the decision is applied (in the decision's ledger
transaction, fthsdp/coordinator/engine/outcome.py): a
coordinator restart still knows the job is done, and a replica that
arrives later is told so instead of starting the job over alone. Only an
operator's reopen (``reopen``, `fthsdp reopen-job`) clears it.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from fthsdp.coordinator.decisions.quorum_types import Quorum
from fthsdp.coordinator.decisions.status_view import give_up_hint, reopen_hint
from fthsdp.coordinator.ledger.value import Ledger
from fthsdp.coordinator.ledger.writer import LedgerConflict, LedgerWriter
from fthsdp.core.errors import JobNotFinished, LostOwnership, StateNotLost, StoreError
from fthsdp.protos.v1 import coordinator_pb2 as pb

if TYPE_CHECKING:
    from fthsdp.coordinator.job.state import JobState

log = logging.getLogger("fthsdp.coordinator")

WRITE_EVERY = 1.0
"""Seconds between writes of a growing committed step (besides quorum changes)."""

RETRY_AFTER = 5.0
"""Seconds before a failed write is tried again (the store is likely down)."""


class _Keep(enum.Enum):
    KEEP = enum.auto()


KEEP: Final = _Keep.KEEP
"""``CommittedRecord.write``: keep the finished mark as stored."""


@dataclasses.dataclass
class CommittedRecord:
    """One job's committed step as stored (read from its ledger), and when this coordinator last wrote it."""

    ledger: LedgerWriter
    """The job's ledger and its one writer (fthsdp/coordinator/ledger/writer.py)."""
    written_at: float = float("-inf")
    """When this coordinator last wrote it, on its monotonic clock."""
    retry_at: float = float("-inf")
    """After a failed write: not before then."""

    # ----- what is stored ------------------------------------------------------------

    @property
    def stored(self) -> int:
        """The step in the store."""
        return self.ledger.current.committed_step

    @property
    def revision(self) -> int:
        """The stored record's revision (0: absent)."""
        return self.ledger.revisions.get(self.ledger.keys.committed, 0)

    @property
    def quorum_id(self) -> int:
        """The quorum id the stored record names."""
        c = self.ledger.current.committed
        return c.quorum_id if c is not None else 0

    @property
    def last_give_up(self) -> pb.GiveUp | None:
        return self.ledger.current.last_give_up

    @property
    def last_restore(self) -> pb.Restore | None:
        """The latest restore from a checkpoint (fthsdp/coordinator/engine/checkpoints.py)."""
        return self.ledger.current.last_restore

    @property
    def finished(self) -> pb.JobFinished | None:
        """The stored finished mark (None: the job is not finished)."""
        return self.ledger.current.finished

    @property
    def generation(self) -> int:
        """The job's lineage (CommittedStep.generation): one more with every restore or give-up."""
        return self.ledger.current.generation

    @property
    def lineage_from(self) -> int:
        """The quorum id current when that lineage began."""
        return self.ledger.current.lineage_from

    def load(self, quorum: Quorum | None) -> int:
        """The committed step to start from, once the ledger is loaded."""
        step = self.stored
        # A quorum stored after the record was (or by a version without the
        # record at all) holds members at its step; one the record names
        # or predates may be the one a give-up gave up.
        if quorum is not None and quorum.id > self.quorum_id:
            step = max(step, quorum.step)
        return step

    # ----- writing -------------------------------------------------------------------

    def due(self, step: int, quorum_id: int, now: float) -> bool:
        """Whether to write now (see the module docstring's write policy)."""
        if now < self.retry_at:
            return False
        if quorum_id != self.quorum_id:
            return True  # a new quorum: at once
        # Down too: the state ended or was given up (the give-up writes its own).
        return step != self.stored and now - self.written_at >= WRITE_EVERY

    async def write(self, step: int, quorum_id: int, unix_ms: int, give_up: pb.GiveUp | None = None,
                    finished: pb.JobFinished | None | _Keep = KEEP,
                    restore: pb.Restore | None = None, new_lineage: bool = False) -> Adopted | None:
        """Store ``step`` in the job's ledger, with the finished mark as it
        is unless ``finished`` is given (None clears it); with
        ``new_lineage`` (a restore, a give-up), the next generation, begun
        at ``quorum_id``. Returns None on success, or what another
        coordinator wrote meanwhile (the ledger holds it now, so the next
        write can succeed)."""
        def change(before: Ledger) -> Ledger:
            return dataclasses.replace(before, committed=next_record(before, step, quorum_id, unix_ms, give_up,
                                                                     finished, restore, new_lineage))

        mine = self.ledger.current.committed
        try:
            await self.ledger.update(change)
        except LedgerConflict:
            return Adopted(self.ledger.current.committed or pb.CommittedStep(), mine)
        return None


def next_record(before: Ledger, step: int, quorum_id: int, unix_ms: int, give_up: pb.GiveUp | None = None,
                finished: pb.JobFinished | None | _Keep = KEEP, restore: pb.Restore | None = None,
                new_lineage: bool = False) -> pb.CommittedStep:
    """The committed-step record that follows ``before``'s (see ``CommittedRecord.write``)."""
    last = give_up if give_up is not None else before.last_give_up
    restored = restore if restore is not None else before.last_restore
    mark = before.finished if finished is KEEP else finished
    generation, lineage_from = ((before.generation + 1, quorum_id) if new_lineage
                                else (before.generation, before.lineage_from))
    msg = pb.CommittedStep(step=step, quorum_id=quorum_id, updated_unix_ms=unix_ms, generation=generation,
                           lineage_from=lineage_from)
    if last is not None:
        msg.last_give_up.CopyFrom(last)
    if restored is not None:
        msg.last_restore.CopyFrom(restored)
    if mark is not None:
        msg.finished.CopyFrom(mark)
    return msg


@dataclasses.dataclass(frozen=True)
class Adopted:
    """What another coordinator wrote over this one's record, and what this one held before."""

    theirs: pb.CommittedStep
    mine: pb.CommittedStep | None


async def sync(record: CommittedRecord, state: JobState, now: float, unix_ms: int) -> None:
    """Write the job's committed step if the policy says so; called by the
    decision loop after each decision (and push). A failure is retried
    after RETRY_AFTER: the stored step is a lower bound, allowed to lag."""
    quorum_id = state.quorum.id if state.quorum else 0
    step = state.committed_step
    if not record.due(step, quorum_id, now):
        return
    try:
        adopted = await record.write(step, quorum_id, unix_ms)
    except StoreError as e:
        record.retry_at = now + RETRY_AFTER
        log.debug("job %s: committed step %d not stored yet: %s", state.name, step, e)
        return
    record.written_at = now
    if adopted is not None:
        adopt(state, adopted)


def adopt(state: JobState, adopted: Adopted) -> None:
    """Another coordinator wrote the record (the ledger holds it now): a
    give-up it took is the operator's newer intent; otherwise the higher
    step stands."""
    theirs, mine = adopted.theirs, adopted.mine or pb.CommittedStep()
    newer = theirs.HasField("last_give_up") and (
        not mine.HasField("last_give_up") or theirs.last_give_up != mine.last_give_up)
    restored = theirs.HasField("last_restore") and (
        not mine.HasField("last_restore") or theirs.last_restore != mine.last_restore)
    if newer:
        state.give_up_state(theirs.step)
    elif restored:
        state.give_up_state(theirs.step)
        state.restore = theirs.last_restore.checkpoint
    else:
        state.committed_step = max(state.committed_step, theirs.step)
    # A finish or a reopen the other coordinator stored is as current as its step (the state reads the
    # mark from the ledger); a reopen must make the job decide again.
    if mine.HasField("finished") and not theirs.HasField("finished"):
        state.reopen()
    log.warning("job %s: the committed step was written by another coordinator (step %d%s)",
                state.name, theirs.step, ", after a give-up" if newer else "")


async def give_up(record: CommittedRecord, state: JobState, request: pb.GiveUpStateRequest, peer: str,
                  coordinator: str, epoch: int, now: float, wall: Callable[[], float]) -> pb.GiveUp:
    """Give up a lost state at ``request.step``: refused (StateNotLost)
    unless it is lost at exactly that step now; the reset is stored before
    it is applied. The caller holds the job's lock."""
    lost = state.lost_step_now(now)
    if lost != request.step:
        raise StateNotLost(_refusal(state, request.step, lost))
    unix_ms = int(wall() * 1000)
    quorum_id = state.quorum.id if state.quorum else 0
    record_msg = pb.GiveUp(step=request.step, unix_ms=unix_ms, requested_by=request.requested_by, peer=peer,
                           coordinator=coordinator, epoch=epoch, quorum_id=quorum_id)
    adopted = await record.write(0, quorum_id, unix_ms, record_msg, new_lineage=True)
    if adopted is not None:
        adopt(state, adopted)
        raise LostOwnership(f"the committed step of job {state.name} was changed by another coordinator; "
                            "look at the status and try again")
    record.written_at = now
    state.give_up_state(0)
    # This line is both the record of the give-up and the end of the loss.
    log.warning(
        "job %s: state loss at step %d ended: given up by %s (from %s); forming a quorum of the replicas there are",
        state.name, request.step, request.requested_by or "an unnamed operator", peer or "an unknown address",
        extra={"event": "state_given_up", "job": state.name, "step": request.step,
               "requested_by": request.requested_by, "peer": peer, "quorum_id": quorum_id},
    )
    return record_msg


async def reopen(record: CommittedRecord, state: JobState, request: pb.ReopenJobRequest, peer: str,
                 wall: Callable[[], float]) -> pb.JobFinished:
    """Reopen a job finished at exactly ``request.step``: refused
    (JobNotFinished) otherwise; the cleared mark is stored before it is
    applied. The caller holds the job's lock."""
    mark = state.finished
    if mark is None or mark.step != request.step:
        raise JobNotFinished(
            f"job {state.name!r} is not finished; nothing to reopen" if mark is None else
            f"job {state.name!r} finished at step {mark.step}, not {request.step}; "
            f"{reopen_hint(state.name, mark.step)} if that is meant")
    quorum_id = state.quorum.id if state.quorum else 0
    adopted = await record.write(state.committed_step, quorum_id, int(wall() * 1000), None, None)
    if adopted is not None:
        adopt(state, adopted)
        raise LostOwnership(f"the committed step of job {state.name} was changed by another coordinator; "
                            "look at the status and try again")
    state.reopen()
    log.warning("job %s: reopened by %s (from %s); it had finished at step %d; quorums form again",
                state.name, request.requested_by or "an unnamed operator", peer or "an unknown address", mark.step,
                extra={"event": "job_reopened", "job": state.name, "step": mark.step,
                       "requested_by": request.requested_by, "peer": peer})
    return mark


def _refusal(state: JobState, step: int, lost: int) -> str:
    if not lost:
        held = f"committed step {state.committed_step}" if state.committed_step else "no committed step yet"
        return f"job {state.name!r} has not lost its state ({held}); nothing to give up"
    return (f"job {state.name!r} lost its state at step {lost}, not {step}; "
            f"{give_up_hint(state.name, lost)} if that is meant")


def report_transition(state: JobState, before: int, ended: int = 0) -> bool:
    """Log the start and the end of a state loss, one line each (not one
    per decision), and a state that its members ended at step ``ended``;
    True if a loss began or ended, so that watchers are told."""
    if ended:
        log.info("job %s: every member left at step %d (finished or drained); the next replicas start over",
                 state.name, ended, extra={"job": state.name, "event": "state_ended", "step": ended})
    after = state.state_lost_step
    if after == before:
        return False
    fields = {"job": state.name, "committed_step": state.committed_step}
    if before:  # a give-up ends it in ``give_up``'s own line
        log.warning("job %s: state loss at step %d ended: a replica holding it is back", state.name, before,
                    extra={**fields, "event": "state_loss_ended", "step": before})
    if after:
        log.error("job %s: STATE LOST at step %d: %s; no quorum until a replica holding it returns (%s)",
                  state.name, after, state.state_lost, give_up_hint(state.name, after),
                  extra={**fields, "event": "state_lost", "step": after, "remains": state.state_lost})
    return True
