"""One job as a coordinator serves it: its ``JobState`` plus what the
runtime (fthsdp/coordinator/engine/runtime.py) keeps beside it: the heartbeat pace, the
stored committed step, the watchers' events and the recent quorum history."""

from __future__ import annotations

import asyncio
from collections import deque

from fthsdp.coordinator.config import JobSettings
from fthsdp.coordinator.decisions.heartbeat_pace import HeartbeatPacer
from fthsdp.coordinator.decisions.quorum_types import Quorum
from fthsdp.coordinator.engine import checkpoints, committed
from fthsdp.coordinator.engine.broadcast import Broadcast
from fthsdp.coordinator.hosts.table import HostTable
from fthsdp.coordinator.job.state import JobState
from fthsdp.coordinator.job.watch_events import WatchEvents
from fthsdp.coordinator.ledger.keys import JobKeys
from fthsdp.coordinator.ledger.writer import Guard, LedgerWriter, no_guard
from fthsdp.coordinator.store import Store
from fthsdp.protos.v1 import coordinator_pb2 as pb

HISTORY_LENGTH = 200
"""Quorum changes kept per job for the status page (the store keeps only the current one)."""



class ServedJob:
    """A JobState plus what the runtime keeps beside it."""

    def __init__(self, name: str, settings: JobSettings, store: Store, guard: Guard = no_guard) -> None:
        self.settings = settings
        """What the engine reads of the configuration for this job (fthsdp/coordinator/config.py)."""
        self.keys = JobKeys(settings.store_prefix, name)
        self.ledger = LedgerWriter(store, self.keys, guard)
        """What the store holds of the job, and its one writer (fthsdp/coordinator/ledger/writer.py)."""
        self.state = JobState(name, settings.rules, settings.hang_rules, ledger=self.ledger)
        self.pacer = HeartbeatPacer(settings.heartbeat_interval, settings.rules.heartbeat_timeout,
                                    settings.heartbeat_budget)
        self.committed = committed.CommittedRecord(self.ledger)
        """The stored committed step (fthsdp/coordinator/engine/committed.py)."""
        self.checkpoints = checkpoints.CheckpointBook(self.ledger)
        """The job's complete checkpoints (fthsdp/coordinator/engine/checkpoints.py)."""
        self.epoch = 0
        self.events = WatchEvents()
        """The current quorum and what watchers are sent (fthsdp/coordinator/job/watch_events.py)."""
        self.lock = asyncio.Lock()  # serialises this job's store writes
        self.backlog = 0.0
        """How late the typical replica's heartbeats arrive (fthsdp/coordinator/engine/loop_lag.py), measured every
        decision_loop.BACKLOG_EVERY."""
        self.backlog_at = float("-inf")
        self.change_since: float | None = None
        """When a decision first said the membership must change (for the formation latency)."""
        self.changes = Broadcast()
        """Wakes the watchers, a batch per turn of the loop (fthsdp/coordinator/engine/broadcast.py)."""
        self._replica_changes: dict[str, tuple[Broadcast, int]] = {}
        """Wakes one replica's watchers alone (``notify_replica``), by replica id while it has any:
        the broadcast and how many watchers follow it."""
        self.logged_reason = ""
        self.lease_wait: tuple[int, frozenset[str]] = (0, frozenset())
        """The quorum whose members' leases the decision waits out and the replicas its ``lease_wait`` events
        named: one event per wait (decision_loop._log_lease_wait)."""
        self.ping_streams = 0
        """Pings streams open that carry this job's pings (a host's relay, or a group's host 0 for its hosts):
        each a heartbeat sender of one batch per interval, counted in the heartbeat budget."""
        self.hosts = HostTable(name, settings.rendezvous)
        """The hosts of the job's groups of several hosts and their rounds (fthsdp/coordinator/hosts/table.py)."""
        self.history: deque[dict] = deque(maxlen=HISTORY_LENGTH)
        """The latest quorums this coordinator formed or loaded: {id, members, reason, time} (unix seconds)."""

    def remember(self, quorum: Quorum) -> None:
        self.history.append({"id": quorum.id, "members": list(quorum.member_ids), "reason": quorum.reason,
                             "time": quorum.created_unix_ms / 1000})

    @property
    def quorum_pb(self) -> pb.Quorum | None:
        return self.events.quorum

    def set_quorum(self, quorum_pb: pb.Quorum | None) -> None:
        self.events.update(quorum_pb)

    def notify(self) -> None:
        """Wake every watcher."""
        self.changes.notify()

    def notify_replica(self, replica_id: str) -> None:
        """Wake the watchers of ``replica_id`` alone: something of its own changed (its place)."""
        followed = self._replica_changes.get(replica_id)
        if followed is not None:
            followed[0].notify()

    def follow_replica(self, replica_id: str) -> Broadcast:
        """A watcher of ``replica_id`` opens: the broadcast that wakes its watchers alone."""
        broadcast, count = self._replica_changes.get(replica_id, (None, 0))
        broadcast = broadcast or Broadcast()
        self._replica_changes[replica_id] = (broadcast, count + 1)
        return broadcast

    def unfollow_replica(self, replica_id: str) -> None:
        broadcast, count = self._replica_changes[replica_id]
        if count > 1:
            self._replica_changes[replica_id] = (broadcast, count - 1)
        else:
            del self._replica_changes[replica_id]
