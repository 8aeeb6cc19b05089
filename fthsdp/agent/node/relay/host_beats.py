"""A host's heartbeats carried in its ping batches: one message per host per interval, not two (issue 50).

The agent's Host stream (fthsdp/agent/node/host_link.py) sends a heartbeat
whenever nothing else went out for the coordinator's interval, and its
ranks' pings go up as one batch per interval (fthsdp/agent/node/relay/pings.py).
Once the coordinator's welcome on the Host stream says that it takes a
host's heartbeats from the batches (``HostWelcome.beats_in_batches``), each
batch names the host (``PingBatch.hosts``), and the relay leaves out a
heartbeat of the Host stream when a batch named the host less than
``CARRIED_FOR`` intervals ago. The batches come at the ranks' interval, a
window late at most, so nearly every heartbeat is left out, and the host
is never silent past ``CARRIED_FOR`` intervals plus one, well inside the
heartbeat timeout (5 intervals by default). With no rank pinging (between
rounds, a spare) no batch goes and every heartbeat goes on the stream, as
before; a coordinator that does not say it takes them (an older one,
during an upgrade) gets every heartbeat.

On the relay's event loop only: no lock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from fthsdp.protos.v1 import coordinator_pb2 as pb

if TYPE_CHECKING:
    from fthsdp.agent.node.relay.tree import PeerServer, Route

CARRIED_FOR = 1.5
"""A heartbeat is left out while a batch named the host less than this many heartbeat intervals ago."""


class CarriedBeats:
    """The hosts this relay's batches speak for, and when a batch last named each."""

    def __init__(self) -> None:
        self._speaking: dict[str, tuple[str, object]] = {}
        """Host id -> (its job, the Host stream that asked): a newer stream of the host replaces an older one."""
        self._named_at: dict[str, float] = {}
        self.interval = 1.0
        """The heartbeat interval the coordinator gave the host, last (fthsdp/agent/node/host_link.py's start)."""

    def speak_for(self, job: str, host_id: str, stream: object) -> None:
        """The coordinator behind ``stream`` (a Host stream's own token) takes ``host_id``'s heartbeats from
        the batches."""
        self._speaking[host_id] = (job, stream)

    def stop(self, host_id: str, stream: object) -> None:
        """``stream`` ended: the batches stop naming the host (unless a newer stream of it asked since)."""
        if self._speaking.get(host_id, (None, None))[1] is stream:
            del self._speaking[host_id]
            self._named_at.pop(host_id, None)

    def name(self, batch: pb.PingBatch) -> list[str]:
        """Name in ``batch`` every host spoken for (a relay serves one job's agent); the hosts named. They
        count as carried once the batch went on (``sent``)."""
        for host_id, (job, _) in self._speaking.items():
            batch.job = job
            batch.hosts.append(host_id)
        return list(self._speaking)

    def sent(self, hosts: list[str], now: float) -> None:
        """A batch naming ``hosts`` went to the coordinator (or its group's host 0 passed it on) at ``now``."""
        for host_id in hosts:
            if host_id in self._speaking:
                self._named_at[host_id] = now

    def carried(self, host_id: str, now: float, interval: float) -> bool:
        """Whether a batch named ``host_id`` recently enough for its heartbeat at ``now`` to be left out."""
        named = self._named_at.get(host_id)
        return named is not None and now - named < CARRIED_FOR * interval


class HostStream:
    """One Host stream through the relay: its requests less the heartbeats a batch carried, its joins with
    where this relay takes its group's pings (``requests``); its pushes looked at for the welcome, the pace
    and the round, which says where the batches go (``pushed``); ``close()`` when it ends."""

    def __init__(self, beats: CarriedBeats, route: Route, peers: PeerServer | None,
                 clock: Callable[[], float]) -> None:
        self._beats = beats
        self._route_of = route
        self._peers = peers
        self._clock = clock
        self._hello: tuple[str, str] | None = None
        """(job, host id) of the hello: what a welcome lets the batches speak for."""
        self._interval = 0.0
        """The heartbeat interval the coordinator gave the host (0: none yet: nothing is left out)."""
        self._pings = ""
        """Where this relay takes its group's pings (fthsdp/agent/node/relay/tree.py); '': it does not."""
        self._routed = False
        self.left_out = 0
        """Heartbeats left out so far."""

    async def requests(self, raw_requests: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for raw in raw_requests:
            request = _parsed(raw)
            if request is not None:
                which = request.WhichOneof("message")
                if which == "hello":
                    self._hello = (request.hello.job, request.hello.host_id)
                    if self._peers is not None:
                        self._pings = await self._peers.listen(request.hello.address)
                elif (which == "heartbeat" and self._hello is not None
                      and self._beats.carried(self._hello[1], self._clock(), self._interval)):
                    self.left_out += 1
                    continue  # a batch named the host within the last interval or so
                elif which == "join" and self._pings and not request.join.pings:
                    request.join.pings = self._pings
                    request.join.pings_cert = self._peers.cert if self._peers is not None else b""
                    raw = request.SerializeToString()
            yield raw

    def pushed(self, raw: bytes) -> None:
        """A push down the stream: a welcome that says the coordinator takes heartbeats from batches starts
        them (every welcome says it again, after each reconnect); the pace is followed; a complete round
        says where the batches go, until it ends."""
        if self._hello is None:
            return
        push = _parsed_push(raw)
        if push is None:
            return
        which = push.WhichOneof("message")
        if which == "welcome":
            self._interval = push.welcome.heartbeat_interval
            if self._interval > 0:
                self._beats.interval = self._interval
            if push.welcome.beats_in_batches:
                self._beats.speak_for(*self._hello, stream=self)
        elif which == "heartbeat_interval":
            self._interval = self._beats.interval = push.heartbeat_interval
        elif which == "complete":
            complete = push.complete
            first = complete.hosts[0] if complete.hosts else ""
            if complete.node_rank > 0:
                self._route(complete.pings, first, complete.pings_cert)
            else:
                self._route("", first)
        elif which in ("ended", "gave_up", "released", "refused"):
            self._route("")

    def _route(self, aggregator: str, host_id: str = "", cert: bytes = b"") -> None:
        self._route_of.to(aggregator, host_id, cert)
        self._routed = bool(aggregator)

    def close(self) -> None:
        if self._hello is not None:
            self._beats.stop(self._hello[1], self)
        if self._routed:
            self._route("")


def _parsed(raw: bytes) -> pb.HostRequest | None:
    try:
        return pb.HostRequest.FromString(raw)
    except Exception:  # noqa: BLE001 - not the relay's to judge: the coordinator answers
        return None


def _parsed_push(raw: bytes) -> pb.HostPush | None:
    try:
        return pb.HostPush.FromString(raw)
    except Exception:  # noqa: BLE001 - passed on as it is
        return None
