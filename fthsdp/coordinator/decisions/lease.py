"""Member leases: how long a member cut from the coordinator may still commit steps.

The problem. A quorum whose members can reach each other but not the
coordinator trains on: its collectives need nobody else. If the coordinator
meanwhile forms a quorum with none of those members (it declares the state
lost and restores a checkpoint, or admits holders from outside), two
lineages train at once, and both write checkpoints.

The rule (Chubby's, etcd's, Kubernetes' leader leases, applied to members).
Every answer to a member's heartbeat grants it a lease of ``granted(...)``
seconds, counted *by the member* from when it sent that heartbeat
(fthsdp/agent/training/session/lease.py): before the coordinator received
it, so the member's lease always ends before the coordinator's record of
it. A member whose lease ran out commits nothing until another answer
renews it. The coordinator records, per replica, when the last lease it
granted runs out on its own clock, with a margin for the two clocks' rates
(``lapses_at``), and forms no quorum that no member of the previous one
continues in (which is what a state loss, a restore and a quorum of
outsiders all are) before every member it cannot confirm dead has passed
that point (``unlapsed``, quorum rule 8).

Why only then. A quorum that keeps even one previous member cannot be
trained past by the others: a step commits only on a vote every member of
its group completed (fthsdp/agent/training/ftar/vote.py), and the members
that moved on no longer take part in the old group's collectives.

Leases are granted only to the members of the current quorum the
coordinator holds to be training (not hung, diverged, unreachable, failed or
restarted), so that a member taken out while it still heartbeats stops
being renewed, and waiting for it ends. A replica is confirmed dead, its
lease released, when its agent reports that its processes exited or it
leaves; a closed stream or silence is no proof (a cut looks the same).

A coordinator that starts (a restart, a failover) does not know what its
predecessor granted: every member of the stored quorum is presumed to hold
a lease of the longest the predecessor could have granted from the moment
the new one starts (``presumed``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fthsdp.coordinator.decisions.quorum_types import ReplicaView

CLOCK_RATE_MARGIN = 0.01
"""How much faster the coordinator's clock may run than a member's (1%:
ordinary crystals differ by 0.01%, NTP slews by 0.05% at most)."""

LEASE_SLACK = 0.1
"""Seconds added to every lease on the coordinator's side: the member's
commit that started just before its lease ended finishes within it
(the member also stops ``COMMIT_GUARD`` before its end)."""

LEASE_INTERVALS = 3.0
"""A lease lasts at least this many heartbeat intervals, so that a lost
answer or two never pauses a member (the interval stretches with the number
of senders: fthsdp/coordinator/decisions/heartbeat_pace.py)."""


def granted(member_lease: float, heartbeat_interval: float) -> float:
    """The lease an answer grants now: ``--member-lease``, or longer where
    heartbeats are paced further apart."""
    return max(member_lease, LEASE_INTERVALS * heartbeat_interval)


def lapses_at(now: float, lease_s: float) -> float:
    """When, on the coordinator's clock, a lease of ``lease_s`` granted in an
    answer to a heartbeat received at ``now`` has surely run out for the member."""
    return now + lease_s * (1 + CLOCK_RATE_MARGIN) + LEASE_SLACK


def presumed(started: float, lease_s: float) -> float:
    """The lapse a coordinator that started at ``started`` presumes for every
    member of the stored quorum: its predecessor may have renewed a lease of
    at most ``lease_s`` up to then."""
    return lapses_at(started, lease_s)


def may_be_granted(view: ReplicaView) -> bool:
    """Whether a member of the current quorum is held to be training, so that
    an answer to its heartbeat renews its lease."""
    return not (view.restarted or view.diverged or view.unreachable or view.failed_at is not None
                or view.hung_at is not None)


def unlapsed(ids: Iterable[str], replicas: Mapping[str, ReplicaView], now: float) -> dict[str, float]:
    """The replicas among ``ids`` (the previous quorum's members) whose lease
    has not surely run out at ``now``, with when it will have."""
    out = {}
    for i in ids:
        r = replicas.get(i)
        if r is not None and r.lease_until > now:
            out[i] = r.lease_until
    return out


__all__ = ["CLOCK_RATE_MARGIN", "LEASE_INTERVALS", "LEASE_SLACK", "granted", "lapses_at", "may_be_granted",
           "presumed", "unlapsed"]
