"""A host's heartbeats carried in its ping batches (fthsdp/agent/node/relay/host_beats.py, issue 50).

In process: the host table counts a host whose beats come in batches as no
heartbeat sender of its own, keeps it alive by them, and takes them only
for a host whose stream is open; the relay's bookkeeping leaves a
heartbeat out only while a batch named the host within the last interval
and a half, and a Host stream that ended does not stop a newer one's.
Against a real coordinator on port 0, through a real relay: while a rank
pings, the host's Host stream sends (almost) no heartbeats and the host
stays alive; once the rank stops, its heartbeats go on the stream again,
and it is alive past twice the heartbeat timeout.
"""

from __future__ import annotations

import queue
import threading

from fthsdp.agent.node.host_link import HostLink
from fthsdp.agent.node.relay.host_beats import CarriedBeats
from fthsdp.agent.node.relay.server import LocalRelay
from fthsdp.client import CoordinatorClient
from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.hosts import TIMEOUT, Hosts, running
from tests.harness.inprocess import JOB_TOKEN, InProcessCoordinator
from tests.harness.waiting import wait_until
from tests.test_agent_relay import Pinging

DEADLINE = 30.0


def test_a_host_whose_beats_come_in_batches_is_no_sender_of_its_own_and_stays_alive_by_them():
    h = Hosts()
    running(h)  # a and b, in round 1
    assert (h.table.streams, h.table.carried) == (2, 0)
    h.table.beat("a", 60.0, carried=True)
    assert h.table.carried == 1
    h.table.tick(TIMEOUT + 30.0, TIMEOUT)  # b was last heard at 0, a at 60 (in a batch)
    assert h.table.hosts["a"].alive and not h.table.hosts["b"].alive
    h.table.beat("a", 140.0)  # a heartbeat on its stream: it is a sender of its own again
    assert h.table.carried == 0
    h.table.beat("a", 150.0, carried=True)
    h.table.closed("a", h.connection["a"], 160.0)
    assert (h.table.streams, h.table.carried) == (0, 0)


def test_a_batch_does_not_speak_for_a_host_without_an_open_stream():
    h = Hosts()
    h.table.beat("nobody", 1.0, carried=True)  # unknown: nothing happens
    running(h)
    h.table.closed("b", h.connection["b"], 1.0)
    h.table.beat("b", 2.0, carried=True)
    assert h.table.carried == 0 and not h.table.hosts["b"].alive


def test_a_heartbeat_is_left_out_only_while_a_batch_named_the_host_within_an_interval_and_a_half():
    beats, stream, newer = CarriedBeats(), object(), object()
    batch = pb.PingBatch()
    beats.sent(beats.name(batch), 10.0)
    assert list(batch.hosts) == [] and not beats.carried("a", 10.5, 1.0)  # nobody spoken for yet
    beats.speak_for("job", "a", stream)
    batch = pb.PingBatch()
    named = beats.name(batch)
    assert (batch.job, list(batch.hosts)) == ("job", ["a"])
    assert not beats.carried("a", 10.5, 1.0)  # named, not sent yet (to a group's host 0: not passed on yet)
    beats.sent(named, 10.0)
    assert beats.carried("a", 11.4, 1.0) and not beats.carried("a", 11.6, 1.0)
    beats.speak_for("job", "a", newer)  # the host's stream reopened: the old one's end changes nothing
    beats.stop("a", stream)
    assert beats.carried("a", 11.0, 1.0)
    beats.stop("a", newer)
    assert not beats.carried("a", 11.0, 1.0)


class Beats:
    """The host table's beats of ``job``, recorded as they come: (host id, carried)."""

    def __init__(self, table) -> None:
        self.seen: list[tuple[str, bool]] = []
        original = table.beat

        def beat(host_id: str, now: float, carried: bool = False) -> None:
            self.seen.append((host_id, carried))
            original(host_id, now, carried)

        table.beat = beat

    def count(self, carried: bool) -> int:
        return sum(1 for _, c in list(self.seen) if c is carried)


def test_through_the_relay_a_pinging_hosts_heartbeats_go_in_its_batches_and_on_its_stream_once_they_stop(tmp_path):
    token = tmp_path / "token"
    token.write_text(JOB_TOKEN)
    coordinator = InProcessCoordinator(CoordinatorConfig(bind="127.0.0.1:0", min_replicas=1, join_settle=0.0,
                                                         token_file=str(token), heartbeat_interval=0.2,
                                                         heartbeat_timeout=1.5))
    job = coordinator.running.runtime.job("default")
    beats = Beats(job.hosts)
    stop = threading.Event()
    try:
        with LocalRelay([coordinator.address], JOB_TOKEN, None) as relay:
            with CoordinatorClient([relay.address], token=JOB_TOKEN) as client:
                client.call("Register", pb.RegisterRequest(job="default", replica_id="r0", address="r0:1",
                                                           world_size=2, agent_ids=["agent-a"], incarnation="inc-1"))

            def hello() -> pb.HostHello:
                return pb.HostHello(job="default", host_id="a", replica_id="r1", replica_rank=1, num_replicas=2,
                                    nnodes=2, nproc=1, incarnation="agent-a", address="127.0.0.1")

            link = HostLink([relay.address], JOB_TOKEN, None, hello, queue.Queue())
            rank = Pinging(relay, shard_rank=1)

            def keep_pinging() -> None:  # the rank's own ping loop, at the coordinator's interval
                while not stop.wait(0.2):
                    rank.send()

            pinging = threading.Thread(target=keep_pinging, daemon=True)
            pinging.start()
            try:
                wait_until(lambda: beats.count(True) >= 15, DEADLINE, message="15 of the host's beats in batches")
                own = beats.count(False)
                carried = beats.count(True)
                wait_until(lambda: beats.count(True) >= carried + 15, DEADLINE, message="15 more in batches")
                # While the batches carry it, its stream's own heartbeats are (nearly all) left out: at the
                # same interval, without the relay, there would be one for each batch.
                assert beats.count(False) - own <= 3, beats.seen[-40:]
                assert job.ping_streams == 1
                assert job.hosts.hosts["a"].alive
            finally:
                stop.set()
                pinging.join()
                rank.close()
            own = beats.count(False)
            wait_until(lambda: beats.count(False) >= own + 15, DEADLINE,
                       message="the host's heartbeats on its stream again, once no batch carries them")
            assert job.hosts.carried == 0 and job.hosts.hosts["a"].alive  # 3 s on: twice the timeout
            link.close()
    finally:
        coordinator.close()
