"""The quorum decision's data: what it reads and what it answers.

Its inputs (``Rules``, the parameters; ``ReplicaView``, what the coordinator
knows of one replica), its outcome (``Decision``, with the ``CatchUpSource``
named for each replica behind) and the quorum it forms (``Quorum`` of
``Member``, with its numbering, ``next_last_drop_id``). Plain frozen records
with no rules in them: the decision itself (fthsdp/coordinator/decisions/quorum.py), the
replica table (fthsdp/coordinator/job/state.py), the store codec and the status
views all use them, and none of those needs the others to read a quorum.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class Rules:
    """The parameters of the decision (a subset of the coordinator config)."""

    min_replicas: int = 1
    heartbeat_timeout: float = 5.0
    join_timeout: float = 10.0
    disconnect_is_failure: bool = True
    join_settle: float = 0.0
    member_lease: float = 5.0
    """The shortest member lease an answer grants (fthsdp/coordinator/decisions/lease.py)."""


@dataclasses.dataclass(frozen=True)
class Member:
    """One replica of a quorum."""

    replica_id: str
    address: str
    world_size: int
    step: int
    joined_quorum_id: int


@dataclasses.dataclass(frozen=True)
class Quorum:
    """Which replicas train together; ``id`` grows at every membership change."""

    id: int
    members: tuple[Member, ...]
    step: int = 0
    created_unix_ms: int = 0
    reason: str = ""
    epoch: int = 0
    last_drop_id: int = 0
    """The newest quorum up to this one that dropped an incarnation of the
    quorum before it: every member of a quorum with an id at or above it is
    a member of this one (0: unknown, as in a quorum stored by an older
    version; see ``next_last_drop_id``)."""
    generation: int = 0
    """The job's lineage it trains: one more after every restore or give-up
    (fthsdp/coordinator/engine/committed.py)."""

    @property
    def member_ids(self) -> tuple[str, ...]:
        return tuple(m.replica_id for m in self.members)


def next_last_drop_id(prev: Quorum | None, new_id: int, members: tuple[Member, ...]) -> int:
    """``last_drop_id`` of quorum ``new_id`` with ``members``, formed after
    ``prev``: unchanged while quorums only add replicas, else ``new_id``. A
    restarted replica is a new incarnation (another ``joined_quorum_id``): its
    old one was dropped. Without a known predecessor, ``new_id`` (nothing
    older is vouched for)."""
    if prev is None or not prev.last_drop_id:
        return new_id
    kept = {(m.replica_id, m.joined_quorum_id) for m in members}
    if all((m.replica_id, m.joined_quorum_id) in kept for m in prev.members):
        return prev.last_drop_id
    return new_id


@dataclasses.dataclass(slots=True)
class ReplicaView:
    """What the coordinator knows of one replica at decision time.

    Times are coordinator-monotonic seconds. Never mutated, but not frozen:
    a frozen one takes 3.4 us to build, not 0.2 (34 ms a decision at 10,000).
    """

    replica_id: str
    address: str = ""
    world_size: int = 1
    step: int = 0
    catch_up_addresses: tuple[str, ...] = ()
    last_heartbeat: float = 0.0
    registered_at: float = 0.0
    disconnected_at: float | None = None
    failed_at: float | None = None
    ready_since: float | None = None
    catching_up: bool = False
    """A catch-up is under way: not up to date whatever its step, until ready."""
    wait_for_replicas: int = 0
    """The replica count its script waits for before its first step
    (``start(wait_for_replicas=N)``); 0 when not said. A member waits, at
    its step, while its quorum has fewer."""
    beating: bool = True
    """It has heartbeated since it registered: a replica that has not is not admitted."""
    first_heartbeat: float = 0.0
    """When it first heartbeated since it registered (0: unknown): the
    arrival time that the join settle counts from, with ``registered_at``."""
    step_since: float = 0.0
    """When it reported its current step (registered with it, or a heartbeat
    moved it there; 0: unknown): a replica that loaded a restored
    checkpoint holds the state from then (fthsdp/coordinator/decisions/restore_wait.py)."""
    restarted: bool = False
    diverged: bool = False
    cordoned: bool = False
    drain_requested: bool = False
    hung_at: float | None = None
    hung: str = ""
    """Taken out for making no progress while others waited (fthsdp/coordinator/decisions/hang.py)."""
    unreachable: str = ""
    """Why it cannot train with the members (e.g. "unreachable from r0, r1":
    their collectives cannot reach it over the data path, fthsdp/coordinator/decisions/stuck.py).
    Alive, but never a member, a source or admitted until it reaches them again."""
    reconnect_by: float | None = None
    """Set while the replica has not reconnected since this coordinator
    started (it was loaded from the store): the end of its grace to
    reconnect (``lost_at``). ``last_heartbeat`` is then the coordinator's start."""
    returned: bool = False
    """It registered while this coordinator awaited it (loaded from the store,
    within its grace): while such returns go on, the others' graces last
    (``liveness.Awaited.last_return``)."""
    lease_until: float = 0.0
    """Until when it may still commit steps under the last member lease
    granted to it, cut from the coordinator or not (fthsdp/coordinator/decisions/lease.py);
    0: none, or it is confirmed dead."""
    catch_up_fingerprints: tuple[str, ...] = ()
    """Its catch-up certificates' fingerprints, beside ``catch_up_addresses``
    (pinned TLS, fthsdp/agent/training/catchup/tls.py); empty otherwise."""


@dataclasses.dataclass(frozen=True)
class Restoring:
    """A restore from a checkpoint under way (fthsdp/coordinator/engine/checkpoints.py),
    as the decision reads it (rule 9, fthsdp/coordinator/decisions/restore_wait.py)."""

    members: frozenset[str]
    """The replicas its first quorum waits for: the members when the state
    was lost, those of the last quorum that trained a step (a simultaneous
    kill drops them one quorum at a time, in a few milliseconds, as their
    streams close) and of any quorum formed since."""
    quorum_id: int
    """The last quorum that trained a step (its members are among
    ``members``), named in the reasons."""


@dataclasses.dataclass(frozen=True)
class Outage:
    """More than half of a quorum's members went silent at once (rule 4):
    the split-brain guard's wait, remembered from one decision to the next
    (``Decision.outage``, passed back to ``decide``). Those of ``members``
    back early do not end it for the others: a cut that heals reaches the
    members' connections one by one, and a member a moment behind the
    others is as likely cut as they were, not dead."""

    quorum_id: int
    """The quorum whose members went silent: the wait ends with it."""
    members: frozenset[str]
    """Those that went silent at once, back since or not."""
    until: float
    """``join_timeout`` past the latest of their silences (coordinator-monotonic)."""


@dataclasses.dataclass(frozen=True)
class CatchUpSource:
    replica_id: str
    address: str
    step: int
    catch_up_addresses: tuple[str, ...] = ()
    catch_up_fingerprints: tuple[str, ...] = ()
    """Pinned by the joiner (CatchUp.source_catch_up_fingerprints); empty: none to pin."""


@dataclasses.dataclass(frozen=True)
class Decision:
    """The outcome: ``members`` is None to keep the current quorum."""

    members: tuple[Member, ...] | None
    reason: str
    head_step: int
    catch_up: Mapping[str, CatchUpSource]
    settled: bool = False
    """The fast path: every member healthy, nobody pending; until something
    changes or a heartbeat times out, deciding again gives the same answer."""
    state_lost_step: int = 0
    """The committed step that no live replica holds (rule 8); 0: not lost."""
    state_lost: str = ""
    """While lost: what remains, e.g. "no live replica holds it; r0 at step 0"."""
    state_ended: bool = False
    """Every member left on purpose (finished, drained) holding the committed
    step: the state ended with them and the committed step starts over."""
    regroup: bool = False
    """The new quorum regroups the members of the last one (a collective
    among them was stuck): every member leaves the old group at once."""
    leased: tuple[str, ...] = ()
    """Members of the last quorum whose leases the decision waits out
    (fthsdp/coordinator/decisions/lease.py): no member carries on, and these may still
    commit steps, cut from the coordinator."""
    outage: Outage | None = None
    """The split-brain guard's wait under way (rule 4), for the next decision."""

    @property
    def changes_quorum(self) -> bool:
        return self.members is not None


def names(items: Sequence[str], shown: int = 8) -> str:
    """A list for a reason string, cut short: reasons travel to every replica."""
    if len(items) <= shown:
        return ", ".join(items)
    return f"{', '.join(items[:shown])} and {len(items) - shown} more"
