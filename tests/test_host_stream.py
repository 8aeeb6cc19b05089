"""The Host stream of a real coordinator process (fthsdp/coordinator/hosts/stream.py),
driven from the test as two hosts' agents would: the round's pushes, a
failure ending it for both, status showing the group, a stream that closes
counting as a lost host, a rank of an ended round refused at registration,
and hellos refused with one line: another shape than the group's, another
agent's host id, a round that jumps."""

from __future__ import annotations

import queue
import threading

import grpc
import pytest

from fthsdp.client import CoordinatorClient
from fthsdp.protos.v1 import coordinator_pb2 as pb
from fthsdp.protos.v1 import coordinator_pb2_grpc as pb_grpc
from tests.harness.processes import CoordinatorProcess
from tests.harness.waiting import wait_until


class HostStream:
    """One host's Host call: ``send`` a request, ``next`` push (with a deadline)."""

    def __init__(self, channel: grpc.Channel, host_id: str, nnodes: int = 2, **hello) -> None:
        self.outbox: queue.Queue = queue.Queue()
        self.pushes: queue.Queue = queue.Queue()
        self.outbox.put(pb.HostRequest(hello=pb.HostHello(host_id=host_id, replica_id="r1", replica_rank=1,
                                                          num_replicas=2, nnodes=nnodes, nproc=1, **hello)))
        self.call = pb_grpc.CoordinatorStub(channel).Host(iter(self.outbox.get, None))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for push in self.call:
                self.pushes.put(push)
        except grpc.RpcError as e:
            self.pushes.put(e)

    def send(self, **message) -> None:
        self.outbox.put(pb.HostRequest(**message))

    def next(self, kind: str) -> object:
        while True:
            push = self.pushes.get(timeout=10)
            if isinstance(push, Exception):
                raise push
            if push.WhichOneof("message") == kind:
                return getattr(push, kind)

    def close(self) -> None:
        self.outbox.put(None)


@pytest.fixture
def coordinator(tmp_path):
    c = CoordinatorProcess(tmp_path, "--heartbeat-interval", "200ms", "--heartbeat-timeout", "2s").start()
    channel = grpc.insecure_channel(c.address)
    yield c, channel
    channel.close()
    c.stop()


def register(channel: grpc.Channel, restart_count: int) -> pb.RegisterResponse:
    return pb_grpc.CoordinatorStub(channel).Register(pb.RegisterRequest(
        replica_id="r1", address="127.0.0.1:1", world_size=2, restart_count=restart_count), timeout=10)


def test_rounds_over_the_host_stream_and_a_rank_of_an_ended_round_is_refused(coordinator):
    c, channel = coordinator
    a, b = HostStream(channel, "a"), HostStream(channel, "b")
    assert a.next("welcome").round == 1 and b.next("welcome").heartbeat_interval == pytest.approx(0.2)
    a.send(join=pb.HostJoin(round=1, store="10.0.0.1:7001"))
    b.send(join=pb.HostJoin(round=1, store="10.0.0.2:7001"))
    done_a, done_b = a.next("complete"), b.next("complete")
    assert (done_a.node_rank, done_b.node_rank, done_b.store) == (0, 1, "10.0.0.1:7001")
    register(channel, 0)  # round 1's ranks (restart count 0) register

    b.send(failure=pb.HostFailure(round=1, reason="local rank 0 exited with signal SIGKILL"))
    assert "it reported a failure" in a.next("ended").reason and b.next("ended").round == 1
    with pytest.raises(grpc.RpcError) as refused:
        register(channel, 0)  # a rank of round 1, still alive somewhere
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "a rank of round 1 (restart count 0) may not register: that round ended" in refused.value.details()
    register(channel, 1)  # round 2's ranks may

    a.send(join=pb.HostJoin(round=2, store="10.0.0.1:7002"))
    assert a.next("joined") == 2
    b.close()  # its agent is gone: the host is lost at once
    with CoordinatorClient([c.address]) as client:
        def b_lost() -> bool:
            (group,) = client.status("").groups
            return {h.host_id: h.state for h in group.hosts} == {"a": "joined", "b": "lost"}

        wait_until(b_lost, 10, message="b lost in status")
        (group,) = client.status("").groups
        assert (group.replica_id, group.round, group.complete, group.nnodes) == ("r1", 2, False, 2)
        assert "waiting for node rank 1: host b lost" in group.reason
    a.close()


def test_a_hello_that_would_form_the_group_wrong_is_refused_with_one_line(coordinator):
    c, channel = coordinator
    a, b = HostStream(channel, "a"), HostStream(channel, "b")
    a.send(join=pb.HostJoin(round=1, store="10.0.0.1:7001"))
    b.send(join=pb.HostJoin(round=1, store="10.0.0.2:7001"))
    a.next("complete")  # round 1 completed with --nnodes 2: the group's from now on
    c3 = HostStream(channel, "c", nnodes=3)
    says = "host c: --nnodes 3, but group r1 runs with --nnodes 2 (since its round 1 completed)"
    assert c3.next("refused").startswith(says)
    wait_until(lambda: says in c.log_path.read_text(), 10, message="the refusal in the coordinator's log")
    assert c.log_path.read_text().count(says) == 1, "one line"
    a.close()
    b.close()


def test_another_agent_with_a_live_hosts_id_or_a_round_that_jumps_is_refused_and_the_host_goes_on(coordinator):
    """PERMISSION_DENIED for someone else's host id (naming where the first is and --host-id),
    FAILED_PRECONDITION for a round the group cannot be in; the real hosts' round is untouched."""
    c, channel = coordinator
    a = HostStream(channel, "a", incarnation="agent-a", address="10.0.0.1")
    b = HostStream(channel, "b", incarnation="agent-b", address="10.0.0.2")
    a.send(join=pb.HostJoin(round=1, store="10.0.0.1:7001"))
    b.send(join=pb.HostJoin(round=1, store="10.0.0.2:7001"))
    assert a.next("complete").round == 1 and b.next("complete").round == 1
    twin = HostStream(channel, "b", incarnation="another-agent", address="10.0.0.9")
    with pytest.raises(grpc.RpcError) as refused:
        twin.next("welcome")
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "host id 'b' is taken: another agent with this host id is connected (from 10.0.0.2" in \
        refused.value.details() and "give each agent its own --host-id" in refused.value.details()
    jump = HostStream(channel, "a", incarnation="agent-a", round=2**31 - 1)
    with pytest.raises(grpc.RpcError) as refused:
        jump.next("welcome")
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "host a says it is in round 2147483647 of group r1, which is in round 1" in refused.value.details()
    with CoordinatorClient([c.address]) as client:
        (group,) = client.status("").groups
        assert (group.round, group.complete) == (1, True) and {h.state for h in group.hosts} == {"running"}
    b.send(failure=pb.HostFailure(round=1, reason="local rank 0 exited with signal SIGKILL"))
    assert a.next("ended").round == 1 and b.next("ended").round == 1, "b's own stream is still b's"
    a.close()
    b.close()
