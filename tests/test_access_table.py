"""Every call of the Coordinator service has one access class
(fthsdp/core/auth.py METHOD_ACCESS), and the one interceptor enforces it:
the service descriptor is walked, so that an RPC added without a class fails
here, and every admin call made with the job token alone, against a real
coordinator server, is refused before it acts."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.core.auth import ADMIN_METADATA, COORDINATOR_SERVICE, METHOD_ACCESS, Access, AccessInterceptor
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.inprocess import ADMIN_TOKEN, JOB_TOKEN, InProcessCoordinator


@pytest.fixture
def coordinator(tmp_path):
    """A coordinator with a job token and an admin token."""
    (tmp_path / "job-token").write_text(JOB_TOKEN + "\n")
    (tmp_path / "admin-token").write_text(ADMIN_TOKEN + "\n")
    c = InProcessCoordinator(CoordinatorConfig(bind="127.0.0.1:0", token_file=str(tmp_path / "job-token"),
                                               admin_token_file=str(tmp_path / "admin-token")))
    yield c
    c.close()


SERVICE = pb.DESCRIPTOR.services_by_name["Coordinator"]
ADMIN = sorted(name for name, access in METHOD_ACCESS.items() if access is Access.ADMIN)


def test_every_rpc_of_the_service_is_classified_and_nothing_else():
    assert SERVICE.full_name == COORDINATOR_SERVICE
    assert {m.name for m in SERVICE.methods} == set(METHOD_ACCESS)


def test_the_operator_calls_are_the_admin_ones():
    # A call that changes the job on an operator's word is admin; a replica's
    # own calls and the read-only ones are not.
    assert ADMIN == ["Cordon", "Drain", "GiveUpState", "Inject", "ReopenJob", "RestoreCheckpoint"]
    assert METHOD_ACCESS["Status"] is METHOD_ACCESS["Watch"] is Access.READ


def _unary(channel: grpc.Channel, name: str):
    method = SERVICE.methods_by_name[name]
    assert not method.client_streaming and not method.server_streaming, f"{name}: admin calls are unary"
    request_type = getattr(pb, method.input_type.name)
    response_type = getattr(pb, method.output_type.name)
    call = channel.unary_unary(f"/{COORDINATOR_SERVICE}/{name}", request_serializer=request_type.SerializeToString,
                               response_deserializer=response_type.FromString)
    return call, request_type


def _status(c: InProcessCoordinator) -> pb.StatusResponse:
    with grpc.insecure_channel(c.address) as channel:
        call = channel.unary_unary(f"/{COORDINATOR_SERVICE}/Status",
                                   request_serializer=pb.StatusRequest.SerializeToString,
                                   response_deserializer=pb.StatusResponse.FromString)
        return call(pb.StatusRequest(), metadata=(("authorization", f"Bearer {JOB_TOKEN}"),), timeout=10)


@pytest.mark.parametrize("name", ADMIN)
@pytest.mark.parametrize("admin_token, code", [
    ("", grpc.StatusCode.PERMISSION_DENIED),
    (JOB_TOKEN, grpc.StatusCode.UNAUTHENTICATED),
], ids=["job-token-alone", "job-token-as-admin-token"])
def test_every_admin_call_with_the_job_token_alone_is_refused(coordinator, name, admin_token, code):
    c = coordinator
    before = _status(c)
    metadata = [("authorization", f"Bearer {JOB_TOKEN}")]
    if admin_token:
        metadata.append((ADMIN_METADATA, admin_token))
    with grpc.insecure_channel(c.address) as channel:
        call, request_type = _unary(channel, name)
        with pytest.raises(grpc.RpcError) as refused:
            call(request_type(job="default"), metadata=metadata, timeout=10)
    assert refused.value.code() == code, refused.value.details()
    assert name in refused.value.details()
    after = _status(c)
    assert after.jobs == before.jobs and not after.injections


@pytest.mark.parametrize("name", ADMIN)
def test_every_admin_call_with_the_admin_token_passes_the_gate(coordinator, name):
    # Past the gate an empty request is the servicer's to refuse as bad
    # input (or to act on): never as a missing or wrong credential.
    c = coordinator
    metadata = [("authorization", f"Bearer {JOB_TOKEN}"), (ADMIN_METADATA, ADMIN_TOKEN)]
    with grpc.insecure_channel(c.address) as channel:
        call, request_type = _unary(channel, name)
        try:
            call(request_type(job="default"), metadata=metadata, timeout=10)
        except grpc.RpcError as e:
            assert e.code() not in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED), e.details()


class _Details:
    def __init__(self, method: str, metadata=()) -> None:
        self.method, self.invocation_metadata = method, metadata


class _Context:
    async def abort(self, code, message):
        raise RuntimeError(code, message)


def _intercept(method: str, metadata=()):
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: "acted")

    async def continuation(details):
        return handler

    async def run():
        chosen = await AccessInterceptor(JOB_TOKEN, ADMIN_TOKEN).intercept_service(continuation,
                                                                                     _Details(method, metadata))
        return await chosen.unary_unary(None, _Context()) if chosen is not handler else "acted"

    return asyncio.run(run())


def test_a_coordinator_call_without_an_access_class_is_refused():
    bearer = (("authorization", f"Bearer {JOB_TOKEN}"),)
    with pytest.raises(RuntimeError) as refused:
        _intercept(f"/{COORDINATOR_SERVICE}/NotInTheTable", bearer)
    assert refused.value.args[0] == grpc.StatusCode.PERMISSION_DENIED
    assert "no access class" in refused.value.args[1]
    assert _intercept(f"/{COORDINATOR_SERVICE}/Status", bearer) == "acted"
    assert _intercept("/grpc.health.v1.Health/Check") == "acted"
    with pytest.raises(RuntimeError) as refused:
        _intercept(f"/{COORDINATOR_SERVICE}/Status")
    assert refused.value.args[0] == grpc.StatusCode.UNAUTHENTICATED
