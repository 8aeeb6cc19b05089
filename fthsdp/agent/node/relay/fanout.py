"""A replica's Watch, one upstream stream per host, handed to every local watcher.

Every rank of a replica but its rank 0, and the agent's hang watch, open a
Watch with the same request: the replica's events, each a whole view of it
(its place in the quorum, the notices, the catch-up plan; never a
difference from the one before, fthsdp/coordinator/job/watch_events.py).
The relay opens one upstream stream per distinct request and hands every
event to each local watcher of it, in order; a watcher that comes later is
given the latest event first, as the coordinator gives a new stream. When
the upstream stream ends, every local watcher of it ends with the same
status, and reopens (a new upstream stream, at the next address if this
one was unreachable); when the last local watcher goes, the upstream stream
is cancelled.

Requests that ask for the member list (differences from the last quorum
sent: each stream's own history) or carry a session are not shared: they
are forwarded as they are, one upstream stream each.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator

import grpc

from fthsdp.agent.node.relay.upstream import SERVICE, Upstream
from fthsdp.protos.v1 import coordinator_pb2 as pb


class UpstreamEnded(Exception):
    """The upstream stream a local watcher followed ended with ``code`` (OK: the coordinator ended it)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


def shareable(request: bytes) -> bool:
    """Whether a Watch request's events are the same for every watcher that sends it."""
    try:
        parsed = pb.WatchRequest.FromString(request)
    except Exception:  # noqa: BLE001 - not ours to judge: forwarded as it is, the coordinator answers
        return False
    return not parsed.member_list and not parsed.session_id


@dataclasses.dataclass(eq=False)
class Subscription:
    """One upstream Watch and its local watchers."""

    request: bytes
    watchers: set[asyncio.Queue] = dataclasses.field(default_factory=set)
    latest: bytes | None = None
    task: asyncio.Task | None = None


class WatchFanout:
    """The relay's shared Watch streams, by request (on the relay's event loop)."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self._subscriptions: dict[bytes, Subscription] = {}
        self.opened = 0
        """Upstream Watch streams opened so far (what sharing saves is seen here)."""

    @property
    def open(self) -> int:
        """Upstream Watch streams open now."""
        return len(self._subscriptions)

    async def watch(self, request: bytes) -> AsyncGenerator[bytes, None]:
        """The events of ``request`` for one local watcher; UpstreamEnded when the upstream stream ends."""
        sub = self._subscriptions.get(request)
        if sub is None:
            sub = self._subscriptions[request] = Subscription(request)
            sub.task = asyncio.create_task(self._pump(sub))
            self.opened += 1
        queue: asyncio.Queue = asyncio.Queue()
        if sub.latest is not None:
            queue.put_nowait(sub.latest)
        sub.watchers.add(queue)
        try:
            while True:
                item = await queue.get()
                if isinstance(item, UpstreamEnded):
                    raise item
                yield item
        finally:
            sub.watchers.discard(queue)
            if not sub.watchers and self._subscriptions.get(request) is sub:
                del self._subscriptions[request]
                if sub.task is not None:
                    sub.task.cancel()

    async def _pump(self, sub: Subscription) -> None:
        index, channel = self.upstream.channel()
        call = channel.unary_stream(SERVICE + "Watch")(sub.request, metadata=self.upstream.metadata)
        ended = UpstreamEnded(grpc.StatusCode.OK, "")
        try:
            async for event in call:
                self.upstream.answered(index)
                sub.latest = event
                for queue in sub.watchers:
                    queue.put_nowait(event)
        except grpc.aio.AioRpcError as e:
            self.upstream.failed(index, e.code())
            ended = UpstreamEnded(e.code(), e.details() or "")
        except asyncio.CancelledError:
            call.cancel()
            raise
        finally:
            if self._subscriptions.get(sub.request) is sub:
                del self._subscriptions[sub.request]
        for queue in sub.watchers:
            queue.put_nowait(ended)

    async def close(self) -> None:
        tasks = [sub.task for sub in self._subscriptions.values() if sub.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
