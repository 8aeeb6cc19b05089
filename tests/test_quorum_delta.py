"""Member lists pushed as deltas: the receiver rebuilds exactly the coordinator's list."""

from __future__ import annotations

import random

import pytest

from fthsdp.core import quorum_delta
from fthsdp.protos.v1 import coordinator_pb2 as pb


def member(rid: str, joined: int = 1) -> pb.QuorumMember:
    return pb.QuorumMember(replica_id=rid, address=f"{rid}:1", world_size=1, step=joined * 10, joined_quorum_id=joined)


def quorum(qid: int, *members: pb.QuorumMember) -> pb.Quorum:
    ordered = sorted(members, key=lambda m: m.replica_id)
    return pb.Quorum(id=qid, members=ordered, member_count=len(ordered), reason=f"q{qid}", step=qid)


def delta_event(base: pb.Quorum, new: pb.Quorum) -> pb.WatchEvent:
    event = pb.WatchEvent(quorum=quorum_delta.without_members(new))
    event.delta.CopyFrom(quorum_delta.diff(base, new))
    return event


A, B, C, D = member("a"), member("b"), member("c"), member("d", 2)


@pytest.mark.parametrize(
    "base, new, added, removed",
    [
        (quorum(1, A, B, C), quorum(2, A, B), [], ["c"]),
        (quorum(1, A, B), quorum(2, A, B, D), ["d"], []),
        (quorum(1, A, B, C), quorum(2, A, C, D), ["d"], ["b"]),
        # a member's entry changed (a writer that broke the rule): removed and re-added
        (quorum(1, A, B), quorum(2, A, member("b", 2)), ["b"], ["b"]),
        (quorum(1, A), quorum(2), [], ["a"]),
        # the same quorum again (a new reason or catch-up source): nothing to send
        (quorum(1, A, B), quorum(1, A, B), [], []),
    ],
)
def test_delta_rebuilds_the_list(base, new, added, removed):
    event = delta_event(base, new)
    assert [m.replica_id for m in event.delta.added] == added
    assert list(event.delta.removed) == removed
    assert not event.quorum.members and event.quorum.member_count == len(new.members)
    assert quorum_delta.resolve(base, event) == new


def test_full_event_is_taken_as_it_is():
    event = pb.WatchEvent(quorum=quorum(5, A, B))
    assert quorum_delta.resolve(None, event) is event.quorum


@pytest.mark.parametrize("held", [None, quorum(7, A, B)])
def test_delta_for_another_quorum_is_stale(held):
    event = delta_event(quorum(1, A, B), quorum(2, A))
    with pytest.raises(quorum_delta.StaleDelta, match="delta from quorum 1"):
        quorum_delta.resolve(held, event)


def test_count_mismatch_is_stale():
    base = quorum(1, A, B)
    event = delta_event(base, quorum(2, A, B, D))
    event.quorum.member_count = 4
    with pytest.raises(quorum_delta.StaleDelta, match="expected 4"):
        quorum_delta.resolve(base, event)


def test_random_chains_of_changes():
    rng = random.Random(7)
    ids = [f"r{i:03d}" for i in range(200)]
    held = current = quorum(1, *(member(i) for i in rng.sample(ids, 50)))
    for qid in range(2, 60):
        keep = [m for m in current.members if rng.random() > 0.1]
        present = {m.replica_id for m in keep}
        new = [member(i, qid) for i in rng.sample(ids, 10) if i not in present]
        nxt = quorum(qid, *keep, *new)
        held = quorum_delta.resolve(held, delta_event(current, nxt))
        assert held == nxt
        current = nxt
