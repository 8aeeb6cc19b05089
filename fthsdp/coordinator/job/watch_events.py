"""What Watch streams are sent, serialized once per quorum.

A replica is sent the quorum without its members (``HEADER``) and its own
place in it: its rank, with the member count and the first member's address
(the group's store), is all it needs to train. A list for every member
would make forming a 10,000-replica quorum 10,000 lists of 10,000 names,
gigabytes through the coordinator. The list goes only to watchers that ask
(WatchRequest.member_list: tools, the simulated replicas of the tests) and
may see it (members, or watchers of no replica): the whole list once
(``FULL``), then deltas from the quorum the stream was last sent (``DELTA``;
an empty one, ``SAME``, while that is still the current quorum).

Events are serialized here, not by gRPC: the shared part is made once per
quorum and every watcher appends its own few fields (protobuf merges
concatenated messages). The concatenation itself is made once for all
watchers whose own fields are the same, so a list costs one copy, not one
per watcher.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from fthsdp.coordinator.decisions.quorum_types import CatchUpSource
from fthsdp.coordinator.decisions.reach_book import ReachBook
from fthsdp.coordinator.job.replica_entry import ReplicaEntry
from fthsdp.core import quorum_delta
from fthsdp.protos.v1 import coordinator_pb2 as pb


class WatcherView(Protocol):
    """What a watcher's own fields are read from (a ``JobState``)."""

    reason: str
    state_lost_step: int
    hang_horizon: float
    restore: pb.CheckpointRecord | None
    reach: ReachBook

    @property
    def finished(self) -> pb.JobFinished | None: ...

    @property
    def replicas(self) -> Mapping[str, ReplicaEntry]: ...

    @property
    def catch_up(self) -> Mapping[str, CatchUpSource]: ...

    def rank_of(self, replica_id: str) -> int | None: ...


FULL, HEADER, SAME, DELTA = "full", "header", "same", "delta"

_MEMO_LIMIT = 256
"""Concatenations kept per quorum; many joiners, each with its own source, should not be hoarded."""


class WatchEvents:
    def __init__(self) -> None:
        self.quorum: pb.Quorum | None = None
        self.header: pb.Quorum | None = None
        """``quorum`` without its members: what a delta event, or a joiner, gets."""
        self.delta: pb.QuorumDelta | None = None
        """How ``quorum``'s members differ from the quorum before it."""
        self._shared: dict[str, bytes] = dict.fromkeys((FULL, HEADER, SAME, DELTA), b"")
        self._joined: dict[tuple[str, bytes], bytes] = {}

    @property
    def quorum_id(self) -> int:
        return self.quorum.id if self.quorum is not None else 0

    def update(self, quorum: pb.Quorum | None) -> None:
        """Adopt ``quorum`` as the current one and serialize what watchers get."""
        previous, self.quorum = self.quorum, quorum
        self.header = quorum_delta.without_members(quorum) if quorum is not None else None
        if quorum is not None and previous is not None and previous.id != quorum.id:  # a new quorum
            self.delta = quorum_delta.diff(previous, quorum)
        else:
            self.delta = None
        header = self.header
        self._shared = {
            FULL: pb.WatchEvent(quorum=quorum).SerializeToString() if quorum is not None else b"",
            HEADER: pb.WatchEvent(quorum=header).SerializeToString() if header is not None else b"",
            SAME: pb.WatchEvent(quorum=header, delta=pb.QuorumDelta(base_id=header.id)).SerializeToString()
            if header is not None else b"",
            DELTA: pb.WatchEvent(quorum=header, delta=self.delta).SerializeToString()
            if self.delta is not None else b"",
        }
        self._joined.clear()

    def kind_for(self, sees_members: bool, sent_quorum: int) -> str:
        """What a stream gets next, given whether it may see the members and
        the quorum whose list it holds (0: none)."""
        if not sees_members:
            return HEADER
        if sent_quorum and sent_quorum == self.quorum_id:
            return SAME
        if self.delta is not None and self.delta.base_id == sent_quorum:
            return DELTA
        return FULL

    def event(self, kind: str, own: bytes) -> bytes:
        """The shared event ``kind`` with a watcher's own fields appended."""
        key = (kind, own)
        event = self._joined.get(key)
        if event is None:
            if len(self._joined) >= _MEMO_LIMIT:
                self._joined.clear()
            event = self._joined[key] = self._shared[kind] + own
        return event


def own_event(state: WatcherView, replica_id: str, leader: str) -> pb.WatchEvent:
    """What is particular to one watcher (its place in the quorum,
    catch-up source and drain flag) and the latest reason; the quorum is
    added by the runtime."""
    event = pb.WatchEvent(leader=leader, reason=state.reason, state_lost_step=state.state_lost_step)
    rank = state.rank_of(replica_id) if replica_id else None
    entry = state.replicas.get(replica_id) if replica_id else None
    # The place is for the incarnation that trains in the quorum, known
    # once it registered with this coordinator saying so: a restarted
    # member stays listed until the next quorum drops it (never, while
    # the state is lost), and after a coordinator restart a listed
    # replica's watcher may be a fresh process; neither may take the
    # old place and train on from its own step.
    inc = entry.incarnation if entry is not None else None
    if rank is not None and inc is not None and inc.session_id is not None and not inc.restarted:
        event.place.rank = rank
    elif rank is not None and (inc is None or inc.session_id is None):
        # Listed, its incarnation not back yet (a coordinator restarted): its ranks wait for the
        # place rather than count themselves out (fthsdp/agent/training/quorum_view.py).
        event.place_withheld = True
    event.hang_limit_s = state.hang_horizon
    if state.finished is not None:
        event.finished.CopyFrom(state.finished)
    if state.restore is not None:
        event.restore.CopyFrom(state.restore)
    if entry is not None and inc is not None:
        event.drain_requested = entry.standing.drain_requested
        if inc.divergence is not None:
            event.divergence.CopyFrom(inc.divergence)
        probe = state.reach.probe_for(replica_id, rank is not None)
        if probe is not None:
            event.probe.CopyFrom(probe)
        event.unreachable = entry.standing.unreachable
        if inc.notice:
            event.hang.CopyFrom(pb.HangNotice(reason=inc.notice, restart_count=inc.restart_count, step=inc.step))
        source = state.catch_up.get(replica_id)
        if source is not None:
            event.catch_up.CopyFrom(
                pb.CatchUp(
                    source_replica_id=source.replica_id,
                    source_address=source.address,
                    source_step=source.step,
                    source_catch_up_addresses=source.catch_up_addresses,
                    source_catch_up_fingerprints=source.catch_up_fingerprints,
                )
            )
    return event
