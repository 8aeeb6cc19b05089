"""Leader election among coordinators that share one store.

The leader holds ``PREFIX/leader`` (its advertised address) under a lease
that it refreshes every third of ``--leader-ttl``; the key vanishes by
itself when the leader dies or is cut off, and another coordinator's next
campaign takes it. Only the leader loads the jobs and decides; the others
serve Status (pointing to the leader) and answer every other call with
UNAVAILABLE, so that clients, which hold a list of coordinators, move on.

Lifecycle::

    FOLLOWING --(campaign wins)--> LEADING --(lease lost)--> LOST (the process exits 1;
                                     |                        its supervisor restarts it
                                     +--(SIGTERM)--> resigns    as a follower)
"""

from __future__ import annotations

import asyncio
import logging
import time

from fthsdp.coordinator.store import Store
from fthsdp.core.errors import StoreError

log = logging.getLogger("fthsdp.coordinator")


class Leadership:
    def __init__(self, store: Store, key: str, me: str, ttl: float) -> None:
        self.store, self.key, self.me, self.ttl = store, key, me, ttl
        self.leader = ""
        """The leader's address as last seen ('' unknown); ``me`` once leading."""
        self.leading = False
        self._lease = 0

    async def try_once(self) -> bool:
        """One campaign: take the key if nobody holds it. True if this coordinator now leads."""
        try:
            lease = await asyncio.to_thread(self.store.grant_lease, self.ttl)
            result = await asyncio.to_thread(self.store.compare_and_set, self.key, self.me.encode(), 0, lease)
        except StoreError as e:
            log.warning("leader election: the store did not answer (%s); trying again", e)
            return False
        if result.succeeded:
            self._lease, self.leading, self.leader = lease, True, self.me
            log.info("leader election: this coordinator (%s) leads", self.me)
            return True
        await asyncio.to_thread(self._revoke, lease)
        leader = result.current.value.decode(errors="replace") if result.current else ""
        if leader != self.leader:
            log.info("leader election: %s leads; this coordinator follows", leader or "nobody")
        self.leader = leader
        return False

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
