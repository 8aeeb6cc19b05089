"""Malformed requests get a clear status code and change nothing; the
coordinator stays up."""

from __future__ import annotations

import grpc
import pytest

from fthsdp.protos.v1 import coordinator_pb2 as pb
from fthsdp.protos.v1 import coordinator_pb2_grpc as pb_grpc
from tests.harness.processes import CoordinatorProcess

INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def address(tmp_path_factory):
    proc = CoordinatorProcess(tmp_path_factory.mktemp("bad-input"), "--job", "main").start()
    yield proc.address
    proc.stop()


@pytest.fixture(scope="module")
def stub(address):
    channel = grpc.insecure_channel(address)
    yield pb_grpc.CoordinatorStub(channel)
    channel.close()


def register(**fields) -> pb.RegisterRequest:
    base = {"job": "main", "replica_id": "r0", "address": "127.0.0.1:5000", "world_size": 1, "step": 0}
    base.update(fields)
    return pb.RegisterRequest(**base)


def code_of(call, request) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=5)
    return info.value.code(), info.value.details()


@pytest.mark.parametrize(
    "request_, code, words",
    [
        (register(job="nope"), INVALID, "unknown job 'nope'"),
        (register(job="a/b"), INVALID, "may contain only"),
        (register(replica_id=""), INVALID, "replica_id is empty"),
        (register(replica_id="x" * 129), INVALID, "the limit is 128"),
        (register(replica_id="../etc"), INVALID, "may contain only"),
        (register(replica_id="r/0"), INVALID, "may contain only"),
        (register(step=-1), INVALID, "step must not be negative"),
        (register(quorum_id=-5), INVALID, "quorum_id must not be negative"),
        (register(world_size=0), INVALID, "world_size must be between"),
        (register(address=""), INVALID, "address is empty"),
        (register(address="nohostport"), INVALID, "is not HOST:PORT"),
        (register(address="h:99999"), INVALID, "out of range"),
        (register(address="h:1" + "0" * 70_000), INVALID, "the limit is 65536"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_register_rejects(stub, request_, code, words):
    got, details = code_of(stub.Register, request_)
    assert got == code and words in details


def test_heartbeat_rules(stub):
    code, details = code_of(stub.Heartbeat, pb.HeartbeatRequest(job="main", replica_id="ghost", session_id="s"))
    assert code == grpc.StatusCode.NOT_FOUND and "register first" in details
    first = stub.Register(register(replica_id="hb"), timeout=5).session_id
    second = stub.Register(register(replica_id="hb"), timeout=5).session_id
    code, details = code_of(stub.Heartbeat, pb.HeartbeatRequest(job="main", replica_id="hb", session_id=first))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "replaced by a newer registration" in details
    code, _ = code_of(stub.Heartbeat, pb.HeartbeatRequest(job="main", replica_id="hb", session_id=second, step=-3))
    assert code == INVALID
    code, _ = code_of(stub.Heartbeat, pb.HeartbeatRequest(job="main", replica_id="hb", session_id=""))
    assert code == INVALID
    ok = stub.Heartbeat(pb.HeartbeatRequest(job="main", replica_id="hb", session_id=second, step=4), timeout=5)
    assert ok.quorum_id >= 0
    status = stub.Status(pb.StatusRequest(job="main"), timeout=5)
    assert [r.step for r in status.replicas if r.replica_id == "hb"] == [4]


def test_watch_with_a_bad_session_is_refused(stub):
    with pytest.raises(grpc.RpcError) as info:
        next(stub.Watch(pb.WatchRequest(job="main", replica_id="ghost", session_id="x"), timeout=5))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as info:
        next(stub.Watch(pb.WatchRequest(job="zzz"), timeout=5))
    assert info.value.code() == INVALID


def test_admin_on_unknown_replica(stub):
    code, details = code_of(stub.Drain, pb.DrainRequest(job="main", replica_id="nobody"))
    assert code == grpc.StatusCode.NOT_FOUND and "no replica 'nobody'" in details
    code, _ = code_of(stub.Cordon, pb.CordonRequest(job="main", replica_id=""))
    assert code == INVALID


def test_give_up_state_checks_its_fields_and_refuses_a_state_not_lost(stub):
    for request, words in (
        (pb.GiveUpStateRequest(job="main", step=0), "step must be the step whose state is lost"),
        (pb.GiveUpStateRequest(job="main", step=-4), "step must be the step whose state is lost"),
        (pb.GiveUpStateRequest(job="main", step=4, resume_step=4),
         "resume_step (resuming from a checkpoint) is not implemented"),
        (pb.GiveUpStateRequest(job="main", step=4, requested_by="x" * 200), "the limit is 128"),
        (pb.GiveUpStateRequest(job="nope", step=4), "unknown job 'nope'"),
    ):
        code, details = code_of(stub.GiveUpState, request)
        assert code == INVALID and words in details, (request, details)
    code, details = code_of(stub.GiveUpState, pb.GiveUpStateRequest(job="main", step=4))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "has not lost its state" in details


def test_transport_limit_and_garbage(stub):
    # Above the transport limit gRPC itself refuses the message.
    code, _ = code_of(stub.Register, register(address="h:1" + "0" * (5 << 20)))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_raw_garbage_bytes_are_refused_and_the_server_lives(stub, address):
    with grpc.insecure_channel(address) as channel:
        raw = channel.unary_unary("/fthsdp.v1.Coordinator/Register")
        with pytest.raises(grpc.RpcError) as info:
            raw(b"\xff\xff\xff\xff garbage", timeout=5)
    assert info.value.code() == INVALID and "not a valid Register message" in info.value.details()
    assert stub.Status(pb.StatusRequest(job="main"), timeout=5).job == "main"
