"""The source side of catch-up: what a replica's catch-up server serves.

Two threads meet here. The HTTP server's threads ask for a snapshot and read
snapshots and the gradient log; the training thread, at each step boundary,
takes the snapshot asked for and appends to the log (fthsdp/agent/training/step/replica_step.py). The
training thread never waits for a joiner: a request only sets a flag that the
next step boundary reads, and serving runs from the host copy.

Snapshots are released when the joiner says it is done (DELETE) or after
``idle_timeout`` seconds without a request (a joiner that died), so nobody
has to notice a dead joiner.
"""

from __future__ import annotations

import threading
import time

import torch

from fthsdp.agent.training.catchup.grad_log import GradientLog
from fthsdp.agent.training.state.snapshot import DEFAULT_CHUNK_BYTES, Snapshot

IDLE_TIMEOUT = 30.0


class SnapshotUnavailable(Exception):
    """No snapshot was taken in time (the source is not training) or it failed."""


class ServedState:
    def __init__(
        self,
        replica_id: str,
        shard_rank: int,
        structure_hash: int,
        log: GradientLog,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        idle_timeout: float = IDLE_TIMEOUT,
    ) -> None:
        self.replica_id = replica_id
        self.shard_rank = shard_rank
        self.structure_hash = structure_hash
        self.log = log
        self.chunk_bytes = chunk_bytes
        self.idle_timeout = idle_timeout
        self._cond = threading.Condition()
        self._requested = False
        self._snapshots: dict[int, Snapshot] = {}
        self._spare: torch.Tensor | None = None
        self._copying: list[Snapshot] = []
        self._generation = 0
        self._latest: Snapshot | None = None
        self._inputs: bytes = b""
        """The recorded inputs of the step this replica is in (a serialized
        ``LogEntry`` without data, published when its all-reduce starts):
        what a joiner that enters that step restores before its update."""

    # ----- HTTP threads --------------------------------------------------------------

    def request_snapshot(self, timeout: float) -> Snapshot:
        """A snapshot taken at this replica's next step boundary (or the one
        taken at the current boundary, if no step was committed since)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            current = self._snapshots.get(self.log.head)
            if current is None:
                self._requested = True
                generation = self._generation
                while self._generation == generation:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._requested = False
                        raise SnapshotUnavailable(f"no step boundary within {timeout:g}s: is this replica training?")
                    self._cond.wait(left)
                current = self._latest
                assert current is not None  # take() set it with the new generation
            current.last_used = time.monotonic()
        return self._ready(current, deadline)

    def snapshot(self, step: int, timeout: float) -> Snapshot:
        """The snapshot of ``step``, waiting for it to be taken (the ranks of a
        group take theirs at the same boundary, not at the same instant)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while (snap := self._snapshots.get(step)) is None:
                left = deadline - time.monotonic()
                if left <= 0 or self.log.head > step:
                    raise SnapshotUnavailable(f"this replica holds no snapshot of step {step}")
                self._cond.wait(left)
            snap.last_used = time.monotonic()
        return self._ready(snap, deadline)

    def inputs(self) -> bytes:
        with self._cond:
            return self._inputs

    def _ready(self, snap: Snapshot, deadline: float) -> Snapshot:
        if not snap.ready.wait(max(0.0, deadline - time.monotonic())):
            raise SnapshotUnavailable(f"the snapshot of step {snap.step} is still being copied")
        if snap.error is not None:
            raise SnapshotUnavailable(f"the snapshot of step {snap.step} failed: {snap.error}")
        return snap

    def release(self, step: int) -> bool:
        with self._cond:
            snap = self._snapshots.pop(step, None)
            if snap is None:
                return False
            self.log.unpin(step)
            if snap.data_copied.is_set() and snap.error is None:
                self._spare = snap.buffer  # the next snapshot of the same size reuses it
            return True

    # ----- the training thread -------------------------------------------------------

    def publish_inputs(self, entry) -> None:
        """The inputs of the step whose all-reduce starts now (immutable once published)."""
        data = entry.SerializeToString()
        with self._cond:
            self._inputs = data

    @property
    def wanted(self) -> bool:
        """Whether a joiner asked for a snapshot since the last one."""
        return self._requested

    def take(self, step: int, state: dict) -> Snapshot:
        """Take the snapshot of ``step`` (the committed step) from ``state``
        (fthsdp.agent.training.state.snapshot.capture_state); the copy runs in the background."""
        with self._cond:
            self._expire()
            spare, self._spare = self._spare, None
            snap = Snapshot(step, self.replica_id, self.shard_rank, self.structure_hash, state, self.chunk_bytes, spare)
            snap.start()
            self._copying.append(snap)
            if step not in self._snapshots:
                self.log.pin(step)
            self._snapshots[step] = snap
            self._latest = snap
            self._generation += 1
            self._requested = False
            self._cond.notify_all()
            return snap

    def wait_copied(self, timeout: float) -> None:
        """Before the state changes again: the copies taken must be complete."""
        copying, self._copying = self._copying, []
        for snap in copying:
            snap.wait_copied(timeout)

    def touch(self, from_step: int) -> None:
        """A joiner reads the log from ``from_step``: the snapshots it may
        have started from stay held (they pin the log it replays)."""
        now = time.monotonic()
        with self._cond:
            for step, snap in self._snapshots.items():
                if step <= from_step:
                    snap.last_used = now

    def _expire(self) -> None:
        now = time.monotonic()
        for step, snap in list(self._snapshots.items()):
            if snap.ready.is_set() and now - snap.last_used > self.idle_timeout:
                del self._snapshots[step]
                self.log.unpin(step)

    def expire(self) -> None:
        with self._cond:
            self._expire()

    @property
    def held(self) -> list[int]:
        """The steps of the snapshots held (for tests and status)."""
        with self._cond:
            return sorted(self._snapshots)
