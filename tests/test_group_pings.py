"""A group's pings as one batch: its host 0's relay speaks for its other hosts
(fthsdp/agent/node/relay/tree.py, issue 50).

Against a real coordinator on port 0, two real relays (hosts a and b of
one group, 2 ranks each) with their Host streams: once the round is
complete, b's relay sends its batches to a's, and the coordinator takes
the group's pings and both hosts' heartbeats on one Pings stream; a ping
of b's that the coordinator refuses goes back to b's rank through a. When
a stops passing b's batches on (a hiccup: its stream stays open), b sends
its own to the coordinator within the wait, and neither b nor the group
is lost meanwhile. The same under TLS: a's relay serves b's batches with
a certificate of its own that b pins, as the coordinator passed it on.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import grpc
import pytest

from fthsdp.agent.node.host_link import HostLink
from fthsdp.agent.node.relay.server import LocalRelay
from fthsdp.client import CoordinatorClient
from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.core.credentials import TlsFiles
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.inprocess import JOB_TOKEN, InProcessCoordinator
from tests.harness.tls_certs import make_certificates
from tests.harness.waiting import wait_until
from tests.test_agent_relay import Pinging
from tests.test_host_beats import Beats

DEADLINE = 30.0
INTERVAL = 0.3


@pytest.fixture(params=["plain", "tls"])
def tls(request, tmp_path) -> TlsFiles | None:
    """The agents' TLS files (mutual TLS with the coordinator), or None for plain gRPC."""
    if request.param == "plain":
        return None
    certs = make_certificates(tmp_path / "certs")
    return TlsFiles(str(certs / "ca.pem"), str(certs / "node.pem"), str(certs / "node.key"))


@pytest.fixture
def coordinator(tmp_path, tls):
    token = tmp_path / "token"
    token.write_text(JOB_TOKEN)
    served = {}
    if tls is not None:
        certs = Path(tls.ca).parent
        served = {"tls_cert": str(certs / "server.pem"), "tls_key": str(certs / "server.key"), "tls_ca": tls.ca}
    c = InProcessCoordinator(CoordinatorConfig(bind="127.0.0.1:0", min_replicas=1, join_settle=0.0,
                                               token_file=str(token), heartbeat_interval=INTERVAL,
                                               heartbeat_timeout=3.0, **served))
    yield c
    c.close()


class GroupHost:
    """One host of group r1 (2 hosts of 2 ranks): its relay, its Host stream, its ranks pinging."""

    def __init__(self, host_id: str, ranks: tuple[int, ...], tls: TlsFiles | None) -> None:
        self.host_id = host_id
        self.relay = LocalRelay([COORDINATOR[0]], JOB_TOKEN, tls).start()
        self.pushes: queue.Queue = queue.Queue()
        self.link = HostLink([self.relay.address], JOB_TOKEN, None, self.hello, self.pushes)
        self.ranks = [Pinging(self.relay, replica_id="r1", shard_rank=k) for k in ranks]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._ping, daemon=True)
        self.thread.start()

    def hello(self) -> pb.HostHello:
        return pb.HostHello(job="default", host_id=self.host_id, replica_id="r1", replica_rank=0, num_replicas=1,
                            nnodes=2, nproc=2, incarnation=f"agent-{self.host_id}", address="127.0.0.1")

    def _ping(self) -> None:  # the ranks' own ping loops, at the coordinator's interval
        while not self.stop.wait(INTERVAL):
            for rank in self.ranks:
                rank.send(step=1)

    def next_push(self, kind: str) -> pb.HostPush:
        while True:
            push = self.pushes.get(timeout=DEADLINE)
            if push.WhichOneof("message") == kind:
                return push

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for rank in self.ranks:
            rank.close()
        self.link.close()
        self.relay.close()


COORDINATOR: list[str] = []


def test_the_groups_pings_go_as_one_batch_through_its_host_0_and_a_host_goes_direct_when_host_0_hiccups(
        coordinator, tls):
    COORDINATOR[:] = [coordinator.address]
    runtime = coordinator.running.runtime
    job = runtime.job("default")
    with CoordinatorClient([coordinator.address], token=JOB_TOKEN, tls=tls) as client:
        client.call("Register", pb.RegisterRequest(job="default", replica_id="r1", address="r1:1", world_size=4,
                                                   agent_ids=[f"agent-{h}" for h in ("a", "b", "localhost", "node")],
                                                   incarnation="inc-1"))
    # Under TLS a host's certificate must name its host id: the test certificate names these two.
    first, second = ("a", "b") if tls is None else ("localhost", "node")
    a, b = GroupHost(first, (1,), tls), GroupHost(second, (2, 3), tls)
    try:
        for host in (a, b):
            welcome = host.next_push("welcome").welcome
            store = f"127.0.0.1:{7000 + ord(host.host_id[0])}"
            host.link.send(pb.HostRequest(join=pb.HostJoin(round=welcome.round, store=store)))
        complete = {host.host_id: host.next_push("complete").complete for host in (a, b)}
        assert complete[first].node_rank == 0 and complete[second].node_rank == 1
        assert complete[second].pings == a.relay.peers.address != "", "host 0's relay, as its join named it"
        if tls is None:
            assert complete[second].pings_cert == b"" == a.relay.peers.cert
        else:  # the certificate a's relay made, passed on by the coordinator for b to pin
            assert complete[second].pings_cert == a.relay.peers.cert != b""
            assert b"BEGIN CERTIFICATE" in complete[second].pings_cert

        entry = job.state.replicas["r1"]
        beats = Beats(job.hosts)
        wait_until(lambda: job.ping_streams == 1 and job.hosts.carried == 2, DEADLINE,
                   message="one Pings stream to the coordinator, carrying both hosts' heartbeats")
        heard = dict(entry.incarnation.rank_heartbeats)
        wait_until(lambda: all(entry.incarnation.rank_heartbeats.get(k, 0) > heard.get(k, 0) for k in (1, 2, 3)),
                   DEADLINE, message="every rank's ping recorded, b's passed on by a")
        assert b.relay.pinger.route.target(0.0) == a.relay.peers.address
        assert a.relay.pinger.digests > 0 and b.relay.pinger.digests == 0, "columns to the coordinator only"
        carried = beats.count(True)
        wait_until(lambda: beats.count(True) >= carried + 10, DEADLINE, message="10 more carried beats")
        assert job.ping_streams == 1 and job.hosts.carried == 2

        # A ping of b's the coordinator refuses goes back to b's rank, through a.
        stale = Pinging(b.relay, replica_id="r1", shard_rank=3, incarnation="inc-0")
        stale.send(step=1)
        wait_until(lambda: stale.ended is not None, DEADLINE, message="the stale rank's stream ended")
        assert stale.ended in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION), stale.details
        stale.close()

        # a hiccups: its streams stay open, but it passes nothing of b's on. b goes to the coordinator itself.
        a.relay.pinger.take = lambda batch, feed: None
        wait_until(lambda: job.ping_streams == 2, DEADLINE, message="b's relay sends its own batches")
        heard = dict(entry.incarnation.rank_heartbeats)
        wait_until(lambda: all(entry.incarnation.rank_heartbeats.get(k, 0) > heard[k] for k in (2, 3)), DEADLINE,
                   message="b's ranks' pings recorded again, sent directly")
        assert job.hosts.hosts[second].alive and job.hosts.hosts[first].alive
        assert "r1" in job.state.replicas and entry.incarnation.failed_at is None
        assert not b.relay.pinger.route.target(b.relay._loop.time())  # for a while: FALLBACK_FOR
        assert b.relay.pinger.digests > 0, "b's ranks in columns, now that b speaks to the coordinator"
    finally:
        for host in (a, b):
            host.close()
