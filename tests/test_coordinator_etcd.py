"""The coordinator against a real etcd: restarts, etcd outages, `fthsdp status`."""

from __future__ import annotations

import json

import pytest

from fthsdp.client import CoordinatorClient
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.cli import fthsdp
from tests.harness.cluster import Cluster
from tests.harness.etcd import fresh_prefix
from tests.harness.waiting import wait_until


@pytest.fixture
def cluster(tmp_path):
    """Start coordinators (``coordinator(*args, port=)``) and replica stand-ins
    (``replicas(address, *ids)``); everything is stopped at the end."""
    with Cluster(tmp_path) as built:
        yield built


def status_json(address: str) -> dict:
    result = fthsdp("status", "--coordinator", address, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_quorum_survives_coordinator_restart_and_id_never_goes_back(cluster, etcd_url, how):
    # join-timeout 0 disables the split-brain guard's wait, which would
    # otherwise hide a coordinator that mistakes its own shutdown for failures.
    args = ("--store", etcd_url, "--store-prefix", fresh_prefix(), "--min-replicas", "1",
            "--heartbeat-interval", "200ms", "--heartbeat-timeout", "3s", "--join-timeout", "0s")
    first = cluster.coordinator(*args)
    r0, r1 = cluster.replicas(first.address, "r0", "r1")
    q = r0.wait_members(["r0", "r1"])["quorum_id"]
    before = status_json(first.address)
    assert before["epoch"] == 1 and before["quorum"] == {**before["quorum"], "id": q, "members": ["r0", "r1"]}

    first.kill() if how == "SIGKILL" else first.stop()
    second = cluster.coordinator(*args, port=first.port)
    # The restarted coordinator loads quorum q from etcd and the replicas
    # re-register saying they still train in q: same quorum, same id.
    def both_back() -> bool:
        s = status_json(second.address)
        return s["epoch"] == 2 and {r["id"]: r["state"] for r in s["replicas"]} == {"r0": "healthy", "r1": "healthy"}

    wait_until(both_back, 20, message="both replicas back with the restarted coordinator")
    after = status_json(second.address)
    assert after["quorum"]["id"] == q and after["quorum"]["members"] == ["r0", "r1"]

    r1.kill()
    event = r0.wait_members(["r0"], timeout=20)
    assert event["quorum_id"] == q + 1
    table = fthsdp("status", "--coordinator", second.address)
    assert table.returncode == 0 and f"quorum {q + 1}: r0" in table.stdout and "failed" in table.stdout


def test_restart_with_a_fresh_replica_gets_a_higher_id(cluster, etcd_url):
    args = ("--store", etcd_url, "--store-prefix", fresh_prefix(), "--heartbeat-timeout", "1s",
            "--heartbeat-interval", "200ms")
    first = cluster.coordinator(*args)
    (r0,) = cluster.replicas(first.address, "r0")
    q = r0.wait_members(["r0"])["quorum_id"]
    first.stop()
    r0.kill()
    second = cluster.coordinator(*args)
    (r9,) = cluster.replicas(second.address, "r9")
    event = r9.wait_members(["r9"], timeout=20)
    assert event["quorum_id"] > q


def test_etcd_restarted_under_a_running_coordinator(cluster, private_etcd):
    etcd = private_etcd
    c = cluster.coordinator("--store", etcd.url, "--store-timeout", "500ms", "--heartbeat-timeout", "60s")
    r0, r1, r2 = cluster.replicas(c.address, "r0", "r1", "r2")
    q = r0.wait_members(["r0", "r1", "r2"])["quorum_id"]

    etcd.kill()
    r2.kill()
    client = CoordinatorClient([c.address])
    wait_until(lambda: "store is unavailable" in client.status().reason, 20, message="pending change reported")
    status = client.status()
    # Nothing is pushed that is not durable, but heartbeats and status go on.
    assert status.quorum.id == q
    healthy = {r.replica_id for r in status.replicas if r.state == pb.REPLICA_STATE_HEALTHY}
    assert healthy == {"r0", "r1"}

    etcd.restart()
    event = r0.wait_members(["r0", "r1"], timeout=30)
    assert event["quorum_id"] == q + 1 and "r2 (stream closed)" in event["reason"]
    client.close()
