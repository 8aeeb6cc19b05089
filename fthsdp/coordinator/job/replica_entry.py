"""What the coordinator records of one replica: its registration, heartbeats,
streams and flags, in memory (``JobState`` holds one per replica), and the
snapshot of it that the quorum decision reads (``view``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from fthsdp.coordinator.decisions.quorum_types import Member, ReplicaView
from fthsdp.protos.v1 import coordinator_pb2 as pb


@dataclasses.dataclass
class ReplicaEntry:
    """Mutable record of one replica; times are coordinator-monotonic seconds."""

    replica_id: str
    address: str = ""
    world_size: int = 1
    step: int = 0
    session_id: str | None = None
    registered_at: float = 0.0
    last_heartbeat: float = 0.0
    heard_from: bool = False
    disconnected_at: float | None = None
    failed_at: float | None = None
    ready_since: float | None = None
    restarted: bool = False
    cordoned: bool = False
    drain_requested: bool = False
    state_checksum: str = ""
    checksum_step: int = 0
    checksums: dict[int, str] = dataclasses.field(default_factory=dict)
    rank_heartbeats: dict[int, float] = dataclasses.field(default_factory=dict)
    """Last ping of each rank other than 0 of a multi-rank replica group."""
    ranks_left: set[int] = dataclasses.field(default_factory=set)
    """Ranks other than 0 that said they left cleanly with their group: no longer awaited."""
    diverged_at: int | None = None
    record_revision: int = 0
    open_watches: int = 0
    catch_up_addresses: tuple[str, ...] = ()
    catch_up_fingerprints: tuple[str, ...] = ()
    """Their certificates' fingerprints (RegisterRequest.catch_up_fingerprints), handed to its joiners."""
    catch_up_progress: tuple[int, int] = (0, 0)
    """Snapshot bytes received and expected, while the replica catches up."""
    catching_up: bool = False
    wait_for_replicas: int = 0
    """The replica count its script waits for before the first step (0: not said yet)."""
    beating: bool = False
    """Rank 0 has heartbeated since this registration (not before: not admitted)."""
    first_heartbeat: float = 0.0
    """When it did first."""
    step_since: float = 0.0
    """When it reported its current step (ReplicaView.step_since)."""
    restart_count: int = 0
    """Its agent's restart count when this incarnation registered."""
    hung_at: float | None = None
    hung_reason: str = ""
    """Taken out for making no progress, or as a straggler (fthsdp/coordinator/decisions/hang.py)."""
    notice: str = ""
    """What its watchers (its node agents) are told: why it must be ended."""
    inputs: dict[int, str] = dataclasses.field(default_factory=dict)
    """The step inputs reported with ``checksums`` (StepChecksum.inputs), by step."""
    caught_up: bool = False
    """This incarnation was named a catch-up source: it rejoined behind the members."""
    divergence: pb.Divergence | None = None
    """The checksum-mismatch verdict on this incarnation, told to its watchers
    (fthsdp/coordinator/decisions/divergence.py)."""
    mismatch: str = ""
    """Why its state last disagreed with the members' (kept across incarnations, for status)."""
    strikes: int = 0
    """Mismatch evictions in a row after catching up (kept across incarnations)."""
    unreachable: str = ""
    """Why the members cannot reach it over the data path (fthsdp/coordinator/decisions/stuck.py);
    kept across incarnations until its probes reach every member again."""
    reconnect_by: float | None = None
    """Loaded from the store by a coordinator that just started: the end of
    its grace to reconnect (``grant_reconnect_grace``); it counts only until
    the replica registers again (``heard_from``)."""
    agent_ids: tuple[str, ...] = ()
    """The node agents that started the registered processes (RegisterRequest.agent_ids;
    stored in the record): only their reports count for them."""
    incarnation: str = ""
    """The key of the registered incarnation (RegisterRequest.incarnation): the
    other ranks' pings and probe answers must carry it."""
    lease_until: float = 0.0
    """Until when any incarnation of it may still commit steps under a member
    lease (fthsdp/coordinator/decisions/lease.py): kept across registrations (a new
    incarnation proves nothing of the old one), released (0) only when its
    agent reports its processes gone or it leaves."""

    def view_heartbeat(self) -> float:
        """The replica is as alive as its most silent rank."""
        return min(self.last_heartbeat, *self.rank_heartbeats.values()) if self.rank_heartbeats else self.last_heartbeat

    def view(self) -> ReplicaView:
        last = self.view_heartbeat()
        return ReplicaView(
            replica_id=self.replica_id,
            address=self.address,
            world_size=self.world_size,
            step=self.step,
            catch_up_addresses=self.catch_up_addresses,
            catch_up_fingerprints=self.catch_up_fingerprints,
            last_heartbeat=last,
            registered_at=self.registered_at,
            disconnected_at=self.disconnected_at,
            failed_at=self.failed_at,
            ready_since=self.ready_since,
            catching_up=self.catching_up,
            wait_for_replicas=self.wait_for_replicas,
            beating=self.beating,
            first_heartbeat=self.first_heartbeat,
            step_since=self.step_since,
            restarted=self.restarted,
            diverged=self.diverged_at is not None,
            cordoned=self.cordoned,
            drain_requested=self.drain_requested,
            hung_at=self.hung_at,
            hung=self.hung_reason,
            unreachable=self.unreachable,
            reconnect_by=None if self.heard_from else self.reconnect_by,
            lease_until=self.lease_until,
        )

    def record(self, registered_unix_ms: int = 0) -> pb.ReplicaRecord:
        return pb.ReplicaRecord(
            replica_id=self.replica_id,
            address=self.address,
            world_size=self.world_size,
            cordoned=self.cordoned,
            drain_requested=self.drain_requested,
            registered_unix_ms=registered_unix_ms,
            unreachable=self.unreachable,
            agent_ids=self.agent_ids,
            restart_count=self.restart_count,
        )


def seed_entries(
    members: Mapping[str, Member], records: Mapping[str, tuple[pb.ReplicaRecord, int]], now: float
) -> dict[str, ReplicaEntry]:
    """The entries of a job loaded from the store after a (re)start: every
    stored record and every member of the stored quorum, as if heard from
    ``now``, so that a heartbeat timeout counts from the coordinator's
    start; ``grant_reconnect_grace`` then holds their judgment longer."""
    out = {}
    for rid, (rec, rev) in records.items():
        out[rid] = ReplicaEntry(
            replica_id=rid,
            address=rec.address,
            world_size=rec.world_size or 1,
            step=members[rid].step if rid in members else 0,
            registered_at=now,
            last_heartbeat=now,
            cordoned=rec.cordoned,
            drain_requested=rec.drain_requested,
            unreachable=rec.unreachable,
            agent_ids=tuple(rec.agent_ids),
            restart_count=rec.restart_count,
            record_revision=rev,
        )
    for rid, member in members.items():
        if rid not in out:
            out[rid] = ReplicaEntry(
                replica_id=rid,
                address=member.address,
                world_size=member.world_size,
                step=member.step,
                registered_at=now,
                last_heartbeat=now,
            )
    return out


def grant_reconnect_grace(entries: Mapping[str, ReplicaEntry], until: float) -> int:
    """Give every replica not yet back (no session: loaded from the store)
    until ``until`` to reconnect before the quorum decision judges it
    (fthsdp/coordinator/decisions/liveness.py ``lost_at``); returns how many. A coordinator
    that just started has heard from nobody: their silence is its own."""
    count = 0
    for entry in entries.values():
        if entry.session_id is None and not entry.heard_from:
            entry.reconnect_by = until
            count += 1
    return count


AGENT_FAILED = frozenset({pb.AGENT_STATE_FAILED, pb.AGENT_STATE_RESTARTING, pb.AGENT_STATE_GAVE_UP})
"""Agent states that say the replica's processes are gone."""


def fail_awaited(entry: ReplicaEntry | None, agent_state: int, now: float) -> bool:
    """Record an agent's failure report on a replica not back since the
    coordinator started (it has no session for the report to end): its
    processes are gone, so it is lost now rather than at the end of its
    grace. Reports are not queued while no coordinator answers, so this
    one is about now. Returns whether it was recorded."""
    if entry is None or agent_state not in AGENT_FAILED or entry.heard_from or entry.reconnect_by is None:
        return False
    if entry.failed_at is None:
        entry.failed_at = now
    entry.lease_until = 0.0  # its processes are gone: they commit nothing (fthsdp/coordinator/decisions/lease.py)
    return True
