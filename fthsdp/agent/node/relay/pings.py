"""A host's rank pings, coalesced: one upstream stream, one message for many ranks.

Every rank of a replica but its rank 0 pings the coordinator at the
heartbeat interval (a HeartbeatStream that asks for no answers): its step
and progress, which the coordinator's liveness and hang checks read rank by
rank. Under the agent the ranks ping the relay, and the relay keeps each
rank's latest ping and sends what came within ``WINDOW`` as one
``PingBatch`` on one upstream ``Pings`` stream per host: the coordinator
takes one message where it took one per rank. The ranks of one host ping
at the same phase of each interval (fthsdp/core/relay_address.py
``ping_phase``), so that their pings of one interval come within one
window and go as one batch. A ping that waited in the
relay has that wait added to its progress's phase age, so that the
coordinator works out the same phase start as from the rank itself. Each
batch also names the host, whose Host stream then leaves out its own
heartbeats (fthsdp/agent/node/relay/host_beats.py): one message per host per
interval.

Every ping, and the rank's pings for the relay alone (``local_only``,
every second), also tell the host's ``Liveness`` that the rank is alive
(fthsdp/agent/node/relay/liveness.py): a rank silent past its limit is handed
to ``on_silent``, on the relay's loop.

A ping the coordinator refuses (a rank of an ended incarnation, a replica
it does not know yet) is answered alone: that rank's local stream ends
with the status, as its own stream would have, and the others go on. A
refusal that says to move on (a follower, an overloaded coordinator) or a
broken upstream stream opens it again, at the next address if it was
unreachable, after a jittered back-off; the latest ping of each rank goes
in the next batch.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable

import grpc

from fthsdp.agent.node.relay.host_beats import CarriedBeats
from fthsdp.agent.node.relay.liveness import Liveness, Silence
from fthsdp.agent.node.relay.upstream import SERVICE, Upstream
from fthsdp.client import MOVE_ON
from fthsdp.protos.v1 import coordinator_pb2 as pb

WINDOW = 0.2
"""Seconds the relay gathers pings before sending them (a rank's ping waits at most this long)."""
RETRY_FIRST, RETRY_CAP = 0.2, 2.0
SILENCE_CHECK = 0.25
"""Seconds between two looks for silent ranks."""
CODES = {code.value[0]: code for code in grpc.StatusCode}

Key = tuple[str, str, int]
"""A pinging rank: its replica, its incarnation, its shard rank."""


def key_of(ping: pb.HeartbeatRequest | pb.PingRefused) -> Key:
    return ping.replica_id, ping.incarnation, ping.shard_rank


class Pinger:
    """The host's pings upstream (on the relay's event loop): ``start()``, then ``follow`` each local stream."""

    def __init__(self, upstream: Upstream, window: float = WINDOW, liveness: Liveness | None = None,
                 on_silent: Callable[[Silence], None] | None = None) -> None:
        self.upstream = upstream
        self.window = window
        self.liveness = liveness
        self._on_silent = on_silent
        self.beats = CarriedBeats()
        """The hosts the batches speak for (their Host streams' heartbeats: fthsdp/agent/node/relay/host_beats.py)."""
        self._pending: dict[Key, tuple[pb.HeartbeatRequest, float]] = {}
        self._ready = asyncio.Event()
        self._refusals: dict[Key, set[asyncio.Future]] = {}
        self._task: asyncio.Task | None = None
        self._silence_task: asyncio.Task | None = None
        self.batches = 0
        """Batches sent so far."""
        self.pings = 0
        """Pings sent so far, in those batches."""

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())
        if self.liveness is not None:
            self._silence_task = asyncio.create_task(self._look_for_silence(self.liveness))

    async def close(self) -> None:
        tasks = [t for t in (self._task, self._silence_task) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _look_for_silence(self, liveness: Liveness) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(SILENCE_CHECK)
            for silence in liveness.silent(loop.time()):
                if self._on_silent is not None:
                    self._on_silent(silence)

    async def follow(self, first: pb.HeartbeatRequest, rest: AsyncIterator[bytes]) -> pb.PingRefused | None:
        """Send ``first``, then each ping of one local stream, until the rank
        closes it (None) or the coordinator refuses one of its pings (the refusal)."""
        key = key_of(first)
        loop = asyncio.get_running_loop()
        refused: asyncio.Future = loop.create_future()
        self._refusals.setdefault(key, set()).add(refused)
        if self.liveness is not None:
            self.liveness.opened(key, loop.time())
        self._put(first)
        reader = asyncio.create_task(self._read(rest))
        try:
            done, _ = await asyncio.wait({reader, refused}, return_when=asyncio.FIRST_COMPLETED)
            if reader in done:
                reader.result()  # a broken local stream ends this one with its error
            return refused.result() if refused in done else None
        finally:
            reader.cancel()
            if self.liveness is not None:
                self.liveness.closed(key)
            waiting = self._refusals.get(key)
            if waiting is not None:
                waiting.discard(refused)
                if not waiting:
                    del self._refusals[key]

    async def _read(self, rest: AsyncIterator[bytes]) -> None:
        async for raw in rest:
            self._put(pb.HeartbeatRequest.FromString(raw))

    def _put(self, ping: pb.HeartbeatRequest) -> None:
        now = asyncio.get_running_loop().time()
        if self.liveness is not None:
            if ping.left:
                self.liveness.forget(key_of(ping))  # its group leaves cleanly: it stops pinging
            else:
                self.liveness.heard(key_of(ping), now)
        if ping.local_only:
            return  # for this host alone
        self._pending[key_of(ping)] = (ping, now)
        self._ready.set()

    async def _batches(self) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        while True:
            await self._ready.wait()
            await asyncio.sleep(self.window)
            self._ready.clear()
            taken, self._pending = self._pending, {}
            if not taken:
                continue
            now = loop.time()
            batch = pb.PingBatch()
            for ping, came in taken.values():
                if ping.HasField("progress"):
                    ping.progress.phase_age_s += now - came  # the phase began as long ago as the rank said
                batch.pings.append(ping)
            self.beats.name(batch, now)
            self.batches += 1
            self.pings += len(taken)
            yield batch.SerializeToString()

    async def _run(self) -> None:
        delay, loop = RETRY_FIRST, asyncio.get_running_loop()
        while True:
            opened = loop.time()
            index, channel = self.upstream.channel()
            call = channel.stream_stream(SERVICE + "Pings")(self._batches(), metadata=self.upstream.metadata)
            try:
                async for raw in call:
                    refusal = pb.PingRefused.FromString(raw)
                    code = CODES.get(refusal.code, grpc.StatusCode.UNKNOWN)
                    if code in MOVE_ON:
                        self.upstream.failed(index, code)
                        break
                    self.upstream.answered(index)
                    delay = RETRY_FIRST
                    for waiter in self._refusals.get(key_of(refusal), ()):
                        if not waiter.done():
                            waiter.set_result(refusal)
            except grpc.aio.AioRpcError as e:
                self.upstream.failed(index, e.code())
            finally:
                call.cancel()
            if loop.time() - opened > 5 * RETRY_CAP:
                delay = RETRY_FIRST  # it had been working: this is a new outage
            await asyncio.sleep(delay * (0.5 + 0.5 * random.random()))
            delay = min(delay * 2, RETRY_CAP)
