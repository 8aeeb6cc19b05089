"""Leader election among coordinators that share one store.

The leader holds ``PREFIX/leader`` (its advertised address) under a lease
that it refreshes every third of ``--leader-ttl``; the key vanishes by
itself when the leader dies or is cut off, and another coordinator's next
campaign takes it. Only the leader loads the jobs and decides; the others
serve Status (pointing to the leader) and answer every other call with
UNAVAILABLE, so that clients, which hold a list of coordinators, move on.

Beside it, under the same lease, the leader writes ``PREFIX/leader-holder``:
who it is (:class:`Holder`: boot id, pid namespace, pid and start time of its
process, the leader key's revision and the lease). A campaign that finds the
key held reads that record, and if it proves that the holder's process is
gone (same boot and pid namespace as this one, and that pid is free, a
zombie, or a newer process's), it revokes the dead holder's lease and takes
the key at once, instead of following a dead leader until its lease runs
out: a coordinator that its supervisor restarted after a SIGKILL leads
within a second. Anything short of proof (no record, another host, a live
pid, a /proc it cannot read) and it follows as before; see
:func:`predecessor_gone`.

Lifecycle::

    FOLLOWING --(campaign wins)--> LEADING --(lease lost)--> LOST (the process exits 1;
                                     |                        its supervisor restarts it
                                     +--(SIGTERM)--> resigns    as a follower)
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from fthsdp.coordinator.store import Store, Versioned
from fthsdp.core.errors import StoreError

log = logging.getLogger("fthsdp.coordinator")


class HolderRecordError(ValueError):
    """A ``leader-holder`` value that is not a record this version can read."""


@dataclass(frozen=True)
class Host:
    """Where pids mean the same thing: one boot of one kernel, one pid namespace."""

    boot_id: str
    """/proc/sys/kernel/random/boot_id: differs between hosts and across a reboot."""
    pid_ns: str
    """DEV:INODE of /proc/self/ns/pid: containers on one host may each have their own."""


@dataclass(frozen=True)
class Holder:
    """Who holds the leader key, as the holder itself recorded it."""

    address: str
    revision: int
    """The leader key's revision when this holder wrote it: binds the record to that holding."""
    lease: int
    host: Host
    pid: int
    start: int
    """The process's start time (clock ticks since boot): tells a reused pid apart."""

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Holder:
        try:
            d = json.loads(raw)
            holder = cls(str(d["address"]), int(d["revision"]), int(d["lease"]),
                         Host(str(d["host"]["boot_id"]), str(d["host"]["pid_ns"])), int(d["pid"]), int(d["start"]))
        except (ValueError, TypeError, KeyError) as e:
            raise HolderRecordError(f"unreadable leader-holder record {raw[:200]!r}: {e}") from e
        return holder


@dataclass(frozen=True)
class Seen:
    """What this host shows at a pid."""

    exists: bool
    zombie: bool = False
    start: int | None = None
    """Its start time; None if /proc would not say."""


@dataclass(frozen=True)
class Verdict:
    gone: bool
    why: str


def predecessor_gone(holder: Holder | None, leader: Versioned, here: Host | None,
                     probe: Callable[[int], Seen]) -> Verdict:
    """Whether the holder of ``leader`` (the key as just read) is provably dead.

    Only a proof counts: a wrong "gone" would make two coordinators lead at
    once, a wrong "alive" only costs the wait for the lease to run out.
    """
    if holder is None:
        return Verdict(False, "it left no holder record")
    if holder.revision != leader.revision or holder.address.encode() != leader.value:
        return Verdict(False, "its holder record belongs to another holding of the key")
    if here is None:
        return Verdict(False, "this host's boot id or pid namespace is unreadable")
    if holder.host.boot_id != here.boot_id:
        return Verdict(False, "it ran on another host (or before a reboot)")
    if holder.host.pid_ns != here.pid_ns:
        return Verdict(False, "it ran in another pid namespace")
    seen = probe(holder.pid)
    if not seen.exists:
        return Verdict(True, "no such process")
    if seen.zombie:
        return Verdict(True, "it exited")
    if seen.start is None:
        return Verdict(False, f"the start time of pid {holder.pid} is unreadable")
    if seen.start != holder.start:
        return Verdict(True, "its pid now belongs to a newer process")
    return Verdict(False, "its process is alive")


def this_host() -> Host | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
        ns = os.stat("/proc/self/ns/pid")
    except OSError:
        return None
    return Host(boot_id, f"{ns.st_dev}:{ns.st_ino}") if boot_id else None


def probe_pid(pid: int) -> Seen:
    """What this host shows at ``pid`` (in this process's pid namespace)."""
    try:
        # Not /proc alone: with hidepid a live process of another user has no
        # /proc entry, while kill(0) still tells "no such process" apart.
        os.kill(pid, 0)
    except ProcessLookupError:
        return Seen(False)
    except PermissionError:
        pass  # it exists, owned by someone else
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        # The command name (field 2) may hold spaces and parentheses: count from the last ')'.
        fields = stat[stat.rindex(b")") + 2:].split()
        return Seen(True, zombie=fields[0] in (b"Z", b"X"), start=int(fields[19]))
    except FileNotFoundError:
        return Seen(False)  # it ended between the two looks
    except (OSError, ValueError, IndexError):
        return Seen(True)


class Leadership:
    def __init__(self, store: Store, key: str, me: str, ttl: float, *, sole: bool = False,
                 here: Callable[[], Host | None] = this_host, probe: Callable[[int], Seen] = probe_pid) -> None:
        """``sole``: no other coordinator can use ``store`` (``--store memory``,
        which lives in this process): a lease that lapsed while this process
        stalled past the time to live passed to nobody, and is taken again
        rather than lost (losing it would end the only coordinator)."""
        self.store, self.key, self.me, self.ttl = store, key, me, ttl
        self.sole = sole
        self.holder_key = key + "-holder"
        self.leader = ""
        """The leader's address as last seen ('' unknown); ``me`` once leading."""
        self.leading = False
        self._lease = 0
        self._here, self._probe = here, probe

    async def try_once(self) -> bool:
        """One campaign: take the key if nobody holds it, or if its holder is
        provably dead. True if this coordinator now leads."""
        try:
            lease = await asyncio.to_thread(self.store.grant_lease, self.ttl)
            result = await asyncio.to_thread(self.store.compare_and_set, self.key, self.me.encode(), 0, lease)
            if not result.succeeded and result.current and await asyncio.to_thread(self._end_dead, result.current):
                result = await asyncio.to_thread(self.store.compare_and_set, self.key, self.me.encode(), 0, lease)
        except StoreError as e:
            log.warning("leader election: the store did not answer (%s); trying again", e)
            return False
        if result.succeeded and result.current:
            self._lease, self.leading, self.leader = lease, True, self.me
            log.info("leader election: this coordinator (%s) leads", self.me)
            await asyncio.to_thread(self._record_holder, result.current.revision)
            return True
        await asyncio.to_thread(self._revoke, lease)
        leader = result.current.value.decode(errors="replace") if result.current else ""
        if leader != self.leader:
            log.info("leader election: %s leads; this coordinator follows", leader or "nobody")
        self.leader = leader
        return False

    def _end_dead(self, leader: Versioned) -> bool:
        """Revoke the lease of the key's holder if it is provably dead; True if it was."""
        raw = self.store.get(self.holder_key)
        try:
            holder = Holder.decode(raw.value) if raw else None
        except HolderRecordError as e:
            # Debug only: a follower campaigns every third of the TTL.
            log.debug("leader election: not taking over: %s", e)
            return False
        verdict = predecessor_gone(holder, leader, self._here(), self._probe)
        if not verdict.gone or holder is None:
            log.debug("leader election: not taking over from %s: %s", leader.value.decode(errors="replace"),
                      verdict.why)
            return False
        log.warning("leader election: the previous leader (%s), pid %d on this host, is gone (%s): "
                    "taking over its lease at once", holder.address, holder.pid, verdict.why)
        # Its lease holds the key and the record; ending it is what expiry would do, sooner.
        self.store.revoke_lease(holder.lease)
        return True

    def _record_holder(self, revision: int) -> None:
        here = self._here()
        seen = self._probe(os.getpid())
        if here is None or seen.start is None:
            return  # no proof to offer: a successor waits out the lease
        record = Holder(self.me, revision, self._lease, here, os.getpid(), seen.start).encode()
        try:
            # The key lives and dies with the lease, so no other holder's
            # record should be there; overwrite one that is, once.
            result = self.store.compare_and_set(self.holder_key, record, 0, self._lease)
            if not result.succeeded and result.current:
                self.store.compare_and_set(self.holder_key, record, result.current.revision, self._lease)
        except StoreError as e:
            log.warning("leader election: could not record this coordinator as the holder (%s); "
                        "a restarted successor will wait for the lease", e)

    async def campaign(self) -> None:
        """Return once this coordinator leads (retrying every third of the TTL)."""
        while not await self.try_once():
            await asyncio.sleep(self.ttl / 3)

    async def hold(self) -> None:
        """Keep the lease alive; return when it is lost (the key is gone, or
        the store stayed unreachable for a whole TTL)."""
        last_ok = time.monotonic()
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                alive = await asyncio.to_thread(self.store.refresh_lease, self._lease)
            except StoreError as e:
                if time.monotonic() - last_ok < self.ttl:
                    log.warning("leader election: could not refresh the lease (%s)", e)
                    continue
                alive = False
            if not alive and self.sole:
                stalled = time.monotonic() - last_ok
                self.leading = False
                if await self.try_once():
                    log.warning("leader election: the lease lapsed (this coordinator went %.1fs without renewing "
                                "it, against a %gs time to live); no other coordinator can share its memory store, "
                                "so it leads on", stalled, self.ttl)
                    last_ok = time.monotonic()
                    continue
            if not alive:
                self.leading = False
                log.error("leader election: this coordinator lost its lease; another one may lead now")
                return
            last_ok = time.monotonic()

    def resign(self) -> None:
        """Give the key up now (a clean stop): another coordinator takes over at its next campaign."""
        if self.leading:
            self.leading = False
            self._revoke(self._lease)

    def _revoke(self, lease: int) -> None:
        try:
            self.store.revoke_lease(lease)
        except StoreError as e:
            log.warning("leader election: could not revoke lease %d: %s", lease, e)
