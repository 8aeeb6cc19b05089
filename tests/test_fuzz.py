"""Fuzzing the coordinator's gRPC surface (hypothesis) against a real
coordinator process: generated messages of every request type, built from
the protobuf descriptors, and raw bytes to every method. Every answer must be
OK or a deliberate status code (never UNKNOWN or INTERNAL, which mean an
unhandled exception), a rejected call must leave the coordinator's state as
it was, and the coordinator must keep serving."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fthsdp.client import CoordinatorClient
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.processes import CoordinatorProcess
from tests.harness.waiting import wait_until

SERVICE = pb.DESCRIPTOR.services_by_name["Coordinator"]
DELIBERATE = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.PERMISSION_DENIED,  # Inject without a configured admin token: a deliberate refusal
}
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Strings near the real ones reach deeper than random text alone.
WORDS = st.sampled_from(["default", "r0", "r1", "", "../etc", "a" * 300, "r0\x00", "ünï", "127.0.0.1:1"])
TEXT = st.one_of(WORDS, st.text(max_size=80))
INTS = {
    FieldDescriptor.TYPE_INT64: st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-3, 200)),
    FieldDescriptor.TYPE_INT32: st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(-3, 8)),
    FieldDescriptor.TYPE_UINT64: st.integers(0, 2**64 - 1),
    FieldDescriptor.TYPE_UINT32: st.integers(0, 2**32 - 1),
}


def field_values(field: FieldDescriptor, depth: int) -> st.SearchStrategy:
    if field.type == FieldDescriptor.TYPE_STRING:
        return TEXT
    if field.type == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True,
                         width=32 if field.type == FieldDescriptor.TYPE_FLOAT else 64)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return st.integers(-5, 40)  # known values and unknown ones
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return messages(field.message_type, depth + 1) if depth < 2 else st.none()
    return INTS.get(field.type, st.integers(0, 100))


@st.composite
def messages(draw, descriptor, depth: int = 0):
    """Any message of ``descriptor``'s type, field by field."""
    cls = pb.__dict__.get(descriptor.name) or _message_class(descriptor)
    msg = cls()
    for field in descriptor.fields:
        if not draw(st.booleans()):
            continue
        values = field_values(field, depth)
        if field.is_repeated:
            items = [v for v in draw(st.lists(values, max_size=4)) if v is not None]
            target = getattr(msg, field.name)
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                for item in items:
                    target.add().CopyFrom(item)
            else:
                target.extend(items)
        else:
            value = draw(values)
            if value is None:
                continue
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                getattr(msg, field.name).CopyFrom(value)
            else:
                setattr(msg, field.name, value)
    return msg


def _message_class(descriptor):
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(descriptor)


def state(client: CoordinatorClient) -> tuple:
    """What a rejected call must not change (heartbeat ages move by themselves)."""
    s = client.status()
    return (
        s.quorum.id,
        tuple(m.replica_id for m in s.quorum.members),
        tuple(sorted((r.replica_id, r.state, r.step, r.cordoned, r.restart_count, r.agent_state) for r in s.replicas)),
    )


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    # Accepted calls (a registration) change the quorum at the next decision;
    # decided at once, so that no such change lands inside a later check.
    c = CoordinatorProcess(tmp, "--heartbeat-interval", "1s", "--heartbeat-timeout", "60s",
                           "--join-settle", "0", "--tick-interval", "1ms").start()
    channel = grpc.insecure_channel(c.address)
    with CoordinatorClient([c.address]) as client:
        reply = client.call("Register",
                            pb.RegisterRequest(job="default", replica_id="r0", address="127.0.0.1:1", world_size=1))
        # Admitted only once heard from (fthsdp/coordinator/decisions/quorum.py, rule 6).
        client.call("Heartbeat", pb.HeartbeatRequest(job="default", replica_id="r0", session_id=reply.session_id))
        # Settled before fuzzing: a quorum forming mid-check would read as a change.
        wait_until(lambda: client.status().quorum.member_count == 1, 20, message="r0's quorum")
        yield c, channel, client
    channel.close()
    c.stop()


def call(channel, method, payload: bytes, streaming: bool) -> grpc.StatusCode:
    path = f"/{SERVICE.full_name}/{method.name}"
    try:
        if method.client_streaming:  # HeartbeatStream: one message, then the answers until it ends
            list(channel.stream_stream(path)(iter([payload]), timeout=5))
            return grpc.StatusCode.OK
        if streaming:
            stream = channel.unary_stream(path)(payload, timeout=5)
            next(iter(stream), None)  # a valid Watch answers with an event at once; enough
            stream.cancel()
            return grpc.StatusCode.OK
        channel.unary_unary(path)(payload, timeout=5)
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.CANCELLED and streaming:
            return grpc.StatusCode.OK
        return e.code()


def check(target, method, payload: bytes) -> None:
    c, channel, client = target
    before = state(client)
    code = call(channel, method, payload, method.server_streaming)
    assert code in DELIBERATE, f"{method.name} answered {code.name} to {payload!r}"
    if code != grpc.StatusCode.OK:
        assert state(client) == before, f"a rejected {method.name} changed the coordinator's state"
    assert c.proc.poll() is None, "the coordinator died"


@pytest.mark.parametrize("method", list(SERVICE.methods), ids=lambda m: m.name)
def test_generated_messages_get_deliberate_answers(target, method):
    @FUZZ
    @given(msg=messages(method.input_type))
    def run(msg):
        check(target, method, msg.SerializeToString())

    run()


@pytest.mark.parametrize("method", list(SERVICE.methods), ids=lambda m: m.name)
def test_raw_bytes_get_deliberate_answers(target, method):
    @FUZZ
    @given(payload=st.binary(max_size=256))
    def run(payload):
        check(target, method, payload)

    run()
