"""Whether a replica is lost: the liveness half of the quorum rules (rule 1).

``lost_at`` says when and why a replica was lost (a failure report, a hang,
its stream closing, its heartbeats stopping), or None while it is alive;
``Awaited`` is what a coordinator that just started waits for: the members
of the stored quorum not back yet, each with a grace to reconnect
(``ReplicaView.reconnect_by``). The decision (fthsdp/coordinator/decisions/quorum.py)
judges every replica by them, and so does the status view
(fthsdp/coordinator/job/replica_status.py): kept apart so that the status need
not import the decision, and the per-replica judgment reads on its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from fthsdp.coordinator.decisions.quorum_types import Quorum, ReplicaView, Rules


def lost_at(
    r: ReplicaView, now: float, rules: Rules, others_back_at: float | None = None, last_return: float = 0.0
) -> tuple[float, str, bool] | None:
    """When and why a replica was lost, or None while it is alive.

    The third element says whether the loss was explicit (a report, a restart)
    rather than silence, which the split-brain guard treats differently.

    A replica that has not reconnected since the coordinator started
    (``reconnect_by`` set) is silent by the coordinator's doing, not its
    own: until its grace ends it is neither lost nor silent, unless the
    other members are back (``others_back_at``, see ``Awaited``: the latest
    registration; None while some are still missing). Then it is judged as
    a replica last heard from then (or at the coordinator's start) would be.

    The grace lasts, too, while the replicas the coordinator found in its
    store are still coming back: until a heartbeat timeout past the latest
    return (``last_return``, see ``Awaited``). Thousands of hosts reconnecting
    to a new leader take longer than any fixed grace on a loaded machine, and
    a replica still in that queue is not silent; the returns are finite (each
    stored replica returns once), so the extension is too.
    """
    if r.failed_at is not None:
        return r.failed_at, "reported failed", True
    if r.hung_at is not None:
        return r.hung_at, r.hung, True
    if rules.disconnect_is_failure and r.disconnected_at is not None:
        return r.disconnected_at, "stream closed", False
    expiry = r.last_heartbeat + rules.heartbeat_timeout
    if r.reconnect_by is not None:
        if now < max(r.reconnect_by, last_return + rules.heartbeat_timeout) and others_back_at is None:
            return None
        expiry = max(r.last_heartbeat, others_back_at or 0.0) + rules.heartbeat_timeout
        if now >= expiry:
            return expiry, "not reconnected since the coordinator started", False
        return None
    if now >= expiry:
        return expiry, "heartbeat timeout", False
    return None


def latest_return(replicas: Iterable[ReplicaView]) -> float:
    """The latest registration of a replica found in the store that came back
    to its grace (``ReplicaView.returned``), or of one still awaited (its
    registration: the coordinator's start): while they keep coming back,
    every grace lasts (``lost_at``'s ``last_return``)."""
    return max((r.registered_at for r in replicas if r.reconnect_by is not None or r.returned), default=0.0)


@dataclasses.dataclass(frozen=True)
class Awaited:
    """After a coordinator start: the members of the current quorum not back
    yet, whether a replica failed before it reconnected, and the latest
    registration since the start (what ``lost_at`` judges the last missing
    member by), and the latest return of a replica found in the store (what
    extends every grace while they keep coming back)."""

    ids: frozenset[str] = frozenset()
    blocked: bool = False
    """A replica failed (its agent said so) before it reconnected: until it
    registers again, nothing tells how long the clients take to reconnect."""
    last_back: float = 0.0
    last_return: float = 0.0
    """The latest registration of a replica that came back to its grace
    (``ReplicaView.returned``), or the coordinator's start."""

    @classmethod
    def of(cls, prev: Quorum | None, replicas: Mapping[str, ReplicaView]) -> Awaited:
        members = prev.member_ids if prev is not None else ()
        ids = frozenset(i for i in members if (r := replicas.get(i)) is not None and r.reconnect_by is not None
                        and r.failed_at is None)
        last_return = latest_return(replicas.values())
        if not ids:
            return cls(last_return=last_return)
        blocked, last_back = False, 0.0
        for r in replicas.values():
            if r.reconnect_by is not None:
                blocked = blocked or r.failed_at is not None
            else:
                last_back = max(last_back, r.registered_at)
        return cls(ids, blocked, last_back, last_return)

    def lost_at(self, replica_id: str, r: ReplicaView, now: float, rules: Rules) -> tuple[float, str, bool] | None:
        """``lost_at`` for one of the replicas this was made of."""
        return lost_at(r, now, rules, self.others_back_at(replica_id), self.last_return)

    def others_back_at(self, replica_id: str) -> float | None:
        """For ``lost_at``: when the latest replica registered, if every member
        but ``replica_id`` is back (None if some are not, or while blocked)."""
        if not self.ids:
            return self.last_back
        if self.blocked or len(self.ids) > 1 or replica_id not in self.ids:
            return None
        return self.last_back
