"""The newest quorum this replica knows, fed by the coordinator's pushes.

Read by FTAR's groups (fthsdp/agent/training/ftar/groups.py) and by the
vote; written by the session's watch thread (``update``), under one
condition variable that every wait on a newer quorum waits on.
"""

from __future__ import annotations

import threading
import time
from typing import TypeGuard

from fthsdp.core.errors import FtarTimeout
from fthsdp.protos.v1 import coordinator_pb2 as pb

KEEP_PLACES = 64
"""Ranks remembered, by quorum id: a group is built for one of the last few."""


class QuorumTracker:
    """The newest quorum this replica knows, and its rank in the recent ones
    it is a member of, fed by coordinator push events (which carry no member
    list: the rank, the member count and the first member's address are what
    a group needs)."""

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id
        self.cond = threading.Condition()
        self.quorum: pb.Quorum | None = None
        self._ranks: dict[int, int] = {}
        self.divergence = ""
        """Why the coordinator took this replica out for a checksum mismatch, if it did (named by ``Evicted``)."""

    def update(self, event: pb.WatchEvent) -> None:
        with self.cond:
            if event.HasField("divergence"):
                self.divergence = event.divergence.reason
            if event.HasField("place"):
                self._ranks[event.quorum.id] = event.place.rank
                for old in sorted(self._ranks)[:-KEEP_PLACES]:
                    del self._ranks[old]
            if self.quorum is None or event.quorum.id > self.quorum.id:
                self.quorum = event.quorum
            self.cond.notify_all()

    def out_because(self) -> str:
        """What ``Evicted`` adds to its message: why this replica was taken out, when known."""
        return f": checksum mismatch: {self.divergence}" if self.divergence else ""

    def newest_id(self) -> int:
        return self.quorum.id if self.quorum is not None else 0

    def wait_for_membership(self, timeout: float, min_members: int = 1) -> pb.Quorum:
        """Block until a quorum of at least ``min_members`` includes this replica."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self.includes_me(self.quorum) or self.quorum.member_count < min_members:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FtarTimeout(f"replica {self.replica_id} was not admitted into a quorum within {timeout:g}s")
                self.cond.wait(left)
            return self.quorum

    def rank_in(self, quorum: pb.Quorum | None) -> int | None:
        """This replica's rank in ``quorum``; None if it is not a member."""
        return self._ranks.get(quorum.id) if quorum is not None else None

    def includes_me(self, quorum: pb.Quorum | None) -> TypeGuard[pb.Quorum]:
        return self.rank_in(quorum) is not None
