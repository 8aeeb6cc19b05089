"""Periodic checkpoints of the committed state, written in the background.

At a step boundary that is a checkpoint step, the same on every member (a
multiple of ``--checkpoint-every N``; or, for ``--checkpoint-every 30m``,
the boundary of the first step in whose all-reduce some member said its
clock ran out: FTAR's CHECKPOINT_SLOT), each member's training
thread stages its share (a host copy of about 1/R of the state, R the
members that committed the step) and hands it to this saver's thread,
which writes it while training goes on. Rank 0 of the member with share
index 0 then waits for every share's record, seals the checkpoint
(fthsdp/agent/training/checkpoint/seal.py), reports it through
``on_sealed`` (the coordinator records it as the job's newest complete
checkpoint) and deletes checkpoints older than the newest ``keep``.

One save is in flight at a time: a checkpoint step reached while the
previous save still writes is skipped, with one warning line, rather than
stalling the step. The member that skips says so in its share's folder
(``layout.SKIPPED_RECORD``, written on a thread of its own: the storage may
be what is slow), so that the sealer gives that checkpoint up at once
instead of waiting ``seal_timeout`` for a share that never comes (at the
end of a job, that wait held every member's exit). A failed write (a full disk, a lost mount) is one
error line; that checkpoint stays incomplete and is never used, and the
next one is tried as usual.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from fthsdp.agent.training.checkpoint import layout
from fthsdp.agent.training.checkpoint.errors import CheckpointError
from fthsdp.agent.training.checkpoint.seal import Sealed, missing_shares, seal, skipped_shares
from fthsdp.agent.training.checkpoint.share import ShareSpec, StagingBuffers, stage, write
from fthsdp.core.every import Every

log = logging.getLogger("fthsdp.agent.checkpoint")

SEAL_POLL = 0.05
"""Seconds between looks for the other shares' records (the sealer's thread only)."""


class Saver:
    def __init__(self, root: Path, job: str, *, every: Every, keep: int, seal_timeout: float,
                 on_sealed: Callable[[Sealed], None], now: float) -> None:
        """``seal_timeout``: how long the sealer waits for the other shares
        (a member lost mid-save leaves its share unwritten: the checkpoint
        is then incomplete)."""
        self.root, self.job = root, job
        self.every, self.keep = every, keep
        self._since = now
        """When this member last saved (or started): the clock of ``--checkpoint-every 30m``."""
        self.seal_timeout = seal_timeout
        self._on_sealed = on_sealed
        self._thread: threading.Thread | None = None
        self._writing = threading.Event()
        """Set while this rank's share is being written."""
        self._superseded = threading.Event()
        """The next checkpoint step came: a seal still waiting for shares gives up."""
        self._stop = threading.Event()
        self._buffers = StagingBuffers()
        """Reused from one checkpoint to the next: staged into only when no write is in flight."""
        self.last_sealed: Sealed | None = None

    def due(self, step: int) -> bool:
        """Whether the boundary after ``step - 1`` (the state at ``step``) is a
        checkpoint step by count (``--checkpoint-every N``): every member
        computes the same alone."""
        return self.every.steps > 0 and step > 0 and step % self.every.steps == 0

    def clock_ran_out(self, now: float) -> bool:
        """Whether this member asks for a checkpoint at the step in progress
        (``--checkpoint-every T``): T has passed since it last saved. The
        members agree through the step's all-reduce (any member asking is
        enough), so they all save at the same boundary."""
        return self.every.seconds > 0 and now - self._since >= self.every.seconds

    def save(self, capture: dict, spec: ShareSpec, state_checksum: str | Callable[[], str], now: float) -> bool:
        """Stage this rank's share now and write it in the background; False
        if the previous save still writes (this checkpoint is skipped).
        ``state_checksum``: the members' checksum of the state, or how the
        writer gets it (it may still be computed off the training thread:
        fthsdp/agent/training/step/background_checksum.py). A
        previous checkpoint still waiting for other shares is given up: one
        that is not complete by the next checkpoint step never will be (a
        member was lost mid-save). ``now`` restarts the clock of a timed interval."""
        self._since = now
        if self._writing.is_set():
            log.warning("checkpoint of step %d skipped: the one before is still being written (save less often, "
                        "or give the writers faster storage)", spec.step)
            threading.Thread(target=self._say_skipped, args=(spec,), name="fthsdp-checkpoint-skip",
                             daemon=True).start()
            return False
        if self._thread is not None and self._thread.is_alive():
            self._superseded.set()
            self._thread.join()  # it only waits for the other shares: it ends at once
        self._superseded.clear()
        began = time.monotonic()
        staged = stage(capture, spec, self._buffers)
        log.debug("checkpoint of step %d: %d bytes staged in %.3fs", spec.step, staged.nbytes,
                  time.monotonic() - began)
        self._writing.set()
        self._thread = threading.Thread(target=self._write, args=(staged, state_checksum),
                                        name="fthsdp-checkpoint", daemon=True)
        self._thread.start()
        return True

    def close(self, timeout: float) -> None:
        """Let a save in flight finish (up to ``timeout`` seconds), so that a
        replica that stops right after a checkpoint step still writes its share."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("a checkpoint save was still running after %.0fs; it is left incomplete", timeout)
        self._stop.set()

    # ----- the saver's threads ----------------------------------------------------------

    def _say_skipped(self, spec: ShareSpec) -> None:
        share = (layout.step_folder(self.root, self.job, spec.step, spec.generation)
                 / layout.share_folder_name(spec.share, spec.rank))
        try:
            share.mkdir(parents=True, exist_ok=True)
            layout.write_record(share / layout.SKIPPED_RECORD, {
                "format": layout.FORMAT, "job": spec.job, "step": spec.step, "quorum_id": spec.quorum_id,
                "share": spec.share, "rank": spec.rank, "reason": "the previous save was still being written"})
        except OSError as e:  # the sealer then waits its seal_timeout, as for a lost member
            log.debug("checkpoint of step %d: could not record the skip: %s", spec.step, e)

    def _write(self, staged, state_checksum: str | Callable[[], str]) -> None:
        spec = staged.spec
        folder = layout.step_folder(self.root, self.job, spec.step, spec.generation)
        began = time.monotonic()
        try:
            write(staged, folder, state_checksum() if callable(state_checksum) else state_checksum)
        except (OSError, RuntimeError) as e:  # a full disk, a lost mount; the checksum's computation failed
            log.error("checkpoint of step %d: this replica's share was not written (%s); the checkpoint stays "
                      "incomplete and is never used", spec.step, e)
            return
        finally:
            self._writing.clear()
        log.debug("checkpoint of step %d: share %d of %d written in %.2fs", spec.step, spec.share, spec.shares,
                  time.monotonic() - began)
        if spec.share != 0 or spec.rank != 0:
            return
        deadline = time.monotonic() + self.seal_timeout
        while missing := missing_shares(folder, spec.shares, spec.ranks, spec.quorum_id):
            if skipped := skipped_shares(folder, spec.shares, spec.ranks, spec.quorum_id):
                log.warning("checkpoint of step %d is incomplete: %s skipped it (the save before was still being "
                            "written there); it is never used", spec.step, ", ".join(skipped))
                return
            if time.monotonic() > deadline or self._stop.is_set() or self._superseded.is_set():
                log.warning("checkpoint of step %d is incomplete: %s not written after %.0fs (a member lost "
                            "mid-save?); it is never used", spec.step, ", ".join(missing),
                            time.monotonic() - began)
                return
            self._superseded.wait(SEAL_POLL)
        try:
            sealed = seal(folder, job=spec.job, step=spec.step, structure=spec.structure, shares=spec.shares,
                          ranks=spec.ranks, quorum_id=spec.quorum_id, generation=spec.generation)
        except (OSError, CheckpointError) as e:
            log.error("checkpoint of step %d could not be sealed: %s; it is never used", spec.step, e)
            return
        self.last_sealed = sealed
        log.info("checkpoint of step %d complete: %d shares, %.1f MB, %.2fs after the step", spec.step,
                 spec.shares * spec.ranks, sealed.nbytes / 1e6, time.monotonic() - began)
        self._on_sealed(sealed)
        self._prune(layout.Slot(spec.generation, spec.step))

    def _prune(self, newest: layout.Slot) -> None:
        """Delete every checkpoint older than the newest ``keep`` complete ones
        (an incomplete one older than the newest complete one too); an older
        lineage's count as older than every one of a newer lineage."""
        slots = layout.slots_in(self.root, self.job)
        complete = [s for s in slots if (layout.slot_folder(self.root, self.job, s) / layout.CHECKPOINT_RECORD)
                    .exists()]
        kept = set(complete[-self.keep:])
        for slot in slots:
            if slot < newest and slot not in kept:
                shutil.rmtree(layout.slot_folder(self.root, self.job, slot), ignore_errors=True)
