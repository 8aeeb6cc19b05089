"""Quorum member lists pushed as deltas.

A membership change used to push the whole member list to every watcher:
with N replicas, N lists of N members, O(N^2) bytes per change (at 10,000
replicas, gigabytes for one failure). The coordinator now sends each watcher
the full list once, when its Watch stream opens, and afterwards only what
changed since the quorum it was last sent: the new quorum's fields without
members, plus the members added and removed (``WatchEvent.delta``). A
member's entry never changes while it stays (fthsdp/coordinator/decisions/quorum.py), so the
receiver rebuilds the exact list; ``member_count`` lets it check.

A replica that is not a member gets the quorum without members at all (it
needs its catch-up source and whether it is in, not the list), and the whole
list when it is admitted.

Pure functions over the protobuf messages, used by the coordinator
(``diff``, ``without_members``) and by every client of Watch (``resolve``).
"""

from __future__ import annotations

from fthsdp.protos.v1 import coordinator_pb2 as pb


class StaleDelta(Exception):
    """The event's delta does not apply to the quorum the receiver holds: it
    must reopen its Watch stream, whose first event carries the full list."""


def diff(base: pb.Quorum, new: pb.Quorum) -> pb.QuorumDelta:
    """What turns ``base``'s member list into ``new``'s."""
    old = {m.replica_id: m for m in base.members}
    now = {m.replica_id: m for m in new.members}
    # An entry that changed (only a writer that breaks the keep-entries rule
    # does that) is removed and added again.
    return pb.QuorumDelta(
        base_id=base.id,
        added=[m for m in new.members if old.get(m.replica_id) != m],
        removed=sorted(rid for rid, m in old.items() if now.get(rid) != m),
    )


def without_members(quorum: pb.Quorum) -> pb.Quorum:
    """The quorum's fields with an empty member list (what a delta event carries)."""
    header = pb.Quorum()
    header.CopyFrom(quorum)
    del header.members[:]
    header.member_count = len(quorum.members)
    return header


def resolve(held: pb.Quorum | None, event: pb.WatchEvent) -> pb.Quorum:
    """The full quorum an event describes, given the one the receiver holds.

    Raises StaleDelta when the delta is for another quorum than ``held`` or
    the rebuilt list does not have ``member_count`` members.
    """
    if not event.HasField("delta"):
        return event.quorum
    delta = event.delta
    if held is None or held.id != delta.base_id:
        have = held.id if held is not None else "none"
        raise StaleDelta(f"delta from quorum {delta.base_id}, but this client holds {have}")
    removed = set(delta.removed)
    members = {m.replica_id: m for m in held.members if m.replica_id not in removed}
    for m in delta.added:
        members[m.replica_id] = m
    full = pb.Quorum()
    full.CopyFrom(event.quorum)
    full.members.extend(members[rid] for rid in sorted(members))
    if len(full.members) != event.quorum.member_count:
        raise StaleDelta(
            f"rebuilt {len(full.members)} members of quorum {full.id}, expected {event.quorum.member_count}")
    return full
