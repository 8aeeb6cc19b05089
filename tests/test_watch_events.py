"""What Watch streams are sent (fthsdp/coordinator/job/watch_events.py): pure, table-driven."""

from __future__ import annotations

import pytest

from fthsdp.coordinator.job.watch_events import DELTA, FULL, HEADER, SAME, WatchEvents
from fthsdp.core import quorum_delta
from fthsdp.protos.v1 import coordinator_pb2 as pb


def quorum(qid: int, *ids: str) -> pb.Quorum:
    members = [pb.QuorumMember(replica_id=i, address=f"h{i}:1", joined_quorum_id=1) for i in ids]
    return pb.Quorum(id=qid, members=members, member_count=len(members))


@pytest.fixture
def events() -> WatchEvents:
    e = WatchEvents()
    e.update(quorum(1, "a", "b"))
    e.update(quorum(2, "a", "b", "c"))
    return e


@pytest.mark.parametrize(
    "sees_members, sent_quorum, kind",
    [
        (False, 0, HEADER),  # a joiner: no names
        (False, 2, HEADER),
        (True, 0, FULL),  # a new stream: the whole list once
        (True, 1, DELTA),  # holds the quorum before: the difference
        (True, 2, SAME),  # holds the current one: nothing new
        (True, 7, FULL),  # holds something else (a gap): the whole list again
    ],
)
def test_what_a_stream_gets(events, sees_members, sent_quorum, kind):
    assert events.kind_for(sees_members, sent_quorum) == kind


def test_a_delta_rebuilds_the_full_list(events):
    held = quorum(1, "a", "b")
    delta_event = pb.WatchEvent.FromString(events.event(DELTA, b""))
    assert quorum_delta.resolve(held, delta_event) == events.quorum


def test_own_fields_are_appended_and_shared():
    e = WatchEvents()
    e.update(quorum(3, "a"))
    own = pb.WatchEvent(leader="L", heartbeat_interval_s=2.0).SerializeToString()
    first, second = e.event(FULL, own), e.event(FULL, own)
    assert first is second  # one copy for every watcher with the same own fields
    parsed = pb.WatchEvent.FromString(first)
    assert (parsed.quorum.id, parsed.leader, parsed.heartbeat_interval_s) == (3, "L", 2.0)
    assert not pb.WatchEvent.FromString(e.event(HEADER, own)).quorum.members
    e.update(quorum(4, "a", "b"))
    assert pb.WatchEvent.FromString(e.event(FULL, own)).quorum.id == 4  # a new quorum: nothing stale
