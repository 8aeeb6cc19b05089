"""A group's pings as one batch: its host 0's relay speaks for its other hosts (issue 50).

Without it every host's relay sends its ranks' pings, and the host's
heartbeat with them (fthsdp/agent/node/relay/host_beats.py), to the
coordinator: one message per host per interval, 12,500 a second at the
target size. With it a group of 16 to 128 hosts sends one
(benchmarks/README.md, "the tree"):

* Each relay serves ``GroupPings`` on the host's own address (``PeerServer``,
  opened when its Host stream says hello), and fills in its joins'
  ``pings`` with where; the coordinator passes node rank 0's on in the
  round's ``RoundComplete.pings``.
* The relay of every other host of the round sends its batches there
  instead (``Route``), numbered; host 0's relay puts their pings with its
  own ranks' and sends them on in its next batch, naming their hosts
  (which keeps them alive), and answers each with ``forwarded`` as it
  goes; a refusal of one of their pings goes back to the host that sent
  it. The ranks of a group ping at one phase of the interval (the phase
  is drawn from the group: fthsdp/core/relay_address.py), so the hosts'
  batches reach host 0 within its window.
* A host whose batch is not forwarded within ``ack_wait`` (host 0 gone,
  hung or slow, or its stream broke) sends it, and its next ones for
  ``FALLBACK_FOR`` seconds, to the coordinator itself: the pings of a host
  whose host 0 hiccuped reach the coordinator well inside its heartbeat
  timeout, so no healthy group is dropped for it; the loss of host 0 is
  host 0's own (its Host stream closes, or its beats stop).
* A round that ends, or a host whose stream closes, goes back to sending
  its own batches.

A caller presents the job's token. Under TLS (the agents reach the
coordinator over TLS) the agents' certificates are client certificates at
most (deploy/make-certs.sh), which cannot serve and name no host; so host
0's relay serves GroupPings with a certificate it made itself at start
(fthsdp/core/self_signed.py, naming ``RELAY_NAME``), sends it with its
address in its join (``HostJoin.pings_cert``), and the coordinator passes
it on with the address (``RoundComplete.pings_cert``). The other hosts
trust that certificate alone, by name ``RELAY_NAME``: it came from the
coordinator they reach over verified TLS, so it is host 0's whole
identity, and the token never travels in the clear. Under TLS a host never
sends to a host 0 that gave no certificate: it sends its own batches.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import AsyncIterator

import grpc

from fthsdp.client import CHANNEL_OPTIONS, SERVER_KEEPALIVE
from fthsdp.core import self_signed
from fthsdp.core.credentials import TlsFiles, bearer_metadata
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.agent.relay")

GROUP_PINGS = "/fthsdp.v1.GroupPings/Pings"
FALLBACK_FOR = 30.0
"""Seconds a host sends its own batches to the coordinator after its host 0 did not forward one."""


RELAY_NAME = "fthsdp-relay"
"""The name a relay's own certificate gives, and that its peers check it by (they pin the certificate itself)."""


def ack_wait(interval: float) -> float:
    """Seconds a host waits for its host 0 to forward a batch before it sends its own: past a window and the
    network's round trip, well inside the heartbeat timeout (5 intervals by default)."""
    return 1.5 * interval + 0.5


class Route:
    """Where this host's batches go: the coordinator, or its group's host 0 (``to``), unless that failed lately."""

    def __init__(self, secure: bool = False) -> None:
        self.secure = secure
        """This relay reaches the coordinator over TLS: it sends to no host 0 without a certificate to pin."""
        self.aggregator = ""
        """HOST:PORT of the round's host 0 relay; '': none (this host is host 0, or no round runs)."""
        self.host_id = ""
        """Host 0's host id."""
        self.cert = b""
        """The certificate host 0's relay serves with (``RoundComplete.pings_cert``); empty: plain gRPC."""
        self._failed_until = 0.0
        self.changed = asyncio.Event()
        """Set when the route changes: the open upstream call ends, and the next opens where it says."""

    def to(self, aggregator: str, host_id: str = "", cert: bytes = b"") -> None:
        if aggregator and self.secure and not cert:
            log.warning("the group's host 0 (%s) takes its hosts' pings without TLS; under TLS this host sends "
                        "its own", aggregator)
            aggregator = host_id = ""
        if (aggregator, host_id, cert) != (self.aggregator, self.host_id, self.cert):
            self.aggregator, self.host_id, self.cert, self._failed_until = aggregator, host_id, cert, 0.0
            self.changed.set()

    def failed(self, now: float) -> None:
        """Host 0 did not forward a batch: the coordinator, directly, for a while (then host 0 again)."""
        log.warning("the group's host 0 (%s) did not pass this host's pings on; sending them to the coordinator "
                    "for %gs", self.aggregator, FALLBACK_FOR)
        self._failed_until = now + FALLBACK_FOR
        asyncio.get_running_loop().call_later(FALLBACK_FOR, self.changed.set)

    def target(self, now: float) -> str:
        """Where to send now: host 0's relay, or '' for the coordinator."""
        return self.aggregator if now >= self._failed_until else ""


class Feed:
    """One host's GroupPings stream at its host 0: the answers to send it, and the ranks whose pings it sent."""

    def __init__(self) -> None:
        self.replies: asyncio.Queue[pb.GroupPingsReply | None] = asyncio.Queue()
        self.keys: set[tuple[str, str, int]] = set()


class PeerServer:
    """The GroupPings service of this host's relay, on the host's own address (``listen``)."""

    def __init__(self, pinger, token: str, tls: TlsFiles | None) -> None:
        self._pinger = pinger
        self._expected = dict(bearer_metadata(token)).get("authorization", "")
        self._tls = tls
        self._server: grpc.aio.Server | None = None
        self.address = ""
        """HOST:PORT it serves on; '' until it does."""
        self.cert = b""
        """Under TLS, the certificate it serves with (made at ``listen``); empty: plain gRPC."""

    async def listen(self, host: str) -> str:
        """Serve on ``host`` (a free port), once; '' if it does not (the hosts of the group send their own)."""
        if self._server is not None or not host:
            return self.address
        server = self._server = grpc.aio.server(options=SERVER_KEEPALIVE)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "fthsdp.v1.GroupPings", {"Pings": grpc.stream_stream_rpc_method_handler(self.pings)}),))
        bind = f"[{host}]:0" if ":" in host else f"{host}:0"
        try:
            if self._tls is not None and self._tls.enabled:
                made = self_signed.make("fthsdp relay (ephemeral)", RELAY_NAME)
                port = server.add_secure_port(bind, grpc.ssl_server_credentials([(made.key_pem, made.cert_pem)]))
                self.cert = made.cert_pem
            else:
                port = server.add_insecure_port(bind)
            await server.start()
        except Exception as e:  # noqa: BLE001 - the tree saves the coordinator work: each host sends its own then
            log.warning("the relay cannot take its group's pings on %s (%s); each host sends its own", bind, e)
            return ""
        self.address = f"{bind.rsplit(':', 1)[0]}:{port}"
        return self.address

    async def close(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=0.2)

    async def pings(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext):
        if self._expected:
            given = dict(context.invocation_metadata() or ()).get("authorization", "")
            if not hmac.compare_digest(str(given).encode(), self._expected.encode()):
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "the group's relay: missing or wrong job token")
        feed = Feed()

        async def read() -> None:
            try:
                async for raw in requests:
                    self._pinger.take(pb.PingBatch.FromString(raw), feed)
            finally:
                feed.replies.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (reply := await feed.replies.get()) is not None:
                yield reply.SerializeToString()
            reader.result()  # a batch that did not parse ends the stream with its error
        finally:
            reader.cancel()
            self._pinger.forget(feed)


def peer_channel(address: str, cert: bytes = b"") -> grpc.aio.Channel:
    """A channel to the group's host 0 relay at ``address``: over TLS trusting ``cert`` alone, by ``RELAY_NAME``
    (see the module's note), or plain gRPC without one."""
    if not cert:
        return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    return grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=cert),
                                   options=(*CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", RELAY_NAME)))
