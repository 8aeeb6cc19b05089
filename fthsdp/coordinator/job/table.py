"""The fields of one job's membership table, and the lookups every part of it shares.

``JobState`` (fthsdp/coordinator/job/state.py) is one object: what the coordinator
knows of each replica (``ReplicaEntry``, heartbeats in memory only), the
current quorum and the flags that say when to decide again. Its behaviour
comes in parts, each a class over these fields in a module of its own: what
replicas' and operators' calls change (fthsdp/coordinator/job/replica_calls.py),
the checks that take members out (fthsdp/coordinator/job/member_checks.py) and
the decisions (fthsdp/coordinator/job/state.py). ``JobTable`` is what they have in
common: the fields, with what each means, loading them after a (re)start,
the read-only views and the lookups (``set_quorum``, ``_session``). It is
apart so that each part reads the one definition of the state it works on.
"""

from __future__ import annotations

from fthsdp.coordinator.decisions import lease
from fthsdp.coordinator.decisions.hang import HangRules
from fthsdp.coordinator.decisions.progress import ProgressBook
from fthsdp.coordinator.decisions.quorum_types import CatchUpSource, Member, Outage, Quorum, Rules
from fthsdp.coordinator.decisions.reach_book import ReachBook
from fthsdp.coordinator.job import replica_status, watch_events
from fthsdp.coordinator.job.replica_entry import ReplicaEntry, seed_entries
from fthsdp.coordinator.job.schedule import DecisionSchedule
from fthsdp.coordinator.ledger.value import FixedLedger, LedgerView
from fthsdp.core.errors import NotFound, StaleSession
from fthsdp.protos.v1 import coordinator_pb2 as pb

KEEP_QUORUMS = 64
"""Recent quorums whose members are kept (``was_member``): a checkpoint is
sealed seconds after its step, many quorums later at most in a job that is
changing fast."""

NO_LEDGER = FixedLedger()
"""The ledger of a table made without a store: empty."""

DEFAULT_HANG_RULES = HangRules()
"""The hang and straggler rules of a job made without any (frozen: one shared instance)."""


class JobTable:
    """The state of one job's membership table (``JobState`` adds what changes it)."""

    def __init__(self, name: str, rules: Rules, hang_rules: HangRules = DEFAULT_HANG_RULES,
                 ledger: LedgerView = NO_LEDGER) -> None:
        self.name = name
        self.ledger = ledger
        """What the store holds of the job (its writer: fthsdp/coordinator/ledger/writer.py); read here, never
        written."""
        self.rules = rules
        self.progress = ProgressBook(hang_rules)  # every process's progress; the hang verdicts
        self.hang_horizon = hang_rules.ceiling  # what watchers were told of the longest a member may stall
        self.horizon_moved = False  # the last check_progress changed what watchers are told: they must hear of it
        self.reach = ReachBook()  # a stuck collective's regroup and probes (fthsdp/coordinator/decisions/stuck.py)
        self._unreachable: set[str] = set()
        """Replicas kept out as unreachable (``Standing.unreachable``): asked to probe the members."""
        self.marks_to_store: set[str] = set()
        """Replicas whose unreachable mark was set or cleared and is not stored
        yet (``mark_records``): a coordinator that starts must keep a still-cut
        replica out, not let it back to fail its catch-up in a loop."""
        self.quorum: Quorum | None = None
        self.quorum_revision = 0
        self.replicas: dict[str, ReplicaEntry] = {}
        self.catch_up: dict[str, CatchUpSource] = {}
        self.agents: dict[str, tuple[pb.AgentState, int, str]] = {}
        self.reason = "no decision yet"
        self._members: dict[str, Member] = {}
        """The current quorum's members by replica id."""
        self._ranks: dict[str, int] = {}
        """Each member's position in the current quorum: its rank in the FTAR group."""
        self._decided_at = float("-inf")
        self._expiry_bound = (0.0, float("-inf"))
        """(timeout, t): no heartbeat timeout runs out before t (see needs_decision)."""
        self._silent: set[str] = set()
        """Non-members whose heartbeat timeout ran out (see notice_silent_outsiders)."""
        self.schedule = DecisionSchedule()
        """When the quorum is decided next (fthsdp/coordinator/job/schedule.py): at once when
        something the decision reads changed, at the poll time when only joiners moved, never
        while it is settled and no heartbeat timeout runs out (``needs_decision``)."""
        self.checksums_dirty = False
        """A checksum arrived (or the members changed) since ``check_checksums`` last looked."""
        self._senders: int | None = None
        """Heartbeating processes (ranks of registered replicas), recounted after a session change."""
        self.committed_step = 0
        """The highest step any member of a quorum has reported: the state
        the job must not lose (fthsdp/coordinator/engine/committed.py stores it)."""
        self.trained: Quorum | None = None
        """The quorum whose member last reported a step past the committed one:
        its members held the state when it was lost (a restore waits for them,
        fthsdp/coordinator/decisions/restore_wait.py). None until one does since this
        coordinator started."""
        self.state_lost_step = 0
        """From the latest decision: the committed step no live replica holds (0: not lost)."""
        self.state_lost = ""
        """From the latest decision, while lost: what remains."""
        self._quorum_members: dict[int, frozenset[str]] = {}
        """The members of the last few quorums, by id (``was_member``)."""
        self.restore: pb.CheckpointRecord | None = None
        """While the state is restored from this checkpoint (fthsdp/coordinator/engine/checkpoints.py):
        sent to every watcher until a quorum forms at its step."""
        self.lease_s = rules.member_lease
        """The member lease an answer grants now (fthsdp/coordinator/decisions/lease.py ``granted``: stretched with
        the pace)."""
        self.outage: Outage | None = None
        """From the latest decision: the split-brain guard's wait under way (quorum rule 4), passed to the next."""
        self._left: dict[str, str] = {}
        """Why each member of the current quorum that left on purpose left ("finished", "drained")."""

    # ----- loading after a (re)start -------------------------------------------------

    def load(
        self,
        quorum: Quorum | None,
        quorum_revision: int,
        records: dict[str, tuple[pb.ReplicaRecord, int]],
        now: float,
        committed_step: int = 0,
    ) -> None:
        """Seed the table from the store. Known replicas are presumed alive for
        one heartbeat timeout so that a coordinator restart drops nobody who
        reconnects in time."""
        self.set_quorum(quorum, quorum_revision)
        self.committed_step = committed_step
        self.replicas.update(seed_entries(self._members, records, now))
        # What a predecessor granted is unknown: the most it could have, from now
        # (fthsdp/coordinator/decisions/lease.py).
        for rid in self._members:
            self.replicas[rid].standing.lease_until = lease.presumed(now, self.lease_s)
        self._unreachable |= {rid for rid, e in self.replicas.items() if e.standing.unreachable}

    # ----- views ---------------------------------------------------------------------

    def replica_state(self, entry: ReplicaEntry, now: float, returned_at: float = 0.0) -> int:
        """``returned_at``: ``replica_status.last_return``, read once for many entries."""
        return replica_status.state_of(self, entry, now, returned_at)

    def last_return(self) -> float:
        return replica_status.last_return(self)

    def replica_statuses(self, now: float) -> list[pb.ReplicaStatus]:
        return replica_status.statuses(self, now)

    def watch_event(self, replica_id: str, leader: str) -> pb.WatchEvent:
        """What is particular to one watcher (fthsdp/coordinator/job/watch_events.py)."""
        return watch_events.own_event(self, replica_id, leader)

    def rank_of(self, replica_id: str) -> int | None:
        """A member's position in the current quorum: its rank in the FTAR group."""
        return self._ranks.get(replica_id)

    # ----- helpers -------------------------------------------------------------------

    def heartbeat_ages(self, now: float) -> list[float]:
        """Seconds since each connected replica was last heard of (its most silent rank)."""
        return [
            now - e.view_heartbeat()
            for e in self.replicas.values()
            if e.incarnation.session_id is not None and e.incarnation.disconnected_at is None
        ]

    def senders(self) -> int:
        """What heartbeats, as the pace counts it: every rank of every registered
        replica, or, where its ranks' pings come batched, its rank 0 alone (the
        batches are counted as the Pings streams that carry them: ``ServedJob.ping_streams``).
        A replica started by node agents (``agent_ids``) counts so from its registration: its ranks ping
        through their agents' relays, and counting its every rank until its first batch came stretched
        the pace for a moment whenever thousands registered at once (a failover)."""
        if self._senders is None:
            self._senders = sum(1 if e.incarnation.pings_batched or e.incarnation.agent_ids
                                else e.incarnation.world_size
                                for e in self.replicas.values() if e.incarnation.session_id is not None)
        return self._senders

    def is_member(self, replica_id: str) -> bool:
        return replica_id in self._members

    def was_member(self, replica_id: str, quorum_id: int) -> bool:
        """Whether ``replica_id`` was a member of quorum ``quorum_id``, as far
        as this coordinator knows (the last ``KEEP_QUORUMS`` quorums it
        formed or loaded; an older one is not known, and counts as no)."""
        return replica_id in self._quorum_members.get(quorum_id, ())

    @property
    def generation(self) -> int:
        """The job's lineage, as stored: one more after every restore from a
        checkpoint or give-up (fthsdp/coordinator/engine/committed.py), whose
        checkpoints are the only ones recorded from then on."""
        return self.ledger.current.generation

    @property
    def lineage_from(self) -> int:
        """The quorum id current when this generation began: a checkpoint
        written in a quorum up to it is of an older lineage (fthsdp/coordinator/engine/checkpoints.py)."""
        return self.ledger.current.lineage_from

    @property
    def finished(self) -> pb.JobFinished | None:
        """Set, as stored, once every member of the last quorum left finished
        (fthsdp/coordinator/engine/committed.py): no quorum forms, and every
        watcher is told, until an operator reopens the job (``reopen``)."""
        return self.ledger.current.finished

    def set_quorum(self, quorum: Quorum | None, revision: int) -> None:
        """Adopt ``quorum`` (stored at ``revision``) as the current one."""
        self.quorum, self.quorum_revision = quorum, revision
        self._members = {m.replica_id: m for m in quorum.members} if quorum else {}
        if quorum is not None:
            self._quorum_members[quorum.id] = frozenset(self._members)
            for old in sorted(self._quorum_members)[:-KEEP_QUORUMS]:
                del self._quorum_members[old]
        self._ranks = {rid: rank for rank, rid in enumerate(self._members)}  # the list's order
        self._left = {rid: why for rid, why in self._left.items() if rid in self._members}
        self.checksums_dirty = True
        self.schedule.now()

    def of_incarnation(self, replica_id: str, incarnation: str) -> ReplicaEntry:
        """The entry a rank other than 0 speaks for: registered, with the key
        it carries (``RegisterRequest.incarnation``) when rank 0 gave one."""
        entry = self.replicas.get(replica_id)
        if entry is None or entry.incarnation.session_id is None:
            raise NotFound(f"replica {replica_id!r} is not registered in job {self.name!r}; its rank 0 registers it")
        if entry.incarnation.key and incarnation != entry.incarnation.key:
            raise StaleSession(f"a rank of replica {replica_id!r} that is not of its registered incarnation")
        return entry

    def _session(self, replica_id: str, session_id: str) -> ReplicaEntry:
        entry = self.replicas.get(replica_id)
        if entry is None or entry.incarnation.session_id is None:
            raise NotFound(f"replica {replica_id!r} is not registered in job {self.name!r}; register first")
        if entry.incarnation.session_id != session_id:
            raise StaleSession(
                f"session {session_id!r} of replica {replica_id!r} was replaced by a newer registration"
            )
        return entry
