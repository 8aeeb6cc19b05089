"""The coordinator's pushes as this rank knows them: one copy, under one condition.

The session's watch thread writes it (``update``, for every push:
fthsdp/agent/training/session/membership.py); every other part reads it,
and waits on its condition for a newer push: FTAR's groups and its vote
(the newest quorum, this replica's rank in it), the joiner (the newest push
as a whole: a source named, an admission, a drain), the eviction watch,
and the participation (this replica's place in a recent quorum). Pushes
carry no member list: the rank, the member count and the first member's
address are what a group needs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeGuard

from fthsdp.core.errors import FtarTimeout
from fthsdp.protos.v1 import coordinator_pb2 as pb

KEEP_PLACES = 64
"""Places remembered, by quorum id: a group is built, and a step's basis
taken, in one of the last few quorums."""


class QuorumView:
    """The newest push, the newest quorum, and this replica's places in the recent ones."""

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id
        self.cond = threading.Condition()
        """Held to read more than one field at once; notified on every push."""
        self.latest: pb.WatchEvent | None = None
        """The last push, whatever its quorum (a drain, a catch-up source, a finished job)."""
        self.quorum: pb.Quorum | None = None
        """The newest quorum pushed (the highest id)."""
        self._places: dict[int, tuple[int, int]] = {}
        """By quorum id: (this replica's rank, the member count), for the quorums it is a member of."""
        self._generations: dict[int, int] = {}
        """By quorum id: the job's lineage it trains, for the same quorums as ``_places``."""
        self.divergence = ""
        """Why the coordinator took this replica out for a checksum mismatch, if it did (named by ``Evicted``)."""

    def update(self, event: pb.WatchEvent) -> None:
        """A push (the session's watch thread)."""
        with self.cond:
            self.latest = event
            if event.HasField("divergence"):
                self.divergence = event.divergence.reason
            if event.HasField("place"):
                self._places[event.quorum.id] = (event.place.rank, event.quorum.member_count)
                self._generations[event.quorum.id] = event.quorum.generation
                for old in sorted(self._places)[:-KEEP_PLACES]:
                    del self._places[old]
                    self._generations.pop(old, None)
            # A quorum that lists this replica with its place withheld (its rank 0 not back with a
            # coordinator that restarted) is not taken as pushed yet: the place follows.
            if (self.quorum is None or event.quorum.id > self.quorum.id) and not event.place_withheld:
                self.quorum = event.quorum
            self.cond.notify_all()

    # ----- the newest quorum -----------------------------------------------------------

    def generation_of(self, quorum_id: int) -> int:
        """The job's lineage that quorum ``quorum_id`` trains (this replica a
        member of it); its checkpoints go to that lineage's folders."""
        with self.cond:
            return self._generations.get(quorum_id, self.quorum.generation if self.quorum is not None else 0)

    def newest_id(self) -> int:
        return self.quorum.id if self.quorum is not None else 0

    def rank_in(self, quorum: pb.Quorum | None) -> int | None:
        """This replica's rank in ``quorum``; None if it is not a member."""
        with self.cond:
            place = self._places.get(quorum.id) if quorum is not None else None
        return place[0] if place is not None else None

    def includes_me(self, quorum: pb.Quorum | None) -> TypeGuard[pb.Quorum]:
        return self.rank_in(quorum) is not None

    def out_because(self) -> str:
        """What ``Evicted`` adds to its message: why this replica was taken out, when known."""
        return f": checksum mismatch: {self.divergence}" if self.divergence else ""

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

    # ----- the newest push -------------------------------------------------------------

    def wait_for(self, predicate: Callable[[pb.WatchEvent], bool], timeout: float) -> pb.WatchEvent:
        """Block until the last push satisfies ``predicate``; TimeoutError after ``timeout``."""
        end = time.monotonic() + timeout
        with self.cond:
            while self.latest is None or not predicate(self.latest):
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no matching coordinator event within {timeout}s; latest: {self.latest}")
                self.cond.wait(left)
            return self.latest

    def is_member(self, event: pb.WatchEvent | None = None) -> bool:
        """Whether ``event`` (by default the last push) gives this replica a place."""
        event = event or self.latest
        return event is not None and event.HasField("place")

    # ----- places ----------------------------------------------------------------------

    def place_in(self, quorum_id: int) -> tuple[int, int] | None:
        """(rank, member count) of this replica in quorum ``quorum_id``; None if not a member."""
        with self.cond:
            return self._places.get(quorum_id)

    def newest_place(self) -> tuple[int, int] | None:
        """(rank, member count) in the newest quorum that includes this replica; None if none did."""
        with self.cond:
            return self._places[max(self._places)] if self._places else None

    def newest_count(self) -> int:
        """Members of the newest quorum, a member of it or not (0: none pushed)."""
        with self.cond:
            return self.quorum.member_count if self.quorum is not None else 0


__all__ = ["KEEP_PLACES", "QuorumView"]
