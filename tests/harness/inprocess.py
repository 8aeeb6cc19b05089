"""A real coordinator server in this process, on an event loop of its own
thread, and the tokens the auth tests configure it with; and, with no server
at all, the fakes that drive the coordinator's streams and servicer on the
test's own event loop (a leading runtime on the memory store and a fake
clock, a stream's requests, a gRPC context, a collector of what a stream
sends): tests/test_streams_inprocess.py, tests/test_servicer_inprocess.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable

from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.coordinator.engine.runtime import CoordinatorRuntime
from fthsdp.coordinator.server import start_coordinator
from fthsdp.coordinator.store.memory import MemoryStore
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.jobs import agent_of
from tests.harness.runtimes import FakeClock

JOB_TOKEN = "job-token-0123456789"


ADMIN_TOKEN = "admin-token-9876543210"


class InProcessCoordinator:
    """``start_coordinator`` on a loop of its own thread, so that the
    blocking client and the CLI can call it from the test's thread."""

    def __init__(self, config: CoordinatorConfig) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="test-coordinator", daemon=True)
        self._thread.start()
        self.running = asyncio.run_coroutine_threadsafe(start_coordinator(config), self._loop).result(30)
        self.address = f"127.0.0.1:{self.running.port}"

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.running.stop(grace=0.1), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


# ----- no server: the streams and the servicer on the test's event loop ---------------

DEADLINE = 5.0
"""Seconds a test waits for something the coordinator must send (it comes within a few turns of the loop)."""


def leading_runtime(**settings) -> tuple[CoordinatorRuntime, FakeClock]:
    """A runtime that leads job "default" on the memory store, on a fake
    clock, without its decision loop (the test decides: ``evaluate``) unless
    the test calls ``start()``. One replica makes a quorum; the first forms without a settle."""
    clock = FakeClock()
    config = CoordinatorConfig(min_replicas=1, join_settle=0.0, **settings)
    runtime = CoordinatorRuntime(config, MemoryStore(), "coord:1", clock=clock, wall=lambda: 1000.0)
    runtime.leading = True  # what start() sets once it loaded the jobs
    return runtime, clock


def register_request(replica_id: str, **fields) -> pb.RegisterRequest:
    """Replica ``replica_id``'s registration, started by its agent (``agent_of``)."""
    fields.setdefault("agent_ids", [agent_of(replica_id)])
    fields.setdefault("job", "default")
    fields.setdefault("world_size", 1)
    return pb.RegisterRequest(replica_id=replica_id, address=f"{replica_id}:1", **fields)


async def registered(runtime: CoordinatorRuntime, *replica_ids: str) -> dict[str, str]:
    """Register each replica and heartbeat once, as an agent's replica does; their session ids."""
    sessions = {}
    for rid in replica_ids:
        sessions[rid] = (await runtime.register(register_request(rid))).session_id
        runtime.heartbeat(pb.HeartbeatRequest(job="default", replica_id=rid, session_id=sessions[rid]))
    return sessions


class Requests:
    """A stream's incoming requests as gRPC hands them to a handler: an
    async iterator the test feeds (``send``) and ends (``close``: the client
    closed its side)."""

    _END = object()

    def __init__(self, *first) -> None:
        self._queue: asyncio.Queue = asyncio.Queue()
        for message in first:
            self.send(message)

    def send(self, message) -> None:
        self._queue.put_nowait(message)

    def close(self) -> None:
        self._queue.put_nowait(self._END)

    def __aiter__(self) -> Requests:
        return self

    async def __anext__(self):
        message = await self._queue.get()
        if message is self._END:
            self._queue.put_nowait(self._END)  # ended for good
            raise StopAsyncIteration
        return message


class Aborted(Exception):
    """What ``ServicerContext.abort`` raises in grpc.aio: the call ends with ``code`` and ``details``."""

    def __init__(self, code, details: str) -> None:
        super().__init__(code, details)
        self.code, self.details = code, details


class FakeContext:
    """The little of a grpc.aio ``ServicerContext`` the servicer uses: ``abort``
    (recorded, then raises ``Aborted`` as grpc.aio's does), ``peer``,
    ``auth_context`` (a client certificate's names under mutual TLS) and
    ``send_initial_metadata`` (recorded)."""

    def __init__(self, peer: str = "ipv4:10.0.0.9:5000", auth: dict | None = None) -> None:
        self._peer, self._auth = peer, auth or {}
        self.aborts: list[tuple[object, str]] = []
        self.initial_metadata: tuple = ()

    async def send_initial_metadata(self, metadata) -> None:
        self.initial_metadata = tuple(metadata)

    async def abort(self, code, details: str = "") -> None:
        self.aborts.append((code, details))
        raise Aborted(code, details)

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> dict:
        return self._auth


class Collector:
    """Reads a stream to its end in a task of its own, as gRPC reads a
    handler's responses; ``items`` decoded by ``decode``, ``until(n)`` waits
    (with a deadline) for the n-th. ``error``: what ended the stream, if it raised."""

    def __init__(self, stream: AsyncIterator, decode: Callable = lambda item: item) -> None:
        self.stream, self.decode = stream, decode
        self.items: list = []
        self.error: BaseException | None = None
        self._more = asyncio.Event()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for item in self.stream:
                self.items.append(self.decode(item))
                self._more.set()
        except Exception as e:  # noqa: BLE001 - kept for the test to look at
            self.error = e
        finally:
            self._more.set()

    async def until(self, n: int, timeout: float = DEADLINE) -> list:
        """The items once there are ``n`` (TimeoutError if they do not come, or the stream ends first)."""

        async def more() -> None:
            while len(self.items) < n:
                if self.task.done():
                    raise AssertionError(f"the stream ended after {len(self.items)} items ({self.error!r}), "
                                         f"{n} expected: {self.items}")
                self._more.clear()
                await self._more.wait()

        await asyncio.wait_for(more(), timeout)
        return self.items

    async def ended(self, timeout: float = DEADLINE) -> None:
        """Wait (with a deadline) for the stream to end."""
        await asyncio.wait_for(asyncio.shield(self.task), timeout)
