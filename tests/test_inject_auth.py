"""The admin token at the gRPC edge, against a real coordinator server run
in this process (its own event loop, on a thread): Inject is refused without
the admin token and with a wrong one, and accepted with it (then pushed to
the replica's watchers); with no admin token configured, Inject is off and
the other admin calls work as before."""

from __future__ import annotations

import grpc
import pytest

from fthsdp.cli import main as cli
from fthsdp.client import CoordinatorClient
from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.core.errors import RequestRejected
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.inprocess import ADMIN_TOKEN, JOB_TOKEN, InProcessCoordinator


@pytest.fixture
def coordinator(tmp_path):
    started = []

    def start(admin: bool) -> InProcessCoordinator:
        (tmp_path / "job-token").write_text(JOB_TOKEN + "\n")
        (tmp_path / "admin-token").write_text(ADMIN_TOKEN + "\n")
        config = CoordinatorConfig(bind="127.0.0.1:0", token_file=str(tmp_path / "job-token"),
                                   admin_token_file=str(tmp_path / "admin-token") if admin else "")
        started.append(InProcessCoordinator(config))
        return started[-1]

    yield start
    for c in started:
        c.close()


def _client(c: InProcessCoordinator, admin_token: str = "") -> CoordinatorClient:
    client = CoordinatorClient([c.address], token=JOB_TOKEN)
    client.use_admin_token(admin_token)
    return client


def _register(c: InProcessCoordinator) -> None:
    with _client(c) as client:
        client.call("Register", pb.RegisterRequest(job="default", replica_id="r1", address="127.0.0.1:1",
                                                   world_size=1, restart_count=2))


@pytest.mark.parametrize("presented, code, words", [
    ("", grpc.StatusCode.PERMISSION_DENIED, "Inject is an admin call: present the coordinator's admin token"),
    ("not-the-admin-token", grpc.StatusCode.UNAUTHENTICATED, "wrong admin token"),
    (JOB_TOKEN, grpc.StatusCode.UNAUTHENTICATED, "wrong admin token"),
], ids=["missing", "wrong", "the-job-token"])
def test_inject_without_the_admin_token_is_refused_and_records_nothing(coordinator, presented, code, words):
    c = coordinator(admin=True)
    _register(c)
    with _client(c, presented) as client:
        with pytest.raises(RequestRejected) as refused:
            client.inject("default", "r1", pb.FAULT_KIND_KILL)
        assert refused.value.code == code and words in str(refused.value)
        with pytest.raises(RequestRejected) as refused:  # the other admin calls need it too now
            client.drain("default", "r1")
        assert refused.value.code == code
        for call in (lambda: client.give_up_state("default", 3), lambda: client.restore_checkpoint("default", 3),
                     lambda: client.reopen_job("default", 3)):
            with pytest.raises(RequestRejected) as refused:  # a rank's job token never rolls the job back
                call()
            assert refused.value.code == code, refused.value
        status = client.status()
    assert not status.injections
    assert {r.replica_id: r.state for r in status.replicas}["r1"] != pb.REPLICA_STATE_DRAINING


def test_inject_with_the_admin_token_is_recorded_and_pushed(coordinator):
    c = coordinator(admin=True)
    _register(c)
    with _client(c, ADMIN_TOKEN) as client:
        done = client.inject("default", "r1", pb.FAULT_KIND_SLOW, seconds=1.5, steps=3, requested_by="ops@x")
        assert (done.replica_id, done.kind, done.restart_count, done.requested_by) == ("r1", pb.FAULT_KIND_SLOW, 2,
                                                                                      "ops@x")
        assert done.peer  # the caller's address, as gRPC saw it
        assert list(client.status().injections) == [done]
        stream = client.stub(c.address).Watch(pb.WatchRequest(job="default", replica_id="r1"),
                                              metadata=client.metadata, timeout=10)
        first = next(iter(stream))
        stream.cancel()
        assert list(first.injections) == [done]
        client.drain("default", "r1")  # the admin token opens the other admin calls


def test_the_admin_token_does_not_replace_the_job_token(coordinator):
    c = coordinator(admin=True)
    _register(c)
    with CoordinatorClient([c.address]) as client:  # no bearer token at all
        client.use_admin_token(ADMIN_TOKEN)
        with pytest.raises(RequestRejected) as refused:
            client.inject("default", "r1", pb.FAULT_KIND_KILL)
    assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED and "bearer token" in str(refused.value)


def test_without_an_admin_token_inject_is_off_and_drain_works_as_before(coordinator):
    c = coordinator(admin=False)
    _register(c)
    with _client(c, ADMIN_TOKEN) as client:
        with pytest.raises(RequestRejected) as refused:
            client.inject("default", "r1", pb.FAULT_KIND_HANG)
        assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert "runs without an admin token" in str(refused.value)
    with _client(c) as client:
        client.drain("default", "r1")
        assert not client.status().injections


def test_the_cli_says_why_in_one_line_and_succeeds_with_the_token(coordinator, tmp_path, capsys):
    c = coordinator(admin=True)
    _register(c)
    base = ["inject", "--coordinator", c.address, "--token-file", str(tmp_path / "job-token")]
    admin = {"FTHSDP_ADMIN_TOKEN_FILE": str(tmp_path / "admin-token")}
    assert cli.main([*base, "--replica", "r1", "hang"], env={}) == cli.EXIT_FAILURE
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error") == 1 and "admin call" in err, err
    assert cli.main([*base, "--replica", "r7", "kill"], env=admin) == cli.EXIT_FAILURE
    assert "no replica 'r7'" in capsys.readouterr().err
    assert cli.main([*base, "--replica", "r1", "hang"], env=admin) == 0
    out = capsys.readouterr().out
    assert "replica r1: fault injected: hang (id " in out and "incarnation 2" in out, out
