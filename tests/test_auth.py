"""The job's bearer token, against a real coordinator process: every call
without it is refused with UNAUTHENTICATED and changes nothing; probes need
none; an agent, its ranks and their catch-up all present it."""

from __future__ import annotations

import os
import signal

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fthsdp.client import CoordinatorClient
from fthsdp.core.errors import RequestRejected
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.cli import fthsdp, one_line_error
from tests.harness.ending import end_started
from tests.harness.processes import AgentProcess, CoordinatorProcess

TOKEN = "s3cret-token-0123456789"


@pytest.fixture
def secured(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")  # a trailing newline, as editors and Secrets leave it
    c = CoordinatorProcess(tmp_path, "--token-file", str(path), "--heartbeat-interval", "200ms",
                           "--heartbeat-timeout", "2s").start()
    yield c, path
    c.stop()


def intruder_calls(session: str):
    yield "Status", pb.StatusRequest()
    yield "Register", pb.RegisterRequest(job="default", replica_id="intruder", address="127.0.0.1:1", world_size=1)
    yield "Drain", pb.DrainRequest(job="default", replica_id="r0")
    yield "Cordon", pb.CordonRequest(job="default", replica_id="r0", cordoned=True)
    yield "GiveUpState", pb.GiveUpStateRequest(job="default", step=1)
    yield "Heartbeat", pb.HeartbeatRequest(job="default", replica_id="r0", session_id=session, step=99)
    yield "Leave", pb.LeaveRequest(job="default", replica_id="r0", session_id=session, reason="intruder")


@pytest.mark.parametrize("presented", ["", "wrong-token"], ids=["missing", "wrong"])
def test_calls_without_the_token_are_refused_and_change_nothing(secured, presented):
    c, _ = secured
    with CoordinatorClient([c.address], token=TOKEN) as good:
        session = good.call(
            "Register", pb.RegisterRequest(job="default", replica_id="r0", address="127.0.0.1:1", world_size=1)
        ).session_id
        before = good.status()
        with CoordinatorClient([c.address], token=presented) as bad:
            for method, request in intruder_calls(session):
                with pytest.raises(RequestRejected) as refused:
                    bad.call(method, request)
                assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED, method
                assert ("missing" if not presented else "wrong") in str(refused.value), method
            stream = bad.stub(c.address).Watch(pb.WatchRequest(job="default"), metadata=bad.metadata, timeout=5)
            with pytest.raises(grpc.RpcError) as refused:
                next(iter(stream))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        after = good.status()
    replicas = {r.replica_id: r for r in after.replicas}
    assert set(replicas) == {"r0"}  # no intruder registered, r0 did not leave
    assert replicas["r0"].state != pb.REPLICA_STATE_DRAINING and not replicas["r0"].cordoned
    assert replicas["r0"].step == 0  # the forged heartbeat's step 99 was not taken
    assert after.quorum.id == before.quorum.id


def test_health_probes_need_no_token(secured):
    c, _ = secured
    with grpc.insecure_channel(c.address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_cli_without_the_token_says_so_in_one_line(secured, tmp_path):
    c, path = secured
    one_line_error(fthsdp("status", "--coordinator", c.address), 1, "missing bearer token")
    ok = fthsdp("status", "--coordinator", c.address, "--token-file", str(path))
    assert ok.returncode == 0, ok.stderr
    empty = tmp_path / "empty"
    empty.write_text("\n")
    one_line_error(fthsdp("status", "--coordinator", c.address, "--token-file", str(empty)), 2, "is empty")


def test_coordinator_refuses_to_start_with_an_unreadable_token_file(tmp_path):
    one_line_error(fthsdp("coordinator", "--bind", "127.0.0.1:0", "--token-file", str(tmp_path / "nope")), 2,
                   "cannot read")


def test_an_agent_and_its_ranks_train_and_catch_up_with_the_token(secured, tmp_path):
    """The agent's events, the ranks' registration, heartbeats and Watch, and
    the catch-up between them all carry the one token (FTHSDP_TOKEN_FILE)."""
    c, path = secured
    agents = [
        AgentProcess(tmp_path, c.address, f"r{i}", i, 2, "--steps", "1000000", "--wait-for", "2", "--hidden", "64",
                     agent_args=("--token-file", str(path))).start()
        for i in range(2)
    ]
    try:
        first = agents[1].read_until(lambda line: "admitted" in line)
        agents[0].read_until(lambda line: line.get("step", 0) >= 5)
        os.kill(first["pid"], signal.SIGKILL)  # its agent restarts it; it catches up from r0
        again = agents[1].read_until(lambda line: "admitted" in line and line["pid"] != first["pid"], timeout=60)
        assert again["catch_up"] and again["catch_up"]["source"] == "r0"
        after = agents[1].read_until(lambda line: "step" in line and line["t"] > again["t"], timeout=60)
        assert after["step"] > again["catch_up"]["snapshot_step"]
        with CoordinatorClient([c.address], token=TOKEN) as client:  # the agent's own report got through too
            r1 = {r.replica_id: r for r in client.status().replicas}["r1"]
        assert r1.restart_count == 1 and r1.agent_state != pb.AGENT_STATE_UNSPECIFIED
    finally:
        end_started()  # everything it started, killed at once (tests/harness/ending.py)
