"""The Session call (Register, heartbeats and Watch on one stream) against a
real coordinator process: a replica registers, is admitted with its place,
its heartbeats are answered, and its stream closing fails it as Watch's does."""

from __future__ import annotations

import queue

import grpc
import pytest

from fthsdp.client import CoordinatorClient
from fthsdp.protos.v1 import coordinator_pb2 as pb
from fthsdp.protos.v1 import coordinator_pb2_grpc as pb_grpc
from tests.harness.processes import CoordinatorProcess
from tests.harness.waiting import wait_until


@pytest.fixture
def coordinator(tmp_path):
    proc = CoordinatorProcess(tmp_path, "--min-replicas", "2", "--heartbeat-timeout", "60s").start()
    yield proc
    proc.stop()


class Session:
    """One replica's Session stream, fed from a queue."""

    def __init__(self, address: str, replica_id: str, first: pb.SessionRequest | None = None) -> None:
        self.channel = grpc.insecure_channel(address)
        self.outbox: queue.Queue = queue.Queue()
        self.outbox.put(first or pb.SessionRequest(register=pb.RegisterRequest(
            job="default", replica_id=replica_id, address="127.0.0.1:1", world_size=1)))
        self.stream = pb_grpc.CoordinatorStub(self.channel).Session(iter(self.outbox.get, None), timeout=60)

    def next(self, kind: str) -> pb.SessionEvent:
        """The next event carrying ``kind``, skipping the others."""
        for event in self.stream:
            if event.WhichOneof("message") == kind:
                return event
        raise AssertionError(f"the session ended before a {kind!r} event")

    def close(self) -> None:
        self.stream.cancel()
        self.channel.close()


def test_a_session_registers_is_admitted_and_heartbeats(coordinator):
    a, b = Session(coordinator.address, "a"), Session(coordinator.address, "b")
    try:
        assert a.next("registered").registered.session_id
        assert b.next("registered").registered.session_id
        for s in (a, b):  # no replica is admitted before its first heartbeat
            s.outbox.put(pb.SessionRequest(heartbeat=pb.HeartbeatRequest(step=0)))
        places = {}
        for name, s in (("a", a), ("b", b)):
            while not (event := s.next("watch").watch).HasField("place"):
                pass
            assert event.quorum.member_count == 2 and not event.quorum.members
            places[name] = event.place.rank
        assert places == {"a": 0, "b": 1}
        a.outbox.put(pb.SessionRequest(heartbeat=pb.HeartbeatRequest(step=3, ack=True)))
        assert a.next("ack").ack.quorum_id == event.quorum.id
        # The stream closing is the replica failing (as Watch's does).
        a.close()
        with CoordinatorClient([coordinator.address]) as client:
            wait_until(lambda: {r.replica_id: r.state for r in client.status("").replicas}
                       == {"a": pb.REPLICA_STATE_FAILED, "b": pb.REPLICA_STATE_HEALTHY}, 10,
                       message="a failed once its session closed")
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize(
    "first, message",
    [
        (pb.SessionRequest(heartbeat=pb.HeartbeatRequest(step=1)), "starts with a register request"),
        (pb.SessionRequest(register=pb.RegisterRequest(job="default", replica_id="x", world_size=1)),
         "address is empty"),
    ],
    ids=["heartbeat first", "bad registration"],
)
def test_a_bad_session_is_refused_and_registers_nothing(coordinator, first, message):
    s = Session(coordinator.address, "x", first)
    try:
        with pytest.raises(grpc.RpcError) as info:
            s.next("registered")
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in info.value.details()
    finally:
        s.close()
    with CoordinatorClient([coordinator.address]) as client:
        assert not client.status("").replicas


def test_heartbeats_of_another_replica_end_the_session(coordinator):
    s = Session(coordinator.address, "a")
    try:
        s.next("registered")
        s.outbox.put(pb.SessionRequest(heartbeat=pb.HeartbeatRequest(replica_id="b")))
        with pytest.raises(grpc.RpcError) as info:
            s.next("ack")
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "replica 'a'" in info.value.details()
    finally:
        s.close()
    with CoordinatorClient([coordinator.address]) as client:
        wait_until(lambda: [r.state for r in client.status("").replicas] == [pb.REPLICA_STATE_FAILED], 10,
                   message="the replica whose session ended is failed")
