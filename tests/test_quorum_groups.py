"""Which group FTAR's next collective runs in, and when a wait on one is left
(fthsdp/agent/training/ftar/groups.py), in-process on the fake transport.

This replica is rank 0 of every quorum here, so that it builds each group
alone (the fake transport's rank 0 names the group; tests/harness/fake_collectives.py);
its peers exist only as the member counts of the quorums pushed, and a
collective they never post stays pending, as a dead or hung peer's does.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.distributed as dist

from fthsdp.agent.training.ftar.groups import DONE, NEWER, QuorumGroups
from fthsdp.agent.training.quorum_view import QuorumView
from fthsdp.core.errors import Evicted, FtarTimeout
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.fake_collectives import FakeNetwork, FakeTransport
from tests.harness.waiting import wait_until

TIMEOUT = 1.0
"""The groups' timeout: the patience for a growth quorum is half of it (0.5 s)."""


class Groups:
    def __init__(self, timeout: float = TIMEOUT) -> None:
        self.net = FakeNetwork()
        self.view = QuorumView("r0")
        self.groups = QuorumGroups(self.view, "job", timeout=timeout, transport=FakeTransport(self.net))
        store = dist.HashStore()
        self.groups.connect_store = lambda address, timeout: store

    def push(self, quorum_id: int, members: int, last_drop_id: int | None = None, mine: bool = True,
             divergence: str = "") -> None:
        event = pb.WatchEvent(quorum=pb.Quorum(id=quorum_id, member_count=members, first_member_address="x:0",
                                               last_drop_id=quorum_id if last_drop_id is None else last_drop_id))
        if mine:
            event.place.rank = 0
        if divergence:
            event.divergence.reason = divergence
        self.view.update(event)

    def current(self):
        return self.groups.current_group(time.monotonic() + TIMEOUT)

    def pending(self, group):
        """An all-reduce in ``group`` that its other members never join."""
        opts = dist.AllreduceOptions()
        return group.pg.allreduce([torch.zeros(1)], opts)


def test_the_same_quorum_keeps_its_group():
    g = Groups()
    g.push(2, 1)
    first = g.current()
    assert g.current() is first and first.quorum_id == 2
    assert len(g.net.sizes) == 1, "built once"


def test_a_quorum_that_drops_a_member_retires_the_group_and_builds_the_next():
    g = Groups()
    g.push(2, 2)
    old = g.current()
    g.push(3, 1)  # last_drop_id 3: a member dropped
    new = g.current()
    assert new.quorum_id == 3 and new is not old
    assert (0, 0) in g.net.left, "the old group was let go (its collectives are never waited on again)"
    assert not g.groups.in_step(new), "the first collective in a new group is an agree"


def test_a_growth_quorum_waits_for_the_agreed_switch():
    """Quorum 3 only adds a replica (last_drop_id 2): the members go on in
    quorum 2's group, build quorum 3's in the background, and propose it once
    built; they switch only when every member agreed, at a step boundary."""
    g = Groups()
    g.push(2, 1)
    old = g.current()
    g.groups.mark_in_step(old)  # an agree settled the members' step
    g.push(3, 2, last_drop_id=2)
    assert g.current() is old, "no switch before every member agreed"
    assert g.groups.next_group() is old, "the next step's buckets may start in the old group"
    wait_until(lambda: g.groups.growth_ready() == 3, timeout=10, message="quorum 3's group built in the background")
    g.groups.agree_switch(3)
    assert g.groups.next_group() is None, "a switch is agreed: the buckets wait for the new group"
    new = g.current()
    assert new.quorum_id == 3 and (0, 0) in g.net.left


def test_a_growth_quorum_is_not_proposed_by_a_member_out_of_step():
    g = Groups()
    g.push(2, 1)
    g.current()
    g.push(3, 2, last_drop_id=2)
    assert g.groups.growth_ready() == 0, "not in step with the group: no proposal (it agrees first)"


@pytest.mark.parametrize("mine, divergence, says", [
    (False, "", "does not include this replica"),
    (False, "r0 differs at step 40", "checksum mismatch: r0 differs at step 40"),
])
def test_a_quorum_without_this_replica_evicts_it(mine, divergence, says):
    g = Groups()
    g.push(2, 1)
    g.current()
    g.push(3, 1, mine=mine, divergence=divergence)
    with pytest.raises(Evicted, match=says):
        g.current()


def test_a_wait_is_left_at_once_for_a_quorum_that_drops_a_member():
    g = Groups(timeout=10.0)  # a growth quorum's patience would then be 2 s
    g.push(2, 2)
    group = g.current()
    work = g.pending(group)
    threading.Timer(0.05, lambda: g.push(3, 1)).start()
    began = time.monotonic()
    assert g.groups.wait_work(work, group, time.monotonic() + 10) == NEWER
    assert time.monotonic() - began < 2.0, "left without waiting out a growth quorum's patience"


def test_a_wait_is_left_for_a_growth_quorum_only_after_the_patience():
    """A member that never saw the old quorum (its push came too close to the
    next one's) would keep the others in the old group for good: past the
    patience they leave for the newest quorum anyway."""
    g = Groups()
    g.push(2, 2)
    group = g.current()
    work = g.pending(group)
    g.push(3, 3, last_drop_id=2)
    began = time.monotonic()
    assert g.groups.wait_work(work, group, time.monotonic() + 10) == NEWER
    assert time.monotonic() - began >= TIMEOUT / 2


def test_a_collective_that_completes_is_done():
    g = Groups()
    g.push(2, 1)
    group = g.current()
    assert g.groups.wait_work(g.pending(group), group, time.monotonic() + 1) == DONE


def test_a_wait_with_no_newer_quorum_times_out_saying_so():
    g = Groups()
    g.push(2, 2)
    group = g.current()
    with pytest.raises(FtarTimeout, match="no newer quorum came"):
        g.groups.wait_work(g.pending(group), group, time.monotonic() + 0.1)


def test_no_collective_gives_up_before_the_coordinators_hang_horizon():
    """Members waiting for a hung peer must never be the ones that leave: a
    wait lasts at least as long as the coordinator may take to blame it."""
    g = Groups()
    g.groups.horizon = lambda: TIMEOUT + 0.6  # counted from the operation's start, as the timeout is
    g.push(2, 2)
    group = g.current()
    began = time.monotonic()
    with pytest.raises(FtarTimeout):
        g.groups.wait_work(g.pending(group), group, began + 0.1)  # the operation started TIMEOUT - 0.1 s ago
    assert time.monotonic() - began >= 0.6
