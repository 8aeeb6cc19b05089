"""The relay's server: the coordinator's job calls on a Unix socket, forwarded.

``LocalRelay`` runs a gRPC server on its own thread and event loop, bound
to a Unix socket in a folder only the agent's user can enter. Each call is
forwarded as bytes (nothing is parsed but a Watch request, to share it):

* unary calls (Heartbeat, Leave, ReportReach, ReportAgentEvent, Status,
  Register) to the coordinator that answered last, or the next one while
  they are unreachable, within the caller's deadline;
* the Watch of a replica through ``WatchFanout`` (one upstream stream per
  host);
* the ranks' pings (a HeartbeatStream that asks for no answers) through
  ``Pinger``: one upstream Pings stream per host, a batch per window; the
  pings for the relay alone tell it each rank is alive (``silent()``:
  fthsdp/agent/node/relay/liveness.py);
* the other streams (Session, a HeartbeatStream that asks for answers,
  Host) one upstream stream each, over the agent's one connection; the
  Host stream less the heartbeats that the ping batches carried
  (fthsdp/agent/node/relay/host_beats.py), its joins naming where this
  relay takes its group's pings, should it be the group's host 0
  (fthsdp/agent/node/relay/tree.py).

A caller must present the job's token, as it would to the coordinator. The
operators' calls (Drain, Cordon, Inject, ...) are not forwarded: they need
the admin token, which no agent holds. Every status the coordinator answers
reaches the caller as it is, so a rank sees what it would have seen.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import queue
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Sequence

import grpc

from fthsdp.agent.node.relay.fanout import UpstreamEnded, WatchFanout, shareable
from fthsdp.agent.node.relay.host_beats import HostStream
from fthsdp.agent.node.relay.liveness import Liveness, Silence
from fthsdp.agent.node.relay.pings import CODES, Pinger
from fthsdp.agent.node.relay.tree import PeerServer
from fthsdp.agent.node.relay.upstream import SERVICE, Upstream
from fthsdp.client import MOVE_ON, SERVER_KEEPALIVE
from fthsdp.core.auth import METHOD_ACCESS, Access
from fthsdp.core.credentials import TlsFiles, bearer_metadata
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.agent.relay")

SOCKET_NAME = "coordinator.sock"
START_TIMEOUT = 10.0
"""Seconds the relay may take to start serving."""


def _kinds() -> dict[str, tuple[bool, bool]]:
    """Each forwarded method's (client streaming, server streaming), from the service's descriptor."""
    service = pb.DESCRIPTOR.services_by_name["Coordinator"]
    return {m.name: (m.client_streaming, m.server_streaming) for m in service.methods
            if METHOD_ACCESS.get(m.name) in (Access.REPLICA, Access.READ)}


class LocalRelay:
    """The agent's relay: ``start()``, hand ``address`` to the ranks, ``close()``."""

    def __init__(self, coordinators: Sequence[str], token: str, tls: TlsFiles | None,
                 rank_silence: float | None = None) -> None:
        """``rank_silence``: follow each local rank's liveness, and call one silent after this many
        seconds without a ping (``silent()``); None: not followed."""
        self._coordinators = list(coordinators)
        self._rank_silence = rank_silence
        self._silences: queue.SimpleQueue[Silence] = queue.SimpleQueue()
        self._token = token
        self._tls = tls
        self._folder = tempfile.mkdtemp(prefix="fthsdp-relay-")  # 0700: only the agent's user enters
        self.path = os.path.join(self._folder, SOCKET_NAME)
        self.address = f"unix:{self.path}"
        """What the ranks are given as FTHSDP_COORDINATOR."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="fthsdp-relay", daemon=True)
        self.fanout: WatchFanout | None = None
        self.pinger: Pinger | None = None
        self.peers: PeerServer | None = None
        """Where the group's other hosts send their pings, should this host be its host 0
        (fthsdp/agent/node/relay/tree.py)."""

    def start(self) -> LocalRelay:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT):
            raise RuntimeError(f"the agent's relay did not start within {START_TIMEOUT:g}s")
        if self._error is not None:
            raise RuntimeError(f"the agent's relay could not start on {self.path}: {self._error}") from self._error
        return self

    def silent(self) -> Silence | None:
        """A local rank that stopped pinging, if any (each once, in the order seen)."""
        try:
            return self._silences.get_nowait()
        except queue.Empty:
            return None

    def close(self) -> None:
        if self._loop is not None and self._stopped is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(START_TIMEOUT)
        shutil.rmtree(self._folder, ignore_errors=True)

    def __enter__(self) -> LocalRelay:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ----- the relay's own thread --------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # noqa: BLE001 - start() reports it, or the log once it served
            if self._ready.is_set():
                log.exception("the agent's relay to the coordinator stopped; its ranks cannot reach the coordinator")
            self._error = e
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        upstream = Upstream(self._coordinators, self._token, self._tls)
        self.fanout = WatchFanout(upstream)
        liveness = Liveness(self._rank_silence) if self._rank_silence is not None else None
        self.pinger = Pinger(upstream, liveness=liveness, on_silent=self._silences.put)
        self.pinger.start()
        self.peers = PeerServer(self.pinger, self._token, self._tls)
        calls = Calls(upstream, self.fanout, self.pinger, bearer_metadata(self._token), self.peers)
        server = grpc.aio.server(options=SERVER_KEEPALIVE)
        server.add_generic_rpc_handlers((calls.handler(),))
        server.add_insecure_port(self.address)
        await server.start()
        self._ready.set()
        try:
            await self._stopped.wait()
        finally:
            await self.peers.close()
            await self.pinger.close()
            await self.fanout.close()
            await server.stop(grace=0.5)
            await upstream.close()


def parsed(raw: bytes) -> pb.HeartbeatRequest | None:
    """A ping as sent, or None if it does not parse (forwarded as it is: the coordinator answers)."""
    try:
        return pb.HeartbeatRequest.FromString(raw)
    except Exception:  # noqa: BLE001 - not ours to judge
        return None


class Calls:
    """The forwarding of each kind of call (on the relay's event loop)."""

    def __init__(self, upstream: Upstream, fanout: WatchFanout, pinger: Pinger,
                 expected: tuple[tuple[str, str], ...], peers: PeerServer | None = None) -> None:
        self.upstream = upstream
        self.fanout = fanout
        self.pinger = pinger
        self.peers = peers
        self._expected = dict(expected).get("authorization", "")

    def handler(self) -> grpc.GenericRpcHandler:
        handlers = {}
        for name, (client_streaming, server_streaming) in _kinds().items():
            method = SERVICE + name
            if name == "Watch":
                handlers[name] = grpc.unary_stream_rpc_method_handler(self.watch)
            elif name == "HeartbeatStream":
                handlers[name] = grpc.stream_stream_rpc_method_handler(self.heartbeat_stream)
            elif name == "Host":
                handlers[name] = grpc.stream_stream_rpc_method_handler(self.host_stream)
            elif client_streaming or server_streaming:
                assert client_streaming and server_streaming, f"{name}: the relay forwards bidirectional streams"
                handlers[name] = grpc.stream_stream_rpc_method_handler(self._stream(method))
            else:
                handlers[name] = grpc.unary_unary_rpc_method_handler(self._unary(method))
        return grpc.method_handlers_generic_handler(SERVICE.strip("/"), handlers)

    async def _authorize(self, context: grpc.aio.ServicerContext) -> None:
        if not self._expected:
            return
        given = dict(context.invocation_metadata() or ()).get("authorization", "")
        if not hmac.compare_digest(str(given).encode(), self._expected.encode()):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "the agent's relay: missing or wrong job token")

    def _unary(self, method: str):
        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            await self._authorize(context)
            last: grpc.aio.AioRpcError | None = None
            for k in range(len(self.upstream.addresses)):
                index, channel = self.upstream.channel(k)
                try:
                    response = await channel.unary_unary(method)(
                        request, metadata=self.upstream.metadata, timeout=context.time_remaining())
                except grpc.aio.AioRpcError as e:
                    self.upstream.failed(index, e.code())
                    if e.code() in MOVE_ON:
                        last = e
                        continue
                    await context.abort(e.code(), e.details() or "")
                self.upstream.answered(index)
                return response
            assert last is not None
            await context.abort(last.code(), last.details() or "")
            raise AssertionError("unreachable: abort raises")
        return forward

    def _stream(self, method: str):
        async def forward(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext):
            await self._authorize(context)
            index, channel = self.upstream.channel()
            call = channel.stream_stream(method)(requests, metadata=self.upstream.metadata)
            async for item in self._pipe(index, call, context):
                yield item
        return forward

    async def host_stream(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext):
        """The agent's Host stream, less the heartbeats its host's ping batches carried."""
        await self._authorize(context)
        stream = HostStream(self.pinger.beats, self.pinger.route, self.peers, asyncio.get_running_loop().time)
        index, channel = self.upstream.channel()
        call = channel.stream_stream(SERVICE + "Host")(stream.requests(requests), metadata=self.upstream.metadata)
        try:
            async for item in self._pipe(index, call, context):
                stream.pushed(item)
                yield item
        finally:
            stream.close()

    async def heartbeat_stream(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext):
        """A rank's pings (no answers asked) go with the host's others (``Pinger``); a stream that asks for
        answers is forwarded as it is."""
        await self._authorize(context)
        raw = await anext(aiter(requests), None)
        if raw is None:
            return
        first = parsed(raw)
        if first is None or first.ack:
            async def again() -> AsyncIterator[bytes]:
                yield raw
                async for rest in requests:
                    yield rest
            index, channel = self.upstream.channel()
            call = channel.stream_stream(SERVICE + "HeartbeatStream")(again(), metadata=self.upstream.metadata)
            async for item in self._pipe(index, call, context):
                yield item
            return
        refusal = await self.pinger.follow(first, requests)
        if refusal is not None:
            await context.abort(CODES.get(refusal.code, grpc.StatusCode.UNKNOWN), refusal.details)

    async def watch(self, request: bytes, context: grpc.aio.ServicerContext):
        await self._authorize(context)
        if not shareable(request):
            index, channel = self.upstream.channel()
            call = channel.unary_stream(SERVICE + "Watch")(request, metadata=self.upstream.metadata)
            async for item in self._pipe(index, call, context):
                yield item
            return
        events = self.fanout.watch(request)
        try:
            async for event in events:
                yield event
        except UpstreamEnded as e:
            if e.code is not grpc.StatusCode.OK:
                await context.abort(e.code, e.details)
        finally:
            await events.aclose()

    async def _pipe(self, index: int, call, context: grpc.aio.ServicerContext):
        """The items of an upstream stream ``call`` (to the coordinator at ``index``); its end status, passed on."""
        try:
            async for item in call:
                self.upstream.answered(index)
                yield item
        except grpc.aio.AioRpcError as e:
            self.upstream.failed(index, e.code())
            await context.abort(e.code(), e.details() or "")
        finally:
            call.cancel()
