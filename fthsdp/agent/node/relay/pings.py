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
interval. In a group of several hosts the batches of every host but the
round's node rank 0 go to that host's relay (``route``), which sends them
on in its own, and answers each once it did (``take``): one message per
group per interval (fthsdp/agent/node/relay/tree.py). To a coordinator
that says on the Pings call that it reads them, the ranks' pings go in
columns, one ``RankDigest`` per replica incarnation (fthsdp/core/rank_digest.py).

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
from fthsdp.agent.node.relay.tree import GROUP_PINGS, Feed, Route, ack_wait, peer_channel
from fthsdp.agent.node.relay.upstream import SERVICE, Upstream
from fthsdp.client import MOVE_ON
from fthsdp.core import rank_digest
from fthsdp.protos.v1 import coordinator_pb2 as pb

WINDOW = 0.2
"""Seconds the relay gathers pings before sending them (a rank's ping waits at most this long)."""
PEER_WINDOW = 0.05
"""The same, for a batch to the group's host 0: short, so that it reaches host 0 within host 0's window."""
ACK_CHECK = 0.25
"""Seconds between two looks for a batch the group's host 0 did not pass on."""
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
        self.route = Route(secure=upstream.secure)
        """Where the batches go: the coordinator, or the group's host 0 (fthsdp/agent/node/relay/tree.py)."""
        self._pending: dict[Key, tuple[pb.HeartbeatRequest, float]] = {}
        self._feeds: dict[Key, Feed] = {}
        """As the group's host 0: the other hosts' pings pending or sent, by the stream they came on."""
        self._peer_hosts: dict[str, str] = {}
        """As the group's host 0: the other hosts the next batch names (host id -> job)."""
        self._acks: list[tuple[Feed, int]] = []
        """As the group's host 0: the other hosts' batches the next batch passes on."""
        self._seq = 0
        self._digests_read = False
        """The coordinator of the open Pings call reads ``PingBatch.digests`` (fthsdp/core/rank_digest.py)."""
        self._peer_channels: dict[tuple[str, bytes], grpc.aio.Channel] = {}
        self._ready = asyncio.Event()
        self._refusals: dict[Key, set[asyncio.Future]] = {}
        self._task: asyncio.Task | None = None
        self._silence_task: asyncio.Task | None = None
        self.batches = 0
        """Batches sent so far."""
        self.pings = 0
        """Pings sent so far, in those batches."""
        self.digests = 0
        """Rank digests sent so far, in those batches (fthsdp/core/rank_digest.py)."""

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())
        if self.liveness is not None:
            self._silence_task = asyncio.create_task(self._look_for_silence(self.liveness))

    async def close(self) -> None:
        tasks = [t for t in (self._task, self._silence_task) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for channel in self._peer_channels.values():
            await channel.close()

    def take(self, batch: pb.PingBatch, feed: Feed) -> None:
        """As the group's host 0: another host's batch, passed on in this host's next one."""
        now = asyncio.get_running_loop().time()
        for ping in batch.pings:
            key = key_of(ping)
            self._pending[key] = (ping, now)
            self._feeds[key] = feed
            feed.keys.add(key)
        for host_id in batch.hosts:
            self._peer_hosts[host_id] = batch.job
        self._acks.append((feed, batch.seq))
        self._ready.set()

    def forget(self, feed: Feed) -> None:
        """Another host's stream ended: its refusals have nowhere to go."""
        for key in feed.keys:
            if self._feeds.get(key) is feed:
                del self._feeds[key]

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

    async def _batches(self, numbered: dict[int, tuple[float, list, list[str]]] | None = None
                       ) -> AsyncIterator[bytes]:
        """The batches, a window after the first ping of each; ``numbered``: to the group's host 0, each
        numbered and kept there until host 0 passes it on (sent at, its pings, the hosts it names)."""
        loop = asyncio.get_running_loop()
        while True:
            await self._ready.wait()
            await asyncio.sleep(self.window if numbered is None else min(self.window, PEER_WINDOW))
            self._ready.clear()
            taken, self._pending = self._pending, {}
            acks, self._acks = self._acks, []
            peer_hosts, self._peer_hosts = self._peer_hosts, {}
            if not taken and not peer_hosts:
                continue
            now = loop.time()
            batch = pb.PingBatch()
            for ping, came in taken.values():
                if ping.HasField("progress"):
                    ping.progress.phase_age_s += now - came  # the phase began as long ago as the rank said
            if numbered is None and self._digests_read:
                digests, whole = rank_digest.encode(ping for ping, _ in taken.values())
                batch.digests.extend(digests)
                batch.pings.extend(whole)
                self.digests += len(digests)
            else:
                batch.pings.extend(ping for ping, _ in taken.values())
            own = self.beats.name(batch)
            for host_id, job in peer_hosts.items():
                batch.job = job
                batch.hosts.append(host_id)
            if numbered is None:
                self.beats.sent(own, now)
            else:
                self._seq += 1
                batch.seq = self._seq
                numbered[self._seq] = (now, [ping for ping, _ in taken.values()], own)
            for feed, seq in acks:
                feed.replies.put_nowait(pb.GroupPingsReply(forwarded=seq))
            self.batches += 1
            self.pings += len(taken)
            yield batch.SerializeToString()

    def _refused(self, refusal: pb.PingRefused) -> None:
        """A ping the coordinator refused: its rank's local stream ends, or it goes back to the host it came from."""
        key = key_of(refusal)
        for waiter in self._refusals.get(key, ()):
            if not waiter.done():
                waiter.set_result(refusal)
        feed = self._feeds.get(key)
        if feed is not None:
            feed.replies.put_nowait(pb.GroupPingsReply(refused=refusal))

    async def _run(self) -> None:
        delay, loop = RETRY_FIRST, asyncio.get_running_loop()
        while True:
            opened = loop.time()
            self.route.changed.clear()
            aggregator = self.route.target(opened)
            if aggregator and await self._via_group(aggregator):
                continue  # the route changed, or host 0 did not pass a batch on: at once, the new way
            if not aggregator and await self._direct():
                continue
            if loop.time() - opened > 5 * RETRY_CAP:
                delay = RETRY_FIRST  # it had been working: this is a new outage
            await asyncio.sleep(delay * (0.5 + 0.5 * random.random()))
            delay = min(delay * 2, RETRY_CAP)

    async def _until_changed(self, reading: asyncio.Task) -> bool:
        """Wait for ``reading`` to end (False) or the route to change (True, ``reading`` cancelled)."""
        changed = asyncio.create_task(self.route.changed.wait())
        try:
            done, _ = await asyncio.wait({reading, changed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
        if reading in done:
            reading.result()
            return False
        reading.cancel()
        return True

    async def _direct(self) -> bool:
        """One Pings call to the coordinator, until it ends (False) or the route changes (True)."""
        index, channel = self.upstream.channel()
        self._digests_read = False
        call = channel.stream_stream(SERVICE + "Pings")(self._batches(), metadata=self.upstream.metadata)

        async def read() -> None:
            said = await call.initial_metadata()
            self._digests_read = any(key == rank_digest.RANK_DIGESTS for key, _ in said or ())
            async for raw in call:
                refusal = pb.PingRefused.FromString(raw)
                code = CODES.get(refusal.code, grpc.StatusCode.UNKNOWN)
                if code in MOVE_ON:
                    self.upstream.failed(index, code)
                    return
                self.upstream.answered(index)
                self._refused(refusal)

        try:
            return await self._until_changed(asyncio.create_task(read()))
        except grpc.aio.AioRpcError as e:
            self.upstream.failed(index, e.code())
            return False
        finally:
            call.cancel()

    async def _via_group(self, address: str) -> bool:
        """Batches to the group's host 0 at ``address``, until the route changes or host 0 does not pass one
        on in time: then the coordinator, directly, for a while (True either way: no back-off)."""
        loop = asyncio.get_running_loop()
        cert = self.route.cert
        channel = self._peer_channels.get((address, cert))
        if channel is None:
            channel = self._peer_channels[(address, cert)] = peer_channel(address, cert)
        sent: dict[int, tuple[float, list, list[str]]] = {}
        call = channel.stream_stream(GROUP_PINGS)(self._batches(sent), metadata=self.upstream.metadata)

        async def read() -> None:
            async for raw in call:
                reply = pb.GroupPingsReply.FromString(raw)
                if reply.WhichOneof("message") == "forwarded":
                    passed = sent.pop(reply.forwarded, None)
                    if passed is not None:
                        self.beats.sent(passed[2], loop.time())
                elif reply.WhichOneof("message") == "refused":
                    self._refused(reply.refused)

        reading = asyncio.create_task(read())
        changed = asyncio.create_task(self.route.changed.wait())
        try:
            while True:
                done, _ = await asyncio.wait({reading, changed}, timeout=ACK_CHECK,
                                             return_when=asyncio.FIRST_COMPLETED)
                if changed in done:
                    return True
                if reading in done:
                    break  # host 0's stream ended: it is gone, or going
                wait = ack_wait(self.beats.interval)
                if any(loop.time() - at > wait for at, _, _ in sent.values()):
                    break
        except grpc.aio.AioRpcError:
            pass
        finally:
            reading.cancel()
            changed.cancel()
            await asyncio.gather(reading, changed, return_exceptions=True)
            call.cancel()
        self.route.failed(loop.time())
        for at, pings, _ in sent.values():  # not passed on: they go to the coordinator, unless newer ones do
            for ping in pings:
                self._pending.setdefault(key_of(ping), (ping, at))
        if self._pending:
            self._ready.set()
        return True
