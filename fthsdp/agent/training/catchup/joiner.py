"""The joiner's side of catch-up: from a source assignment to admission.

A replica that registers behind the quorum (restarted, or new) is named a
source by the coordinator (``WatchEvent.catch_up``). Then, without the
members ever waiting for it:

1. Snapshot. Rank 0 asks the source's rank 0 for a snapshot; the source
   takes it at its next step boundary (every rank of the source group at the
   same one) and copies it to host memory in the background. Rank k of the
   joiner pulls the shard of rank k of the source, verified chunk by chunk.
2. Replay. The joiner loads the state and replays, from the source's
   gradient log, the optimizer steps the members took meanwhile (the joiner
   replays faster than they train: no forward or backward pass). The first
   entry carries the source's state checksum after that step (computed on
   request); the joiner compares its own: a mismatch refuses this catch-up
   and it starts over from a fresh snapshot.
3. Ready. Verified and within ``READY_GAP`` steps of the source's head (or
   no longer gaining on it: members whose steps take about as long as a
   replay; they then wait once, at the admission, for the rest), it tells
   the coordinator it is ready (an immediate heartbeat) and follows the log
   until a quorum admits it. ``Manager.start()`` then takes the replica's
   first step in the quorum without a gradient (its state has none for the
   members' step), closing the last step or two it may still lack inside
   FTAR's first collective in the new quorum, and returns at the members'
   next step: the members never wait for the joiner's forward and backward
   pass, and the training loop never sees its step jump.

A job that finished (every member of its last quorum left finished) has
nothing to join: the coordinator says so in its push and ``run`` raises
``JobFinished`` on every rank of the group (fthsdp/agent/training/session/job_finished.py).

The source dying mid-transfer makes the coordinator name another source; the
joiner starts over from it (a snapshot from another replica is at another
step, so the bytes already received cannot be reused; an interrupted
connection to a *live* source resumes where it stopped instead).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from fthsdp.agent.training.catchup.client import CatchUpError, SourceClient
from fthsdp.agent.training.catchup.join_plan import RETRY_SAME_SOURCE_AFTER, JoinPlan, PlanKind, Restore, plan_for
from fthsdp.agent.training.catchup.replay import ReplayMismatch
from fthsdp.agent.training.catchup.report import CatchUpReport
from fthsdp.agent.training.checkpoint.errors import CheckpointError, PartlyLoaded
from fthsdp.agent.training.checkpoint.restoring import restore_group
from fthsdp.agent.training.quorum_view import QuorumView
from fthsdp.agent.training.session.job_finished import JobFinished
from fthsdp.agent.training.session.lifecycle import Lifecycle
from fthsdp.agent.training.session.replica_group import ReplicaGroup
from fthsdp.agent.training.session.report import Reporting
from fthsdp.agent.training.state.checksum import STATE_HASH
from fthsdp.agent.training.state.snapshot import state_from_bytes
from fthsdp.core.errors import CatchUpFailed, FthsdpError
from fthsdp.protos.v1 import catchup_pb2 as cpb
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.agent.joiner")

READY_GAP = 2
"""Steps behind the source's head at which a verified joiner asks to be admitted."""
STALLED_ROUNDS = 5
"""Log rounds without gaining on the source after which a verified joiner asks anyway."""
LOG_BATCH_BYTES = 256 << 20
SWITCH_WAIT = 10.0
"""Seconds an admitted joiner whose source was lost waits for the coordinator to name the next."""


class CatchingUp(Protocol):
    """The replica's state as a joiner brings it to the members'
    (``CatchUpTarget``: fthsdp/agent/training/catchup/target.py)."""

    @property
    def step(self) -> int:
        """The step the state is at."""
        ...

    def load_snapshot(self, state: dict[str, Any], step: int) -> None:
        """Load a source's snapshot, taken at ``step``."""
        ...

    def replay(self, entry: cpb.LogEntry, total: torch.Tensor) -> None:
        """Apply one step from the source's log, exactly as the members did."""
        ...

    def verify(self, entry: cpb.LogEntry, group: ReplicaGroup) -> bool:
        """Compare the state after a replayed step with the source's checksum
        (raises ``ReplayMismatch``); False when the entry carries none."""
        ...

    def report_progress(self, done: int, total: int) -> None:
        """Snapshot bytes received so far, for the coordinator's status."""
        ...

    def restore(self, path: str, digest: str, rank: int) -> str:
        """Load this rank's part of a checkpoint; returns its recorded state checksum."""
        ...

    def state_checksum(self, group: ReplicaGroup, kind: str = STATE_HASH) -> str:
        """The state's checksum in the hash ``kind`` (a collective over the group)."""
        ...


class StateTorn(FthsdpError):
    """Admitted as it is with a state a refused checkpoint partly replaced."""


class Drained(FthsdpError):
    """A drain was asked for while this replica caught up or waited for admission: it leaves instead."""


class _DrainAsked(CatchUpError):
    """Ends a snapshot transfer early: the replica drains instead."""


class Joiner:
    def __init__(self, replica: CatchingUp, *, job: str, replica_id: str, structure: int, group: ReplicaGroup,
                 view: QuorumView, reporting: Reporting, lifecycle: Lifecycle,
                 connect: Callable[[str, str], SourceClient]) -> None:
        """``replica``: the state it catches up; ``view``: the coordinator's
        pushes; ``reporting``: what this rank tells the coordinator (rank 0's
        heartbeats send it); ``connect``: a client to a source's catch-up
        address, with the job's credentials and the fingerprint of its
        certificate to pin ('' where none: fthsdp/agent/training/catchup/tls.py);
        ``structure``: the model's structure hash (a source must train the same model)."""
        self.replica = replica
        self.job, self.replica_id, self.structure = job, replica_id, structure
        self.group = group
        self.view, self.reporting, self.lifecycle = view, reporting, lifecycle
        self.connect = connect
        self.client: SourceClient | None = None
        self.snapshot_step = -1
        self.report: CatchUpReport | None = None
        """Set when this replica caught up (None when it was admitted as up to date)."""
        self.source = ""
        self.source_address = ""
        """This rank's address of the last source: kept after a reset, to
        close the last gap if this replica is admitted meanwhile."""
        self.source_fingerprint = ""
        """Its certificate's fingerprint, kept with it."""
        self.verified = False
        """The replay reproduced a checksum of the source's."""
        self.ready = False
        self.refused: set[str] = set()
        """Checkpoints (by digest) that could not be restored here: not tried again."""
        self.torn = ""
        """Why this replica's state is neither its own nor a whole checkpoint's ("" when it is whole): a
        checkpoint it refused after part of it was loaded. Cleared by a restore or a snapshot, which replace
        it whole; admitted as it is meanwhile, it stops (StateTorn)."""

    # ----- the procedure -------------------------------------------------------------

    def run(self, timeout: float, min_members: int = 1, until_admitted: bool = False) -> bool:
        """Catch up until this replica is ready to join (or, with
        ``until_admitted``, until a quorum includes it); returns whether a
        quorum includes it. A replica that is up to date is admitted into a
        quorum of at least ``min_members`` without catching up. ``timeout``:
        seconds to wait each time for a source to be named (or the
        admission). ``self.client`` stays open for the last gap. Raises
        ``Drained`` once a drain is asked for."""
        self.min_members = min_members
        failed: dict[str, float] = {}
        while True:
            if self.client is not None:  # ready before: follow the same source on
                source, addresses, fingerprints = self.source, [], []
            else:
                deadline = time.monotonic() + timeout
                plan = JoinPlan.from_json(self.group.broadcast_json(
                    self._plan(deadline, failed).to_json() if self.group.rank == 0 else None))
                if plan.kind is PlanKind.FINISHED:  # every rank raises, not only rank 0, which saw it
                    raise JobFinished(self.job, plan.finished_step)
                if plan.kind is PlanKind.DRAINED:
                    doing = "catching up" if self.report is not None else "waiting for admission"
                    raise Drained(f"drained while {doing}")
                if plan.kind is PlanKind.RESTORE:
                    assert plan.restore is not None  # a RESTORE plan names its checkpoint
                    self._restore(plan.restore)
                    continue
                if plan.kind is PlanKind.ADMITTED:
                    if self.torn:
                        raise StateTorn(f"replica {self.replica_id} was admitted as it is, but its state was partly "
                                        f"replaced by a checkpoint it then refused ({self.torn}): it cannot train "
                                        "from it; restart it, and it loads a whole state")
                    return True
                source, addresses, fingerprints = plan.source, list(plan.addresses), list(plan.fingerprints)
            try:
                if self.client is None:
                    self._catch_up(source, addresses, fingerprints, deadline)
                    self.torn = ""  # replaced whole by the source's snapshot
                return self._follow(source, until_admitted)
            except CatchUpError as e:
                if not self.lifecycle.drain_requested:  # (a drain ends the catch-up: the plan says so next)
                    log.warning("catch-up from %s failed: %s; trying again", source, e)
                    failed[source] = time.monotonic()
            self._reset()

    def _plan(self, deadline: float, failed: dict[str, float]) -> JoinPlan:
        """Rank 0: wait until the coordinator's push gives the group something to do
        (fthsdp/agent/training/catchup/join_plan.py decides what)."""
        view = self.view

        def plan(event: pb.WatchEvent | None) -> JoinPlan | None:
            return plan_for(event, drain_requested=self.lifecycle.drain_requested, min_members=self.min_members,
                            at_step=self.replica.step, refused=self.refused, failed=failed, now=time.monotonic())

        lost_seen = 0
        while True:
            if self.lifecycle.drain_requested:  # SIGTERM: no push wakes the wait below
                return JoinPlan(PlanKind.DRAINED)
            latest = view.latest
            decided = plan(latest)
            if decided is not None:
                break
            lost = latest.state_lost_step if latest is not None else 0
            if latest is not None and lost:
                # Every replica holding the job's state is gone: no source
                # will come until one returns or an operator gives the state
                # up. Waiting is the point; a timeout would only restart us.
                if lost != lost_seen:
                    log.warning("the job's state was lost at step %d; waiting for a replica that holds it, "
                                "or for an operator to give it up (fthsdp give-up-state): %s", lost, latest.reason)
                    lost_seen = lost
                deadline = max(deadline, time.monotonic() + RETRY_SAME_SOURCE_AFTER)
            elif latest is not None and latest.unreachable:
                # The members cannot reach this replica over the data path
                # (fthsdp/coordinator/decisions/stuck.py): no source comes until they can, and a
                # restart would not mend a link (fthsdp/agent/training/session/reach_probe.py answers
                # the coordinator's probes meanwhile).
                deadline = max(deadline, time.monotonic() + RETRY_SAME_SOURCE_AFTER)
            left = deadline - time.monotonic()
            if left <= 0:
                raise FthsdpError(f"replica {self.replica_id} was neither admitted nor given a catch-up source in time")
            try:
                view.wait_for(lambda e: plan(e) is not None, min(left, RETRY_SAME_SOURCE_AFTER))
            except TimeoutError:
                continue
        if decided.kind is PlanKind.CATCH_UP:
            log.info("catching up from %s (at step %d)", decided.source, decided.source_step)
        return decided

    def _catch_up(self, source: str, addresses: list[str], fingerprints: list[str], deadline: float) -> None:
        m, group = self.replica, self.group
        if len(addresses) != group.size:
            raise CatchUpError(f"source {source} has {len(addresses)} ranks, this replica {group.size}")
        fingerprint = fingerprints[group.rank] if len(fingerprints) == group.size else ""
        self.client = self.connect(addresses[group.rank], fingerprint)
        self.source, self.source_address, self.source_fingerprint = source, addresses[group.rank], fingerprint
        self.reporting.set_catching_up(True)  # not to be admitted on its step alone, until ready
        began = time.monotonic()
        attempts = self.report.attempts if self.report is not None else 0
        self.report = report = CatchUpReport(
            source=source, began=began, attempts=attempts + 1, transport=self.client.transport
        )

        # 1. The snapshot, at one step for every rank.
        step, error = -1, ""
        if group.rank == 0:
            try:
                manifest = self.client.request_snapshot(wait=min(30.0, max(1.0, deadline - time.monotonic())))
                step = manifest.step
            except CatchUpError as e:
                error = str(e)
        (step,) = group.max(step)
        if step < 0:
            raise CatchUpError(error or "the source's rank 0 took no snapshot")
        self.snapshot_step = step
        ok = 1
        try:
            if group.rank != 0:
                manifest = self.client.manifest(step)
            if manifest.structure_hash != self.structure:
                raise CatchUpError(f"source {source} trains a different model (structure hash differs)")
            def progress(done: int) -> None:
                if self.lifecycle.drain_requested:  # leave now, not after the rest of the transfer
                    raise _DrainAsked("a drain was asked for during the transfer")
                m.report_progress(done, manifest.total_bytes)

            data = self.client.fetch(manifest, progress=progress)
            m.load_snapshot(state_from_bytes(manifest, data), step)
        except CatchUpError as e:
            error, ok = str(e), 0
        self._agree(ok, error)
        report.snapshot_step, report.snapshot_bytes, report.loaded = step, manifest.total_bytes, time.monotonic()
        log.info(
            "loaded the snapshot of step %d from %s: %.1f MiB in %.2fs",
            step, source, manifest.total_bytes / 2**20, time.monotonic() - began,
        )

    def _follow(self, source: str, until_admitted: bool) -> bool:
        """Replay the source's log as it grows; ask to be admitted once
        verified and close to the head. Returns True once admitted, False
        once ready (without ``until_admitted``)."""
        m, group, report, client = self.replica, self.group, self.report, self.client
        # Both set by _catch_up, or kept from it (a replica ready before follows the same source on).
        assert report is not None and client is not None
        gaps: list[int] = []
        while True:
            entries, head, ok, error = [], m.step, 1, ""
            try:
                wait = 0.05 if self.ready else 0.5
                entries, head, _ = client.log(m.step, LOG_BATCH_BYTES, wait)
            except CatchUpError as e:
                ok, error = 0, str(e)
            self._agree(ok, error)
            (reach,) = group.min(m.step + len(entries))
            for entry, data in entries[: reach - m.step]:
                m.replay(entry, data)
                report.replayed_steps += 1
                if entry.checksum_after and not self.verified:  # once: later steps replay the same way
                    try:
                        self.verified = m.verify(entry, group)
                    except ReplayMismatch as e:
                        # Deterministic: the same loop replays the same way
                        # from any source, so trying again would not help.
                        raise CatchUpFailed(f"{e} (the replay contract: docs/training-api.md)") from e
            admitted, changed, near, drained = 0, 0, 0, 0
            if group.rank == 0:
                drained = int(self.lifecycle.drain_requested)
                latest = self.view.latest  # one event for both: the quorum and the assignment change together
                admitted = int(latest is not None and latest.HasField("place"))
                changed = int(not admitted and latest is not None and latest.catch_up.source_replica_id != source)
                gaps.append(head - m.step)
                # Close enough, or not gaining on members that train about as
                # fast as it replays: then the members wait for the rest once,
                # at the admission, rather than the joiner chasing them forever.
                stalled = len(gaps) > STALLED_ROUNDS and gaps[-1] >= gaps[-1 - STALLED_ROUNDS]
                near = int(self.verified and (gaps[-1] <= READY_GAP or stalled))
            admitted, changed, near, drained = group.max(admitted, changed, near, drained)
            if drained and not admitted:
                raise Drained(f"drained while catching up, at step {m.step}")
            if admitted:
                report.admitted = time.monotonic()
                return True
            if changed:
                raise CatchUpError(f"the coordinator moved this replica from source {source} to another")
            if near and not until_admitted:
                return False  # caught up: the training loop's first all-reduce asks to join
            if near and not self.ready:
                # Ask only now, from inside the all-reduce: admitted, this
                # replica is ready to agree at once, and nobody waits for it.
                self.ready = True
                report.ready = time.monotonic()
                log.info("caught up to step %d (source at %d) in %.2fs: ready", m.step, head,
                         report.ready - report.began)
                self.reporting.set_ready(True)

    def _restore(self, ref: Restore) -> None:
        """The coordinator restores the job's lost state from a checkpoint: load it (every rank)."""
        log.warning("the job's state is restored from the checkpoint of step %d: loading %s", ref.step, ref.path)
        try:
            restore_group(self.replica, self.group, ref.path, ref.digest)
            self.torn = ""
        except CheckpointError as e:
            log.error("the checkpoint of step %d was refused: %s", ref.step, e)
            self.refused.add(ref.digest)
            self.reporting.refuse_checkpoint(ref.digest, str(e))
            if isinstance(e, PartlyLoaded):
                self.torn = str(e)  # until a state replaces it whole: another checkpoint, a source's snapshot

    def _agree(self, ok: int, error: str) -> None:
        (all_ok,) = self.group.min(ok)
        if not all_ok:
            raise CatchUpError(error or "another rank of this replica group failed to catch up")

    def _reset(self) -> None:
        if self.client is not None:
            if self.snapshot_step >= 0:
                self.client.release(self.snapshot_step)
            self.client.close()
        self.client, self.snapshot_step = None, -1
        self.verified = self.ready = False
        self.reporting.set_ready(False)
        self.replica.report_progress(0, 0)

    def gap_client(self) -> SourceClient | None:
        """A connection to the last source, for the last gap inside FTAR."""
        if self.client is None and self.source_address:
            self.client = self.connect(self.source_address, self.source_fingerprint)
        return self.client

    def switch_source(self, wait: float = SWITCH_WAIT) -> SourceClient | None:
        """The source was lost during the last gap (this replica admitted, its
        first step not committed): connect to the next source the coordinator
        names for it (it names one for a member still catching up), waiting
        up to ``wait`` seconds. None if none came. Each rank switches on its
        own: rank k of any member holds shard k's log."""
        lost = self.source

        def named(event) -> bool:
            cu = event.catch_up
            return (bool(cu.source_replica_id) and cu.source_replica_id != lost
                    and len(cu.source_catch_up_addresses) == self.group.size)

        try:
            event = self.view.wait_for(named, wait)
        except TimeoutError:
            return None
        cu = event.catch_up
        if self.client is not None:
            self.client.close()  # (no snapshot to release: the new source never took one for us)
        self.snapshot_step = -1
        self.source, self.source_address = cu.source_replica_id, cu.source_catch_up_addresses[self.group.rank]
        fingerprints = cu.source_catch_up_fingerprints
        self.source_fingerprint = fingerprints[self.group.rank] if len(fingerprints) == self.group.size else ""
        self.client = self.connect(self.source_address, self.source_fingerprint)
        log.info("the catch-up source %s was lost during the last gap; closing it from %s", lost, self.source)
        return self.client

    def finish(self) -> None:
        """After the first committed step in the quorum: let the source go."""
        self._reset()
        self.reporting.set_catching_up(False)
