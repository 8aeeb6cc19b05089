"""Leader election among coordinators that share one store.

The leader holds ``PREFIX/leader`` (its advertised address) under a lease
that it refreshes every third of ``--leader-ttl``; the key vanishes by
itself when the leader dies or is cut off, and another coordinator's next
campaign takes it. Only the leader loads the jobs and decides; the others
serve Status (pointing to the leader) and answer every other call with
UNAVAILABLE, so that clients, which hold a list of coordinators, move on.

Beside it, under the same lease, the leader writes ``PREFIX/leader-holder``:
who it is (:class:`Holder`: its address, boot id, pid namespace, pid and start
time of its process, the leader key's revision and the lease). A campaign that
finds the key held reads that record, and if it proves that the holder is
gone, it revokes the dead holder's lease and takes the key at once, instead
of following a dead leader until its lease runs out: a coordinator that its
supervisor restarted after a SIGKILL leads within a second. The proof takes
two independent observations: the holder's process is gone (same boot and pid
namespace as this one, and that pid is free, a zombie, or a newer process's),
and its advertised address refuses a connection (hosts cloned from one memory
image share the boot id, and a live leader there answers). Anything short of
proof (no record, another host, a live pid or one of another user's, a /proc
it cannot read, an address that answers or does not refuse) and it follows as
before; see fthsdp/coordinator/store/leader_proof.py.

Lifecycle::

    FOLLOWING --(campaign wins)--> LEADING --(lease lost)--> LOST (the process exits 1;
                                     |                        its supervisor restarts it
                                     +--(SIGTERM)--> resigns    as a follower)
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

from fthsdp.coordinator.store import Store, Versioned
from fthsdp.coordinator.store.leader_proof import (
    Holder,
    HolderRecordError,
    Host,
    PidState,
    Reach,
    Seen,
    pid_state,
    predecessor_gone,
    probe_address,
    probe_pid,
    this_host,
)
from fthsdp.core.errors import StoreError

log = logging.getLogger("fthsdp.coordinator")


class Leadership:
    def __init__(self, store: Store, key: str, me: str, ttl: float, *, sole: bool = False,
                 here: Callable[[], Host | None] = this_host, probe: Callable[[int], Seen] = probe_pid,
                 reach: Callable[[str], Reach] = probe_address) -> None:
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
        self._revision = 0
        """The leader key's revision when this coordinator last took it (0: never)."""
        self._here, self._probe, self._reach = here, probe, reach

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
            self._revision = result.current.revision
            log.info("leader election: this coordinator (%s) leads", self.me)
            await asyncio.to_thread(self._record_holder, result.current.revision)
            return True
        await asyncio.to_thread(self._revoke, lease)
        leader = result.current.value.decode(errors="replace") if result.current else ""
        if leader != self.leader:
            log.info("leader election: %s leads; this coordinator follows", leader or "nobody")
        self.leader = leader
        return False

    def held(self) -> tuple[str, int]:
        """The leader's key and the revision this coordinator took it at: a
        write conditioned on it succeeds only while this coordinator still
        holds the key (fthsdp/coordinator/ledger/writer.py). Before it ever
        led, revision 0: "nobody holds it", which fails while anyone does."""
        return self.key, self._revision

    def _end_dead(self, leader: Versioned) -> bool:
        """Revoke the lease of the key's holder if it is provably dead; True if it was."""
        raw = self.store.get(self.holder_key)
        try:
            holder = Holder.decode(raw.value) if raw else None
        except HolderRecordError as e:
            # Debug only: a follower campaigns every third of the TTL.
            log.debug("leader election: not taking over: %s", e)
            return False
        here = self._here()
        seen, reach = None, Reach.NOT_TRIED
        if holder is not None and holder.host == here:  # elsewhere nothing here can prove it gone
            seen = self._probe(holder.pid)
            if pid_state(seen, holder.pid, holder.start)[0] is PidState.GONE:
                # Only then does its address matter (the connect may take its whole timeout).
                reach = self._reach(holder.address)
        verdict = predecessor_gone(holder, leader, here, self.me, seen, reach)
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
