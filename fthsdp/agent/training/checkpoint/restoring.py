"""Restoring a replica group from a checkpoint: every rank its part, all or none.

Used twice: when the coordinator restores a lost state
(``WatchEvent.restore``, fthsdp/agent/training/catchup/joiner.py), and when a job
starts with ``--resume`` (the newest complete checkpoint on disk, an older
one if it is refused; only for a job that has not trained yet, so that a
replica restarted in a running job, which its agent starts with the same
``--resume``, copies a live peer instead). Every rank loads its part; the ranks agree that all
did before the state's checksum, a collective over the group, is compared
with the one the members recorded at the checkpoint's step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from fthsdp.agent.training.checkpoint.errors import CheckpointError, PartlyLoaded
from fthsdp.agent.training.session.replica_group import ReplicaGroup
from fthsdp.agent.training.state.checksum import HASHES, STATE_HASH

log = logging.getLogger("fthsdp.agent.checkpoint")


class Restorable(Protocol):
    """The state a checkpoint is loaded into (``CatchUpTarget``)."""

    @property
    def step(self) -> int: ...

    def restore(self, path: str, digest: str, rank: int) -> str:
        """Load this rank's part; returns the state checksum the checkpoint
        recorded, as ``kind:hex`` (just ``hex``: the current kind), "" if none."""
        ...

    def state_checksum(self, group: ReplicaGroup, kind: str = STATE_HASH) -> str: ...


def restore_group(target: Restorable, group: ReplicaGroup, path: str, digest: str = "") -> None:
    """Load the checkpoint at ``path`` on every rank; CheckpointError (on every
    rank) if any refused it: PartlyLoaded if any rank's state was written
    into before (the group's state is then neither the one before nor the
    checkpoint's)."""
    began = time.monotonic()
    try:
        # Loaded: this rank's state was replaced, so a refusal on another rank leaves the group's mixed.
        expected, ok, untouched, error = target.restore(path, digest, group.rank), 1, 0, ""
    except CheckpointError as e:
        expected, ok, untouched, error = "", 0, int(not isinstance(e, PartlyLoaded)), str(e)
    all_ok, all_untouched = group.min(ok, untouched)
    if not all_ok:
        refused = CheckpointError if all_untouched else PartlyLoaded
        raise refused(error or "another rank of this replica group could not load its part")
    if expected:
        kind, _, expected = expected.rpartition(":")
        if kind not in HASHES + ("",):
            raise PartlyLoaded(f"{path}: the checkpoint's state checksum is of an unknown kind {kind!r}")
        got = target.state_checksum(group, kind or STATE_HASH)
        if got != expected:
            raise PartlyLoaded(f"{path}: the restored state's checksum {got} differs from the one recorded at "
                               f"its step, {expected}")
    log.info("restored from the checkpoint of step %d in %.2fs: %s", target.step, time.monotonic() - began, path)


def resume_newest(target: Restorable, group: ReplicaGroup, root: Path, job: str, structure: int,
                  job_is_new: Callable[[], bool]) -> int | None:
    """Load the newest complete checkpoint of ``job`` under ``root`` that
    loads (rank 0 names each one to try), if ``job_is_new()`` (asked on rank
    0: a job that has trained already is caught up from, not resumed);
    returns its step, or None if none was loaded."""
    # Here, not at the top: torch.distributed.checkpoint loads only where a checkpoint is read
    # (fthsdp/agent/training/checkpoint/errors.py).
    from fthsdp.agent.training.checkpoint.restore import newest_complete

    names: object = None
    if group.rank == 0:
        if job_is_new():
            names = [str(folder) for _, folder in newest_complete(root, job, structure)]
            if not names:
                log.warning("--resume: no complete checkpoint of job %s in %s: starting at step 0", job, root)
        else:
            log.info("--resume: job %s has trained already: this replica catches up from a live one", job)
            names = []
    names = group.broadcast_json(names)
    assert isinstance(names, list)
    for path in names:
        try:
            restore_group(target, group, path)
            return target.step
        except CheckpointError as e:
            log.error("not resuming from %s: %s; trying the one before", path, e)
    if names:
        raise CheckpointError(f"--resume: none of the {len(names)} checkpoints of job {job} in {root} could be "
                              "loaded (see the errors above)")
    return None
