"""A member's lease: it commits steps only while the coordinator still holds it to be training.

A quorum cut from the coordinator whose members still reach each other
could train on forever, beside the quorum the coordinator forms without it
(a restore from a checkpoint, holders from outside): two lineages. So every
answer to rank 0's heartbeats grants a lease (``HeartbeatResponse.lease_s``),
counted from when that heartbeat was *sent*, so that it always ends before
the coordinator's own record of it (fthsdp/coordinator/decisions/lease.py). Before
the update of every step it trains (not one it replays), the replica checks
its lease (``MemberLease.hold``): if it ran out, it commits nothing and
waits until an answer renews it (the coordinator is back: it goes on) or a
push takes it out of the quorum (``Evicted``: its agent restarts it, and it
catches up with the job's lineage). The heartbeat thread says once that
the lease ran out, and once that it was renewed (``watch``): a member
whose training thread waits in a collective for one that holds commits
nothing either, and says so too.

It stops ``commit_guard`` before the lease's end, so that the update that
began under the lease is done before the coordinator counts it out.

Written by the session's threads (a heartbeat sent, an answer read); read by
the training thread, under one lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from fthsdp.core.errors import Evicted

log = logging.getLogger("fthsdp.agent.lease")

KEEP_SENT = 64
"""Heartbeats whose send times are kept for their answers (older answers renew nothing)."""

WAKE_EVERY = 0.1
"""Seconds between looks at the pushes while the lease is out (a push that evicts does not notify the lease)."""


def commit_guard(lease_s: float) -> float:
    """How long before a lease's end a member stops committing: a fifth of it, at most half a second."""
    return min(0.5, 0.2 * lease_s)


class MemberLease:
    def __init__(self, replica_id: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.replica_id = replica_id
        self._clock = clock
        self._cond = threading.Condition()
        self._seq = 0
        self._sent: dict[int, float] = {}
        self._until = float("-inf")
        """When the lease runs out for committing (its end less the guard), on this process's monotonic clock."""
        self._lease_s = 0.0
        self._heard = float("-inf")
        """When the heartbeat behind the newest grant was sent."""
        self._lapsed_at: float | None = None
        """When the lease ran out, once said (``watch``); None while it holds or nobody said so yet."""

    # ----- the session's threads -------------------------------------------------------

    def sending(self) -> int:
        """A heartbeat that asks for a lease is sent now: its ``lease_seq``."""
        with self._cond:
            self._seq += 1
            self._sent[self._seq] = self._clock()
            if len(self._sent) > KEEP_SENT:
                del self._sent[min(self._sent)]
            return self._seq

    def answered(self, seq: int, lease_s: float) -> None:
        """The coordinator answered heartbeat ``seq`` with a lease of ``lease_s`` (0: none)."""
        lapsed = None
        with self._cond:
            sent = self._sent.pop(seq, None)
            for old in [s for s in self._sent if s < seq]:
                del self._sent[old]  # answered in order: those will not be
            if sent is None or lease_s <= 0:
                return
            until = sent + lease_s - commit_guard(lease_s)
            if until > self._until:
                self._until, self._lease_s, self._heard = until, lease_s, sent
                self._cond.notify_all()
                if self._lapsed_at is not None and until > self._clock():
                    lapsed, self._lapsed_at = self._lapsed_at, None
        if lapsed is not None:  # it said the lease ran out: it says that is over
            log.warning("replica %s: member lease renewed after %.1fs without the coordinator; committing again",
                        self.replica_id, self._clock() - lapsed)

    def watch(self) -> None:
        """Say once that the lease ran out (the session's heartbeat thread, at
        every beat): the member commits nothing from then on, whether its
        training thread is at a step boundary (``hold``) or waits in a
        collective for members that do."""
        with self._cond:
            now = self._clock()
            if self._lapsed_at is not None or self._heard == float("-inf") or now < self._until:
                return
            self._lapsed_at = self._until
            since, lease_s = now - self._heard, self._lease_s
        log.warning("replica %s: member lease lapsed: no answer from the coordinator for %.1fs (lease %gs); "
                    "committing nothing until it answers", self.replica_id, since, lease_s)

    # ----- the training thread ---------------------------------------------------------

    def valid(self) -> bool:
        with self._cond:
            return self._clock() < self._until

    def hold(self, evicted: Callable[[], str]) -> None:
        """Return at once while the lease holds; else commit nothing and wait
        until it is renewed, or raise ``Evicted`` once ``evicted()`` names why
        this replica is out of the quorum (a push came meanwhile)."""
        with self._cond:
            if self._clock() < self._until:
                return
            if self._heard == float("-inf"):  # admitted a moment ago: its first answer as a member is on its way
                log.debug("replica %s: waiting for its first member lease", self.replica_id)
        self.watch()  # says so now if the heartbeat thread has not yet
        with self._cond:
            while self._clock() >= self._until:
                why = evicted()
                if why:
                    raise Evicted(f"while its member lease was out, {why}")
                self._cond.wait(WAKE_EVERY)


__all__ = ["MemberLease", "commit_guard"]
