"""What the coordinator records of one replica, in memory (``JobState`` holds
one per replica), and the snapshot of it that the quorum decision reads
(``view``).

A replica's record comes in two parts. Its ``Standing`` is what outlives any
one incarnation: the operator's cordon and drain, the data-path mark, the
checksum-mismatch strikes, the stored record's revision and the member lease
(a new incarnation proves nothing of what the old one may still commit). Its
``Incarnation`` is what one registration brings and what happens to it:
``register`` replaces it whole with a fresh one, so no value of a process
that is gone is carried into its successor, and a field added later starts
fresh by itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from fthsdp.coordinator.decisions.quorum_types import Member, ReplicaView
from fthsdp.protos.v1 import coordinator_pb2 as pb


@dataclasses.dataclass(slots=True)
class Standing:
    """What lasts across a replica's incarnations, until it leaves for good."""

    cordoned: bool = False
    drain_requested: bool = False
    unreachable: str = ""
    """Why the members cannot reach it over the data path (fthsdp/coordinator/decisions/stuck.py);
    kept until its probes reach every member again."""
    mismatch: str = ""
    """Why its state last disagreed with the members' (for status)."""
    strikes: int = 0
    """Mismatch evictions in a row after catching up (fthsdp/coordinator/job/checksum_vote.py)."""
    record_revision: int = 0
    """The store revision of its ``pb.ReplicaRecord`` (0: none stored)."""
    lease_until: float = 0.0
    """Until when any incarnation of it may still commit steps under a member
    lease (fthsdp/coordinator/decisions/lease.py): a new incarnation proves
    nothing of the old one, so it is released (0) only when its agent
    reports its processes gone or it leaves."""


@dataclasses.dataclass(slots=True)
class Incarnation:
    """One registration of a replica and what happened to it since; times are
    coordinator-monotonic seconds. The defaults are those of an incarnation
    loaded from the store (``seed_entries``), not yet heard from."""

    key: str = ""
    """The key of the registered incarnation (RegisterRequest.incarnation): the
    other ranks' pings and probe answers must carry it."""
    session_id: str | None = None
    address: str = ""
    world_size: int = 1
    agent_ids: tuple[str, ...] = ()
    """The node agents that started its processes (RegisterRequest.agent_ids;
    stored in the record): only their reports count for them."""
    restart_count: int = 0
    """Its agent's restart count when it registered: a report about an older
    incarnation fails nothing of this one (the agent's own count lasts in
    ``JobTable.agents``)."""
    heard_from: bool = False
    """It registered with this coordinator (False: loaded from the store)."""
    reconnect_by: float | None = None
    """Loaded from the store by a coordinator that just started: the end of
    its grace to reconnect (``grant_reconnect_grace``); it counts only until
    the replica is heard from."""
    returned: bool = False
    """It registered while this coordinator awaited it after a start (the
    incarnation before was loaded from the store, within its grace)."""
    step: int = 0
    registered_at: float = 0.0
    last_heartbeat: float = 0.0
    beating: bool = False
    """Rank 0 has heartbeated (not yet: not admitted)."""
    first_heartbeat: float = 0.0
    """When it did first."""
    step_since: float = 0.0
    """When it reported its current step (ReplicaView.step_since)."""
    rank_heartbeats: dict[int, float] = dataclasses.field(default_factory=dict)
    """Last ping of each rank other than 0 of a multi-rank replica group."""
    ranks_left: set[int] = dataclasses.field(default_factory=set)
    """Ranks other than 0 that said they left cleanly with their group: no longer awaited."""
    pings_batched: bool = False
    """Its ranks ping through their agents' relays, a batch per host (the Pings call): as heartbeat senders
    they count one per host, not one per rank (``JobTable.senders``)."""
    open_watches: int = 0
    disconnected_at: float | None = None
    failed_at: float | None = None
    ready_since: float | None = None
    restarted: bool = False
    """A member that registered anew: it lost its state, and the next decision replaces it."""
    wait_for_replicas: int = 0
    """The replica count its script waits for before the first step (0: not said yet)."""
    state_checksum: str = ""
    checksum_step: int = 0
    checksums: dict[int, str] = dataclasses.field(default_factory=dict)
    inputs: dict[int, str] = dataclasses.field(default_factory=dict)
    """The step inputs reported with ``checksums`` (StepChecksum.inputs), by step."""
    diverged_at: int | None = None
    divergence: pb.Divergence | None = None
    """The checksum-mismatch verdict on it, told to its watchers
    (fthsdp/coordinator/decisions/divergence.py)."""
    catch_up_addresses: tuple[str, ...] = ()
    catch_up_fingerprints: tuple[str, ...] = ()
    """Their certificates' fingerprints (RegisterRequest.catch_up_fingerprints), handed to its joiners."""
    catch_up_progress: tuple[int, int] = (0, 0)
    """Snapshot bytes received and expected, while it catches up."""
    catching_up: bool = False
    caught_up: bool = False
    """It was named a catch-up source: it rejoined behind the members."""
    hung_at: float | None = None
    hung_reason: str = ""
    """Taken out for making no progress, or as a straggler (fthsdp/coordinator/decisions/hang.py)."""
    notice: str = ""
    """What its watchers (its node agents) are told: why it must be ended."""


@dataclasses.dataclass(slots=True)
class ReplicaEntry:
    """One replica: what lasts (``standing``) and its current ``incarnation``."""

    replica_id: str
    incarnation: Incarnation = dataclasses.field(default_factory=Incarnation)
    standing: Standing = dataclasses.field(default_factory=Standing)

    def view_heartbeat(self) -> float:
        """The replica is as alive as its most silent rank."""
        inc = self.incarnation
        return min(inc.last_heartbeat, *inc.rank_heartbeats.values()) if inc.rank_heartbeats else inc.last_heartbeat

    def view(self) -> ReplicaView:
        inc, standing = self.incarnation, self.standing
        return ReplicaView(
            replica_id=self.replica_id,
            address=inc.address,
            world_size=inc.world_size,
            step=inc.step,
            catch_up_addresses=inc.catch_up_addresses,
            catch_up_fingerprints=inc.catch_up_fingerprints,
            last_heartbeat=self.view_heartbeat(),
            registered_at=inc.registered_at,
            disconnected_at=inc.disconnected_at,
            failed_at=inc.failed_at,
            ready_since=inc.ready_since,
            catching_up=inc.catching_up,
            wait_for_replicas=inc.wait_for_replicas,
            beating=inc.beating,
            first_heartbeat=inc.first_heartbeat,
            step_since=inc.step_since,
            restarted=inc.restarted,
            diverged=inc.diverged_at is not None,
            cordoned=standing.cordoned,
            drain_requested=standing.drain_requested,
            hung_at=inc.hung_at,
            hung=inc.hung_reason,
            unreachable=standing.unreachable,
            reconnect_by=None if inc.heard_from else inc.reconnect_by,
            returned=inc.returned,
            lease_until=standing.lease_until,
        )

    def record(self, registered_unix_ms: int = 0) -> pb.ReplicaRecord:
        """What the store keeps of it: its standing's flags, and who its incarnation is."""
        inc, standing = self.incarnation, self.standing
        return pb.ReplicaRecord(
            replica_id=self.replica_id,
            address=inc.address,
            world_size=inc.world_size,
            cordoned=standing.cordoned,
            drain_requested=standing.drain_requested,
            registered_unix_ms=registered_unix_ms,
            unreachable=standing.unreachable,
            agent_ids=inc.agent_ids,
            restart_count=inc.restart_count,
        )


def seed_entries(
    members: Mapping[str, Member], records: Mapping[str, tuple[pb.ReplicaRecord, int]], now: float
) -> dict[str, ReplicaEntry]:
    """The entries of a job loaded from the store after a (re)start: every
    stored record and every member of the stored quorum, as if heard from
    ``now``, so that a heartbeat timeout counts from the coordinator's
    start; ``grant_reconnect_grace`` then holds their judgment longer. A
    record's flags are the replica's standing; the rest of it, and the
    member's step, describe the incarnation it had, which is not heard from."""
    out = {}
    for rid, (rec, rev) in records.items():
        out[rid] = ReplicaEntry(
            replica_id=rid,
            incarnation=Incarnation(
                address=rec.address,
                world_size=rec.world_size or 1,
                step=members[rid].step if rid in members else 0,
                registered_at=now,
                last_heartbeat=now,
                agent_ids=tuple(rec.agent_ids),
                restart_count=rec.restart_count,
            ),
            standing=Standing(
                cordoned=rec.cordoned,
                drain_requested=rec.drain_requested,
                unreachable=rec.unreachable,
                record_revision=rev,
            ),
        )
    for rid, member in members.items():
        if rid not in out:
            out[rid] = ReplicaEntry(
                replica_id=rid,
                incarnation=Incarnation(
                    address=member.address,
                    world_size=member.world_size,
                    step=member.step,
                    registered_at=now,
                    last_heartbeat=now,
                ),
            )
    return out


def grant_reconnect_grace(entries: Mapping[str, ReplicaEntry], until: float) -> int:
    """Give every replica not yet back (no session: loaded from the store)
    until ``until`` to reconnect before the quorum decision judges it
    (fthsdp/coordinator/decisions/liveness.py ``lost_at``); returns how many. A coordinator
    that just started has heard from nobody: their silence is its own."""
    count = 0
    for entry in entries.values():
        inc = entry.incarnation
        if inc.session_id is None and not inc.heard_from:
            inc.reconnect_by = until
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
    if entry is None or agent_state not in AGENT_FAILED:
        return False
    inc = entry.incarnation
    if inc.heard_from or inc.reconnect_by is None:
        return False
    if inc.failed_at is None:
        inc.failed_at = now
    entry.standing.lease_until = 0.0  # its processes are gone: they commit nothing (decisions/lease.py)
    return True
