"""What a replica's calls, and an operator's, change in a job's table.

Registration (a new incarnation and its session), heartbeats (rank 0's,
with the step, readiness and checksums, and the other ranks' pings), the
Watch streams opening and closing, a replica leaving, its node agent's
reports, and the replica records that registrations and an operator's
cordon or drain store (``record_needed``, ``admin_record``, ``apply_record``,
``mark_records``). Each records what was said on the replica's
``ReplicaEntry`` (a registration replaces its incarnation whole; the rest
set what they were told on it) and marks when the next decision is due
(``schedule``, fthsdp/coordinator/job/schedule.py) and whether the checksums
must be looked at (``checksums_dirty``); none decides anything. Apart from
the decisions (fthsdp/coordinator/job/state.py) because this is the hot path, one
call per heartbeat of every replica, and the decisions never run in it.
"""

from __future__ import annotations

import secrets
import sys

from fthsdp.coordinator.decisions import lease
from fthsdp.coordinator.job import identity
from fthsdp.coordinator.job.replica_entry import Incarnation, ReplicaEntry, Standing
from fthsdp.coordinator.job.table import JobTable
from fthsdp.core.errors import InvalidRequest, NotFound
from fthsdp.protos.v1 import coordinator_pb2 as pb

CHECKSUM_HISTORY = 32
"""Recent (step, checksum) reports kept per replica for comparison."""

_AGENT_FAILURES = (pb.AGENT_STATE_FAILED, pb.AGENT_STATE_RESTARTING, pb.AGENT_STATE_GAVE_UP)


class ReplicaCalls(JobTable):
    """The replica and admin calls of ``JobState`` (fthsdp/coordinator/job/state.py)."""

    def check_registration(self, replica_id: str, agent_ids: tuple[str, ...], step: int, quorum_id: int,
                           now: float, restart_count: int = 0) -> None:
        """Refuse a registration that speaks for someone else, or claims more
        than the job has; nothing changes (fthsdp/coordinator/job/identity.py)."""
        identity.check_registration(self, replica_id, agent_ids, step, quorum_id, now, restart_count)

    def record_needed(self, replica_id: str, address: str, world_size: int,
                      agent_ids: tuple[str, ...] = (), restart_count: int = 0) -> tuple[pb.ReplicaRecord, int] | None:
        """The record to store before a registration, or None if the stored one is current."""
        entry = self.replicas.get(replica_id)
        if entry is not None and entry.standing.record_revision:
            inc = entry.incarnation
            if ((inc.address, inc.world_size, inc.agent_ids, inc.restart_count)
                    == (address, world_size, agent_ids, restart_count)):
                return None
        base = entry.standing if entry is not None else Standing()
        rec = pb.ReplicaRecord(
            replica_id=replica_id,
            address=address,
            world_size=world_size,
            cordoned=base.cordoned,
            drain_requested=base.drain_requested,
            unreachable=base.unreachable,
            agent_ids=agent_ids,
            restart_count=restart_count,
        )
        return rec, base.record_revision

    def register(
        self,
        replica_id: str,
        address: str,
        world_size: int,
        step: int,
        quorum_id: int,
        now: float,
        record_revision: int | None = None,
        catch_up_addresses: tuple[str, ...] = (),
        restart_count: int = 0,
        wait_for_replicas: int = 0,
        agent_ids: tuple[str, ...] = (),
        incarnation: str = "",
        catch_up_fingerprints: tuple[str, ...] = (),
    ) -> str:
        """Register a new incarnation of a replica and return its session id.

        A member of the current quorum keeps its place only if it says it still
        trains in a quorum that admitted it; otherwise it restarted and lost its
        state, and the next decision replaces it with a joiner.
        """
        entry = self.replicas.get(replica_id)
        if entry is None:  # seen for the first time: a fresh standing too
            entry = self.replicas[replica_id] = ReplicaEntry(replica_id)
        member = self._members.get(replica_id)
        if member is not None:
            self.checksums_dirty = True  # a member restarted, or came back after a failover
            self.schedule.now()
        else:
            self.schedule.soon()
        session_id = secrets.token_hex(8)
        before = entry.incarnation
        grace_end = None if before.heard_from else before.reconnect_by
        returned = grace_end is not None
        # Every other rank of the group must ping within a heartbeat timeout of the registration, or the
        # group counts as silent; within the grace's end for a member back after a takeover, whose other
        # ranks ping on their hosts' own streams, which thousands of hosts reopen at once.
        ranks_from = now if grace_end is None else max(now, grace_end - self.rules.heartbeat_timeout)
        # A fresh incarnation: nothing of the old one carries over (its standing
        # does: its cordon, mismatch and strikes, its member lease).
        entry.incarnation = Incarnation(
            key=incarnation, session_id=session_id, address=address, world_size=world_size,
            agent_ids=agent_ids, restart_count=restart_count, heard_from=True, step=step,
            registered_at=now, last_heartbeat=now, step_since=now, wait_for_replicas=wait_for_replicas,
            catch_up_addresses=tuple(catch_up_addresses), catch_up_fingerprints=tuple(catch_up_fingerprints),
            rank_heartbeats=dict.fromkeys(range(1, world_size), ranks_from),
            restarted=member is not None and quorum_id < member.joined_quorum_id,
            returned=returned,
        )
        self._senders = None
        self.progress.forget(replica_id)
        # Its timeout may run out before any the last scan saw (or none was left to see).
        timeout, bound = self._expiry_bound
        self._expiry_bound = (timeout, min(bound, now + timeout))
        if member is not None and not entry.incarnation.restarted:
            self.committed_step = max(self.committed_step, step)  # a member back after a failover
        if record_revision is not None:
            entry.standing.record_revision = record_revision
        return session_id

    def heartbeat(
        self,
        replica_id: str,
        session_id: str,
        step: int,
        ready: bool,
        state_checksum: str,
        checksum_step: int,
        now: float,
        recent: dict[int, str] | None = None,
        shard_rank: int = 0,
        catch_up_progress: tuple[int, int] = (0, 0),
        catching_up: bool = False,
        progress: pb.Progress | None = None,
        recent_inputs: dict[int, str] | None = None,
        wait_for_replicas: int = 0,
        left: bool = False,
        lease_seq: int = 0,
        incarnation: str = "",
        batched: bool = False,
    ) -> pb.HeartbeatResponse:
        """Record a heartbeat; its answer renews the member lease when it asks
        (``lease_seq``) and the replica is a member held to be training
        (fthsdp/coordinator/decisions/lease.py). ``batched``: a rank's ping
        that came in its host's batch (the Pings call)."""
        if shard_rank > 0:
            return self.rank_ping(replica_id, shard_rank, now, progress, left, incarnation, batched)
        entry = self._session(replica_id, session_id)
        inc = entry.incarnation
        if progress is not None:
            self.progress.report(replica_id, 0, progress, now)
        if ready != (inc.ready_since is not None):
            self.schedule.now()
        elif replica_id not in self._members:
            self.schedule.soon()  # a joiner's progress feeds the decision; members' steps do not
        if not inc.beating:
            inc.beating, inc.first_heartbeat = True, now
        step = identity.bounded_step(self, replica_id, step)
        if step != inc.step:
            # a loaded checkpoint is held from here (fthsdp/coordinator/decisions/restore_wait.py)
            inc.step_since = now
        if (entry.standing.lease_until and now - inc.last_heartbeat >= self.lease_s / 2 and inc.heard_from
                and replica_id in self._members):
            # A member with a lease, silent for half of one at least (an answer comes every interval, a
            # lease lasts several): its lease may have run out, and it paused for the coordinator, not
            # hung (fthsdp/coordinator/decisions/hang.py find_hung).
            self.progress.heard_again(replica_id, now)
        inc.last_heartbeat, inc.heard_from, inc.step = now, True, step
        if step > self.committed_step and replica_id in self._members and not inc.restarted:
            self.committed_step, self.trained = step, self.quorum
        inc.catch_up_progress, inc.catching_up = catch_up_progress, catching_up
        if wait_for_replicas != inc.wait_for_replicas:
            inc.wait_for_replicas = wait_for_replicas
            self.schedule.now()  # whether its step vouches for an outsider (quorum.py, rule 6)
        if ready and inc.ready_since is None:
            inc.ready_since = now
        elif not ready:
            inc.ready_since = None
        if state_checksum:
            inc.state_checksum, inc.checksum_step = state_checksum, checksum_step
            inc.checksums[checksum_step] = state_checksum
            self.checksums_dirty = True
        if recent:
            inc.checksums.update(recent)
            self.checksums_dirty = True
        if recent_inputs:
            # Interned: every replica reports the same few strings at a step.
            inc.inputs.update({s: sys.intern(v) for s, v in recent_inputs.items()})
        while len(inc.checksums) > CHECKSUM_HISTORY:
                del inc.checksums[min(inc.checksums)]
        while len(inc.inputs) > CHECKSUM_HISTORY:
            del inc.inputs[min(inc.inputs)]
        response = pb.HeartbeatResponse(
            quorum_id=self.quorum.id if self.quorum else 0, drain_requested=entry.standing.drain_requested
        )
        response.lease_seq = lease_seq
        if lease_seq and replica_id in self._members and lease.may_be_granted(entry.view()):
            response.lease_s = self.lease_s
            entry.standing.lease_until = max(entry.standing.lease_until, lease.lapses_at(now, self.lease_s))
        return response

    def rank_ping(
        self, replica_id: str, shard_rank: int, now: float, progress: pb.Progress | None, left: bool = False,
        incarnation: str = "", batched: bool = False,
    ) -> pb.HeartbeatResponse:
        """A rank other than 0 pings: its liveness and progress (``batched``: in its host's batch), answered."""
        entry = self.rank_pinged(replica_id, shard_rank, now, progress, left, incarnation, batched)
        return pb.HeartbeatResponse(quorum_id=self.quorum.id if self.quorum else 0,
                                    drain_requested=entry.standing.drain_requested)

    def rank_pinged(
        self, replica_id: str, shard_rank: int, now: float, progress: pb.Progress | None, left: bool = False,
        incarnation: str = "", batched: bool = False,
    ) -> ReplicaEntry:
        """``rank_ping`` without its answer (a ping in a batch asks for none): the replica's entry."""
        entry = self.of_incarnation(replica_id, incarnation)
        inc = entry.incarnation
        if shard_rank >= inc.world_size:
            raise InvalidRequest(
                f"shard_rank {shard_rank} is outside replica {replica_id!r}'s {inc.world_size} ranks")
        if batched and not inc.pings_batched:
            inc.pings_batched, self._senders = True, None  # counted by its hosts from now on
        if left:
            # Its group leaves cleanly; rank 0 may still be writing or sealing a checkpoint,
            # and is judged alone until its Leave (a late ping of this rank changes nothing).
            inc.ranks_left.add(shard_rank)
            inc.rank_heartbeats.pop(shard_rank, None)
        elif shard_rank not in inc.ranks_left:
            inc.rank_heartbeats[shard_rank] = now
            if progress is not None:
                self.progress.report(replica_id, shard_rank, progress, now)
        return entry

    def digest_pinged(self, digest: pb.RankDigest, now: float) -> ReplicaEntry:
        """``rank_pinged`` for each rank of a ``RankDigest`` (checked: ranks above 0, none twice, columns of
        equal length), at once: none of them has left or is in a marked section."""
        entry = self.of_incarnation(digest.replica_id, digest.incarnation)
        inc = entry.incarnation
        if digest.ranks and max(digest.ranks) >= inc.world_size:
            raise InvalidRequest(f"shard_rank {max(digest.ranks)} is outside replica {digest.replica_id!r}'s "
                                 f"{inc.world_size} ranks")
        if not inc.pings_batched:
            inc.pings_batched, self._senders = True, None  # counted by its hosts from now on
        beats, left = inc.rank_heartbeats, inc.ranks_left
        for rank in digest.ranks:
            if rank not in left:
                beats[rank] = now
        if left:
            digest = _without(digest, left)
        self.progress.report_digest(digest.replica_id, digest, now)
        return entry

    def watch_opened(self, replica_id: str, session_id: str) -> None:
        entry = self._session(replica_id, session_id)
        inc = entry.incarnation
        inc.open_watches += 1
        inc.disconnected_at = None

    def watch_closed(self, replica_id: str, session_id: str, now: float) -> None:
        entry = self.replicas.get(replica_id)
        if entry is None or entry.incarnation.session_id != session_id:
            return  # a superseded session's stream; the new one is what counts
        inc = entry.incarnation
        inc.open_watches = max(0, inc.open_watches - 1)
        if inc.open_watches == 0 and inc.failed_at is None:
            inc.disconnected_at = now
            self.schedule.now()

    def leave(
        self, replica_id: str, session_id: str, failed: bool, now: float, reason: str = "", step: int = 0
    ) -> bool:
        """End a session. Returns True if the replica is gone for good (its
        record should be deleted); a failed replica stays listed as failed.
        A reason "failed: ..." is a failure too (a training script that
        raised leaves with it): a replica that is gone left on purpose, and
        members that all did so end the job's state rather than lose it
        (quorum rule 8)."""
        entry = self._session(replica_id, session_id)
        inc = entry.incarnation
        inc.session_id = None
        self.schedule.now()
        self._senders = None
        if failed or reason.startswith("failed"):
            inc.failed_at, entry.standing.lease_until = now, 0.0  # it commits nothing more
            return False
        if replica_id in self._members:
            self._left[replica_id] = reason
            if not inc.restarted:  # its state, as its heartbeats would have said
                self.committed_step = max(self.committed_step, step)
        del self.replicas[replica_id]
        self.catch_up.pop(replica_id, None)
        self.progress.forget(replica_id)
        return True

    def agent_event(self, replica_id: str, state: pb.AgentState, restart_count: int, detail: str, now: float,
                    agent_id: str = "") -> bool:
        """Record a node agent's transition. Returns True if it failed the
        replica (a rank died): its session ends at once, so the next decision
        drops it without waiting for heartbeats to lapse. Refused
        (PermissionDenied) from any agent but the one that started the
        registered processes (fthsdp/coordinator/job/identity.py)."""
        entry = self.replicas.get(replica_id)
        identity.check_agent_report(entry, replica_id, agent_id, state in _AGENT_FAILURES)
        self.agents[replica_id] = (state, restart_count, detail)
        # A report the agent sent again after an outage may come after the
        # incarnation it is about was replaced: it fails that one, not its successor.
        if (state in _AGENT_FAILURES and entry is not None and entry.incarnation.session_id is not None
                and restart_count >= entry.incarnation.restart_count):
            entry.incarnation.failed_at, entry.incarnation.session_id = now, None  # the incarnation ended
            entry.standing.lease_until = 0.0  # its processes are gone: confirmed dead (decisions/lease.py)
            self.schedule.now()
            self._senders = None
            return True
        return False

    # ----- admin ---------------------------------------------------------------------

    def admin_record(self, replica_id: str, *, cordoned: bool | None = None, drain: bool | None = None):
        """The record to store for an admin change, with its expected revision."""
        entry = self.replicas.get(replica_id)
        if entry is None:
            raise NotFound(f"job {self.name!r} has no replica {replica_id!r}")
        rec = entry.record()
        if cordoned is not None:
            rec.cordoned = cordoned
        if drain is not None:
            rec.drain_requested = drain
        return rec, entry.standing.record_revision

    def mark_records(self) -> list[tuple[pb.ReplicaRecord, int]]:
        """The records to store for the unreachable marks set or cleared
        since the last call, with their expected revisions; a record that
        fails to store is handed back with ``marks_to_store.add``."""
        out = [(self.replicas[rid].record(), self.replicas[rid].standing.record_revision)
               for rid in sorted(self.marks_to_store) if rid in self.replicas]
        self.marks_to_store.clear()
        return out

    def apply_record(self, rec: pb.ReplicaRecord, revision: int) -> None:
        entry = self.replicas.get(rec.replica_id)
        if entry is not None:
            entry.standing.cordoned, entry.standing.drain_requested = rec.cordoned, rec.drain_requested
            entry.standing.record_revision = revision
            self.schedule.now()


def _without(digest: pb.RankDigest, ranks: set[int]) -> pb.RankDigest:
    """``digest`` without ``ranks`` (ranks whose group left cleanly: a late ping of one changes nothing)."""
    kept = [i for i, rank in enumerate(digest.ranks) if rank not in ranks]
    return pb.RankDigest(
        job=digest.job, replica_id=digest.replica_id, incarnation=digest.incarnation,
        ranks=[digest.ranks[i] for i in kept], phases=[digest.phases[i] for i in kept],
        phase_ages_s=[digest.phase_ages_s[i] for i in kept], steps=[digest.steps[i] for i in kept],
        step_times_s=[digest.step_times_s[i] for i in kept], compute_times_s=[digest.compute_times_s[i] for i in kept])
