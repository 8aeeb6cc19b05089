"""A coordinator takes the leader key at once from a holder that is provably
dead (issues 38 and 48), and follows as before when it cannot prove it.

In process: the decision (``pid_state``, ``predecessor_gone``) table-tested,
the probes on real pids and real sockets (and on a ``kill`` that says EPERM,
as under ``hidepid=2``), and ``Leadership`` on the memory store. The
real-process case, a supervised coordinator SIGKILLed and restarted on its
port, is in tests/test_coordinator_takeover.py.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from fthsdp.coordinator.store import MemoryStore, Versioned, leader_proof
from fthsdp.coordinator.store.leader_proof import (
    Holder,
    HolderRecordError,
    Host,
    Kill,
    Listener,
    PidState,
    Reach,
    Seen,
    listens,
    pid_state,
    predecessor_gone,
    probe_address,
    probe_pid,
    this_host,
)
from fthsdp.coordinator.store.leadership import Leadership
from tests.harness.waiting import wait_until

HERE = Host("boot-1", "4:4026531836")
KEY = "/fthsdp/v1/leader"
ADDRESS = "127.0.0.1:34475"
ME = "10.0.0.9:29510"
HOLDER = Holder(ADDRESS, revision=7, lease=3, host=HERE, pid=4242, start=1000)
LEADER = Versioned(ADDRESS.encode(), 7)

FREE = Seen(Kill.NO_SUCH_PROCESS)
ALIVE = Seen(Kill.SIGNALLED, start=1000)

PID_CASES = [
    # (case, what pid 4242 shows, its state for the holder that started at 1000)
    ("kill says ESRCH", FREE, PidState.GONE),
    ("ESRCH, whatever /proc said", Seen(Kill.NO_SUCH_PROCESS, start=1000), PidState.GONE),
    ("a zombie", Seen(Kill.SIGNALLED, zombie=True, start=1000), PidState.GONE),
    ("another user's zombie", Seen(Kill.NOT_PERMITTED, zombie=True, start=1000), PidState.GONE),
    ("pid reused", Seen(Kill.SIGNALLED, start=2000), PidState.GONE),
    ("pid reused by another user", Seen(Kill.NOT_PERMITTED, start=2000), PidState.GONE),
    ("alive", ALIVE, PidState.ALIVE),
    ("another user's, /proc readable", Seen(Kill.NOT_PERMITTED, start=1000), PidState.ALIVE),
    ("another user's, /proc hidden (hidepid=2): EPERM", Seen(Kill.NOT_PERMITTED), PidState.ALIVE),
    ("kill ok, /proc unreadable (or it ended between the looks)", Seen(Kill.SIGNALLED), PidState.UNKNOWN),
    ("kill failed, /proc unreadable", Seen(Kill.FAILED), PidState.UNKNOWN),
    ("kill failed, /proc shows it alive", Seen(Kill.FAILED, start=1000), PidState.ALIVE),
]


@pytest.mark.parametrize(("seen", "state"), [c[1:] for c in PID_CASES], ids=[c[0] for c in PID_CASES])
def test_only_esrch_or_a_stat_read_proves_a_pid_gone(seen, state):
    got, why = pid_state(seen, 4242, 1000)
    assert got is state, why
    assert why


CASES = [
    # (case, holder, the key as read, this host, what pid 4242 is now, what its address got, gone?)
    ("no such process, address refuses", HOLDER, LEADER, HERE, FREE, Reach.REFUSED, True),
    ("a zombie, address refuses", HOLDER, LEADER, HERE, Seen(Kill.SIGNALLED, True, 1000), Reach.REFUSED, True),
    ("pid reused, address refuses", HOLDER, LEADER, HERE, Seen(Kill.SIGNALLED, start=2000), Reach.REFUSED, True),
    ("EPERM, /proc hidden, address refuses", HOLDER, LEADER, HERE, Seen(Kill.NOT_PERMITTED), Reach.REFUSED,
     False),
    ("/proc unreadable, address refuses", HOLDER, LEADER, HERE, Seen(Kill.SIGNALLED), Reach.REFUSED, False),
    ("alive, address refuses", HOLDER, LEADER, HERE, ALIVE, Reach.REFUSED, False),
    ("no such process, address answers (a cloned host)", HOLDER, LEADER, HERE, FREE, Reach.ANSWERED, False),
    ("no such process, address silent", HOLDER, LEADER, HERE, FREE, Reach.SILENT, False),
    ("no such process, address not tried", HOLDER, LEADER, HERE, FREE, Reach.NOT_TRIED, False),
    ("no such process, address ours but advertised otherwise", HOLDER, LEADER, HERE, FREE, Reach.OWN, False),
    ("no such process, pid not looked at", HOLDER, LEADER, HERE, None, Reach.REFUSED, False),
    ("no record", None, LEADER, HERE, FREE, Reach.REFUSED, False),
    ("another host", HOLDER, LEADER, Host("boot-2", HERE.pid_ns), FREE, Reach.REFUSED, False),
    ("another pid namespace", HOLDER, LEADER, Host(HERE.boot_id, "4:1"), FREE, Reach.REFUSED, False),
    ("this host unknown", HOLDER, LEADER, None, FREE, Reach.REFUSED, False),
    ("a record of an older holding", HOLDER, Versioned(ADDRESS.encode(), 9), HERE, FREE, Reach.REFUSED, False),
    ("a record of another address", HOLDER, Versioned(b"10.0.0.2:29510", 7), HERE, FREE, Reach.REFUSED, False),
]


@pytest.mark.parametrize(("holder", "leader", "here", "seen", "reach", "gone"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_predecessor_is_gone_only_when_its_pid_and_its_address_prove_it(holder, leader, here, seen, reach, gone):
    verdict = predecessor_gone(holder, leader, here, ME, seen, reach)
    assert verdict.gone is gone, verdict
    assert verdict.why


def test_its_own_address_answering_here_proves_a_restarted_coordinator_its_successor():
    # Restarted by its supervisor on the same port, this coordinator listens
    # where its dead predecessor did: the connect reaches this process's socket.
    verdict = predecessor_gone(HOLDER, LEADER, HERE, ADDRESS, FREE, Reach.OWN)
    assert verdict.gone and "this coordinator's own address" in verdict.why
    assert not predecessor_gone(HOLDER, LEADER, HERE, ADDRESS, FREE, Reach.ANSWERED).gone
    assert not predecessor_gone(HOLDER, LEADER, HERE, ADDRESS, ALIVE, Reach.OWN).gone


LISTENER_CASES = [
    # (case, listener, the connection's peer, accepted by it?)
    ("v4 wildcard", Listener("0.0.0.0", 80, True, False), ("127.0.0.1", 80), True),
    ("v4 exact", Listener("127.0.0.1", 80, True, False), ("127.0.0.1", 80), True),
    ("another port", Listener("0.0.0.0", 80, True, False), ("127.0.0.1", 81), False),
    ("another address", Listener("127.0.0.2", 80, True, False), ("127.0.0.1", 80), False),
    ("gRPC's v4-mapped bind", Listener("::ffff:127.0.0.1", 80, True, True), ("127.0.0.1", 80), True),
    ("dual-stack wildcard, v4 peer", Listener("::", 80, True, True), ("10.0.0.1", 80), True),
    ("v6-only wildcard, v4 peer", Listener("::", 80, False, True), ("10.0.0.1", 80), False),
    ("v4 listener, v6 peer", Listener("0.0.0.0", 80, True, False), ("::1", 80), False),
    ("v6 exact", Listener("::1", 80, False, True), ("::1", 80), True),
]


@pytest.mark.parametrize(("listener", "peer", "accepted"), [c[1:] for c in LISTENER_CASES],
                         ids=[c[0] for c in LISTENER_CASES])
def test_a_connection_is_ours_only_if_one_of_our_listeners_can_have_accepted_it(listener, peer, accepted):
    assert listens(listener, *peer) is accepted


def test_the_holder_record_round_trips_and_garbage_is_a_typed_error():
    assert Holder.decode(HOLDER.encode()) == HOLDER
    # A record as the previous version wrote it, and one with a field added by a newer one.
    older = (b'{"address": "127.0.0.1:34475", "host": {"boot_id": "boot-1", "pid_ns": "4:4026531836"}, '
             b'"lease": 3, "pid": 4242, "revision": 7, "start": 1000}')
    assert Holder.decode(older) == HOLDER
    assert Holder.decode(older[:-1] + b', "newer": 1}') == HOLDER
    for raw in (b"", b"127.0.0.1:1", b"{}", b'{"address": "a", "revision": "x"}', b"\xff"):
        with pytest.raises(HolderRecordError):
            Holder.decode(raw)


def test_the_probes_tell_a_live_process_a_zombie_and_a_free_pid_apart():
    me = probe_pid(os.getpid())
    assert me.kill is Kill.SIGNALLED and not me.zombie and me.start is not None and me.start > 0
    assert probe_pid(os.getpid()) == me  # the start time is stable
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        wait_until(lambda: probe_pid(child.pid).zombie, 10, message="the child exited, not yet reaped")
        exited = probe_pid(child.pid)
        assert exited.start is not None and pid_state(exited, child.pid, exited.start)[0] is PidState.GONE
    finally:
        child.wait()
    after = probe_pid(child.pid)
    assert after.kill is Kill.NO_SUCH_PROCESS or after.start != exited.start  # reaped (or the pid reused)
    assert pid_state(after, child.pid, exited.start)[0] is PidState.GONE
    here = this_host()
    assert here is not None and here.boot_id and here.pid_ns


def hide_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as a coordinator of another user under /proc hidepid=2 sees the others':
    kill(pid, 0) says EPERM and /proc/PID has no entry."""
    real_open = open

    def kill(pid: int, sig: int) -> None:
        if pid != os.getpid():
            raise PermissionError(1, "Operation not permitted")

    def hidden_open(path, *args, **kwargs):
        entry = re.match(r"/proc/(\d+)/", str(path))
        if entry and int(entry[1]) != os.getpid():
            raise FileNotFoundError(2, "No such file or directory", path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(leader_proof.os, "kill", kill)
    monkeypatch.setattr(leader_proof, "open", hidden_open, raising=False)


def test_under_hidepid_another_users_live_process_is_alive_not_gone(monkeypatch):
    hide_proc(monkeypatch)
    seen = probe_pid(4242)
    assert seen == Seen(Kill.NOT_PERMITTED)
    assert pid_state(seen, 4242, 1000)[0] is PidState.ALIVE
    assert not predecessor_gone(HOLDER, LEADER, HERE, ME, seen, Reach.REFUSED).gone


def test_a_kill_that_says_eperm_still_reads_the_start_time_where_proc_shows_it(monkeypatch):
    start = probe_pid(os.getpid()).start
    assert start is not None

    def kill(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(leader_proof.os, "kill", kill)
    seen = probe_pid(os.getpid())
    assert seen == Seen(Kill.NOT_PERMITTED, start=start)
    assert pid_state(seen, os.getpid(), start)[0] is PidState.ALIVE
    assert pid_state(seen, os.getpid(), start - 1)[0] is PidState.GONE  # read, and another process's


LISTEN = ("import socket, sys\n"
          "s = socket.create_server(('127.0.0.1', 0))\n"
          "print(s.getsockname()[1], flush=True)\n"
          "sys.stdin.read()")


@pytest.fixture
def live_leader() -> Iterator[str]:
    """A live "leader" on this host: another process listening on a TCP port; its address."""
    child = subprocess.Popen([sys.executable, "-c", LISTEN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        yield f"127.0.0.1:{child.stdout.readline().strip()}"
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(10)


@pytest.fixture
def closed_port() -> Iterator[str]:
    """An address where nothing listens: bound, never listening, so that no other process takes the port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def own_port() -> Iterator[str]:
    """An address this process listens on, as a coordinator's gRPC server does before it campaigns."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        yield f"127.0.0.1:{s.getsockname()[1]}"


def test_the_address_probe_tells_refused_answered_ours_and_silent_apart(live_leader, closed_port, own_port):
    assert probe_address(closed_port) is Reach.REFUSED
    assert probe_address(live_leader) is Reach.ANSWERED
    assert probe_address(own_port) is Reach.OWN
    # localhost may also resolve to ::1, which refuses: one live answer is enough to call it answered.
    assert probe_address("localhost:" + live_leader.rsplit(":", 1)[1]) is Reach.ANSWERED
    assert probe_address("not an address") is Reach.SILENT
    assert probe_address("127.0.0.1:70000") is Reach.SILENT

    # No answer in time: a listener whose accept queue is full drops the SYN, as an overloaded leader would.
    with socket.create_server(("127.0.0.1", 0), backlog=0) as busy, \
            socket.create_connection(busy.getsockname(), timeout=5):
        assert probe_address(f"127.0.0.1:{busy.getsockname()[1]}", timeout=0.2) is Reach.SILENT


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


def dead_pid() -> tuple[int, int]:
    """A child process that ran and was reaped, as its supervisor would: its pid and start time."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    start = probe_pid(child.pid).start or 0
    child.wait()
    return child.pid, start


def free(pid: int) -> Seen:
    return FREE


def refused(address: str) -> Reach:
    return Reach.REFUSED


def not_tried(address: str) -> Reach:
    raise AssertionError(f"connected to {address}, which could prove nothing here")


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
    follower = Leadership(store, KEY, "b:1", ttl=60, reach=not_tried)
    assert not run(follower.try_once())
    assert not follower.leading and follower.leader == ADDRESS
    assert store.get(KEY).value == ADDRESS.encode()


def test_a_dead_holder_on_this_host_is_replaced_at_once(caplog, closed_port):
    pid, start = dead_pid()
    store = MemoryStore()
    held_by(store, pid, start, address=closed_port)
    successor = Leadership(store, KEY, "b:1", ttl=60)
    caplog.set_level("INFO", logger="fthsdp.coordinator")
    assert run(successor.try_once())  # the dead holder's 60 s lease is not waited out
    assert successor.leading and store.get(KEY).value == b"b:1"
    assert Holder.decode(store.get(KEY + "-holder").value).address == "b:1"
    assert (f"the previous leader ({closed_port}), pid {pid} on this host, is gone "
            f"(no such process; {closed_port} refuses connections)") in caplog.text
    assert "follows" not in caplog.text


def test_a_coordinator_restarted_on_its_port_takes_over_from_its_dead_self(caplog, own_port):
    # As under a supervisor: the new process listens on the old one's port
    # (its gRPC server binds before it campaigns), so the connect reaches itself.
    pid, start = dead_pid()
    store = MemoryStore()
    held_by(store, pid, start, address=own_port)
    successor = Leadership(store, KEY, own_port, ttl=60)
    caplog.set_level("INFO", logger="fthsdp.coordinator")
    assert run(successor.try_once())
    assert f"{own_port} is this coordinator's own address" in caplog.text


def test_a_live_leader_is_never_taken_over_even_when_its_pid_looks_free_here(live_leader, own_port):
    # As on a host cloned from this one's memory image: same boot id and pid
    # namespace, the leader's pid free here, but the leader answers at its address.
    for address in (live_leader, own_port):  # another process listening, or this one under another name
        store = MemoryStore()
        held_by(store, 4242, 1000, address=address)
        follower = Leadership(store, KEY, "b:1", ttl=60, probe=free)
        assert not run(follower.try_once()), address
        assert follower.leader == address and store.get(KEY).value == address.encode()


def test_under_hidepid_a_live_leader_of_another_user_is_followed(monkeypatch):
    # The bug of issue 48: kill(pid, 0) said EPERM and /proc/PID was missing,
    # which read as "no such process"; two coordinators took the key in turn.
    store = MemoryStore()
    held_by(store, 4242, 1000)
    hide_proc(monkeypatch)
    follower = Leadership(store, KEY, "b:1", ttl=60, reach=not_tried)
    assert not run(follower.try_once())
    assert follower.leader == ADDRESS and store.get(KEY).value == ADDRESS.encode()


def test_a_holder_on_another_host_is_followed_even_if_its_pid_is_free_here():
    store = MemoryStore()
    held_by(store, 4242, 1000, host=Host("another-boot", "4:1"))
    follower = Leadership(store, KEY, "b:1", ttl=60, probe=free, reach=refused)
    assert not run(follower.try_once())
    assert follower.leader == ADDRESS


def test_a_holder_without_a_record_is_followed():
    # A leader of an older version, or one that died between taking the key
    # and recording itself: nothing proves it gone.
    store = MemoryStore()
    store.compare_and_set(KEY, ADDRESS.encode(), 0, store.grant_lease(60))
    follower = Leadership(store, KEY, "b:1", ttl=60, probe=free, reach=refused)
    assert not run(follower.try_once())
    assert follower.leader == ADDRESS


def test_an_unreadable_record_is_followed():
    store = MemoryStore()
    lease = store.grant_lease(60)
    store.compare_and_set(KEY, ADDRESS.encode(), 0, lease)
    store.compare_and_set(KEY + "-holder", b"not json", 0, lease)
    follower = Leadership(store, KEY, "b:1", ttl=60, probe=free, reach=refused)
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
