"""Wake thousands of waiters without stopping the event loop.

Every Watch stream waits for the next change of its job. An ``asyncio.Event``
wakes them all in one turn of the loop: at 10,000 streams that turn takes
a second (each resumes, builds its event and hands it to gRPC), and nothing
else runs meanwhile. That hurts more than it seems: the asyncio gRPC server
takes a new call only every few turns (about five, measured), so while
thousands of replicas are still opening their sessions, each quorum change stalls their arrival for a whole
turn, and heartbeats that arrived on time wait in line past their timeout.

``Broadcast`` wakes its waiters ``batch`` at a time and lets the loop turn
between batches, so heartbeats and new calls keep being served while a
change goes out. A generation number closes the gap between reading the
state and waiting: ``wait(seen)`` returns at once if a change came since
generation ``seen``.
"""

from __future__ import annotations

import asyncio

DEFAULT_BATCH = 64
"""Waiters released per turn of the loop: a few milliseconds of work (gRPC takes
a new call only every few turns, so long turns starve replicas still arriving)."""


class Broadcast:
    def __init__(self, batch: int = DEFAULT_BATCH) -> None:
        if batch < 1:
            raise ValueError(f"a broadcast batch must be at least 1, not {batch}")
        self.batch = batch
        self.generation = 0
        """Grows by one at every ``notify``."""
        self._waiters: list[asyncio.Future] = []
        self._compact_at = batch
        self._releases: set[asyncio.Task] = set()

    async def wait(self, seen: int) -> None:
        """Return once a ``notify`` came after generation ``seen`` (at once if one already did)."""
        if self.generation != seen:
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        await future

    def add(self, seen: int, future: asyncio.Future) -> None:
        """Resolve ``future`` at the next ``notify`` after generation ``seen`` (at once if one already
        came): one future can wait on several broadcasts, the first to fire resolves it."""
        if self.generation != seen:
            if not future.done():
                future.set_result(None)
            return
        if len(self._waiters) >= self._compact_at:  # futures the other broadcast resolved: not kept forever
            # Once the list doubled, not at every add: thousands of streams waiting at once (a new
            # leader's reconnecting hosts) would each pay a pass over all the others.
            self._waiters = [f for f in self._waiters if not f.done()]
            self._compact_at = max(self.batch, 2 * len(self._waiters))
        self._waiters.append(future)

    def notify(self) -> None:
        """Start waking everyone waiting now, a batch per turn of the loop."""
        self.generation += 1
        waiters, self._waiters = self._waiters, []
        if not waiters:
            return
        if len(waiters) <= self.batch:
            _release(waiters)
            return
        task = asyncio.get_running_loop().create_task(self._release_in_batches(waiters))
        self._releases.add(task)  # held until done: the loop keeps only weak references to tasks
        task.add_done_callback(self._releases.discard)

    async def _release_in_batches(self, waiters: list[asyncio.Future]) -> None:
        for start in range(0, len(waiters), self.batch):
            _release(waiters[start : start + self.batch])
            await asyncio.sleep(0)  # one turn: the released run, and so does everything else


def _release(waiters: list[asyncio.Future]) -> None:
    for future in waiters:
        if not future.done():  # a waiter whose stream was cancelled meanwhile
            future.set_result(None)
