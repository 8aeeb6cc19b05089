"""A coordinator takes the leader key at once from a holder that is provably
dead (issue 38), and follows as before when it cannot prove it.

In process: the decision (``predecessor_gone``) table-tested, the probes on
real pids, and ``Leadership`` on the memory store. The real-process case, a
supervised coordinator SIGKILLed and restarted, is in
tests/test_coordinator_takeover.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

from fthsdp.coordinator.leadership import (
    Holder,
    HolderRecordError,
    Host,
    Leadership,
    Seen,
    predecessor_gone,
    probe_pid,
    this_host,
)
from fthsdp.coordinator.store import MemoryStore, Versioned
from tests.harness.waiting import wait_until

HERE = Host("boot-1", "4:4026531836")
KEY = "/fthsdp/v1/leader"
ADDRESS = "127.0.0.1:34475"
HOLDER = Holder(ADDRESS, revision=7, lease=3, host=HERE, pid=4242, start=1000)
LEADER = Versioned(ADDRESS.encode(), 7)


def seen(exists: bool, zombie: bool = False, start: int | None = None):
    return lambda pid: Seen(exists, zombie, start)


CASES = [
    # (case, holder, the key as read, this host, what pid 4242 is now, gone?)
    ("no such process", HOLDER, LEADER, HERE, seen(False), True),
    ("a zombie", HOLDER, LEADER, HERE, seen(True, zombie=True, start=1000), True),
    ("pid reused", HOLDER, LEADER, HERE, seen(True, start=2000), True),
    ("alive", HOLDER, LEADER, HERE, seen(True, start=1000), False),
    ("start time unreadable", HOLDER, LEADER, HERE, seen(True), False),
    ("no record", None, LEADER, HERE, seen(False), False),
    ("another host", HOLDER, LEADER, Host("boot-2", HERE.pid_ns), seen(False), False),
    ("another pid namespace", HOLDER, LEADER, Host(HERE.boot_id, "4:1"), seen(False), False),
    ("this host unknown", HOLDER, LEADER, None, seen(False), False),
    ("a record of an older holding", HOLDER, Versioned(ADDRESS.encode(), 9), HERE, seen(False), False),
    ("a record of another address", HOLDER, Versioned(b"10.0.0.2:29510", 7), HERE, seen(False), False),
]


@pytest.mark.parametrize(("holder", "leader", "here", "probe", "gone"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_predecessor_is_gone_only_when_this_host_proves_it(holder, leader, here, probe, gone):
    verdict = predecessor_gone(holder, leader, here, probe)
    assert verdict.gone is gone, verdict
    assert verdict.why


def test_the_holder_record_round_trips_and_garbage_is_a_typed_error():
    assert Holder.decode(HOLDER.encode()) == HOLDER
    for raw in (b"", b"127.0.0.1:1", b"{}", b'{"address": "a", "revision": "x"}', b"\xff"):
        with pytest.raises(HolderRecordError):
            Holder.decode(raw)


def test_the_probes_tell_a_live_process_a_zombie_and_a_free_pid_apart():
    me = probe_pid(os.getpid())
    assert me.exists and not me.zombie and me.start is not None and me.start > 0
    assert probe_pid(os.getpid()) == me  # the start time is stable
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        wait_until(lambda: probe_pid(child.pid).zombie, 10, message="the child exited, not yet reaped")
        exited = probe_pid(child.pid)
        assert exited.exists and exited.start is not None
    finally:
        child.wait()
    after = probe_pid(child.pid)
    assert not after.exists or after.start != exited.start  # reaped (or the pid taken by a newer process)
    here = this_host()
    assert here is not None and here.boot_id and here.pid_ns


def run(coro):
    return asyncio.run(coro)


def held_by(store: MemoryStore, pid: int, start: int, address: str = ADDRESS, host: Host | None = None) -> int:
    """The leader key held under a long lease by ``pid``, as its holder records itself; the lease."""
    lease = store.grant_lease(60)
    current = store.compare_and_set(KEY, address.encode(), 0, lease).current
    assert current is not None
    record = Holder(address, current.revision, lease, host or this_host() or HERE, pid, start)
    assert store.compare_and_set(KEY + "-holder", record.encode(), 0, lease).succeeded
    return lease


def test_a_leader_records_itself_as_the_holder():
    store = MemoryStore()
    leader = Leadership(store, KEY, "a:1", ttl=60)
    assert run(leader.try_once())
    item = store.get(KEY + "-holder")
    assert item is not None
    holder = Holder.decode(item.value)
    assert (holder.address, holder.pid, holder.host) == ("a:1", os.getpid(), this_host())
    assert holder.start == probe_pid(os.getpid()).start and holder.revision == store.get(KEY).revision
    leader.resign()  # the record goes with the lease
    assert store.get(KEY) is None and store.get(KEY + "-holder") is None


def test_a_live_holder_on_this_host_is_followed():
    # The record names this test's own process, alive, with its real start
    # time: the campaign must not take the key, however long the lease.
    store = MemoryStore()
    held_by(store, os.getpid(), probe_pid(os.getpid()).start or 0)
    follower = Leadership(store, KEY, "b:1", ttl=60)
    assert not run(follower.try_once())
    assert not follower.leading and follower.leader == ADDRESS
    assert store.get(KEY).value == ADDRESS.encode()


def test_a_dead_holder_on_this_host_is_replaced_at_once(caplog):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    start = probe_pid(child.pid).start or 0
    child.wait()  # gone, and reaped as its supervisor would
    store = MemoryStore()
    held_by(store, child.pid, start)
    successor = Leadership(store, KEY, "b:1", ttl=60)
    caplog.set_level("INFO", logger="fthsdp.coordinator")
    assert run(successor.try_once())  # the dead holder's 60 s lease is not waited out
    assert successor.leading and store.get(KEY).value == b"b:1"
    assert Holder.decode(store.get(KEY + "-holder").value).address == "b:1"
    assert f"the previous leader ({ADDRESS}), pid {child.pid} on this host, is gone" in caplog.text
    assert "follows" not in caplog.text


def test_a_holder_on_another_host_is_followed_even_if_its_pid_is_free_here():
    store = MemoryStore()
    held_by(store, 4242, 1000, host=Host("another-boot", "4:1"))
    follower = Leadership(store, KEY, "b:1", ttl=60, probe=seen(False))
    assert not run(follower.try_once())
    assert follower.leader == ADDRESS


def test_a_holder_without_a_record_is_followed():
    # A leader of an older version, or one that died between taking the key
    # and recording itself: nothing proves it gone.
    store = MemoryStore()
    store.compare_and_set(KEY, ADDRESS.encode(), 0, store.grant_lease(60))
    follower = Leadership(store, KEY, "b:1", ttl=60, probe=seen(False))
    assert not run(follower.try_once())
    assert follower.leader == ADDRESS


def test_an_unreadable_record_is_followed():
    store = MemoryStore()
    lease = store.grant_lease(60)
    store.compare_and_set(KEY, ADDRESS.encode(), 0, lease)
    store.compare_and_set(KEY + "-holder", b"not json", 0, lease)
    follower = Leadership(store, KEY, "b:1", ttl=60, probe=seen(False))
    assert not run(follower.try_once())
    assert follower.leader == ADDRESS


class Clock:
    """The store's clock, moved by the test: a stall of this process past the lease's time to live."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def hold_through_a_stall(sole: bool) -> tuple[Leadership, MemoryStore, int, bool]:
    """Lead, then let the store's clock jump past the lease; returns the
    leadership, the store, the first lease, and whether ``hold`` returned (the lease was lost)."""
    clock = Clock()
    store = MemoryStore(clock=clock)
    leader = Leadership(store, KEY, "a:1", ttl=0.3, sole=sole)
    assert await leader.try_once()
    first = leader._lease
    holding = asyncio.create_task(leader.hold())
    clock.now += 10.0  # the process stalled: nothing renewed the lease meanwhile
    deadline = time.monotonic() + 10.0
    while not holding.done() and leader._lease == first and time.monotonic() < deadline:
        await asyncio.sleep(0.02)  # polling a condition with a deadline: hold() runs on this loop
    lost = holding.done()
    holding.cancel()
    return leader, store, first, lost


def test_a_coordinator_on_its_own_memory_store_leads_on_after_a_stall_past_its_lease():
    leader, store, first, lost = asyncio.run(hold_through_a_stall(sole=True))
    assert not lost and leader.leading and leader._lease != first, "a new lease, taken at once"
    assert store.get(KEY).value == b"a:1"


def test_a_coordinator_on_a_shared_store_that_stalls_past_its_lease_loses_it():
    leader, store, _, lost = asyncio.run(hold_through_a_stall(sole=False))
    assert lost and not leader.leading, "another coordinator may lead now: this one must restart as a follower"
    assert store.get(KEY) is None
