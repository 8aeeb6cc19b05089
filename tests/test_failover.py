"""Coordinator high availability: two coordinators on one etcd elect a
leader; SIGKILL of the leader hands the job to the other, with the same
quorum id, while the replicas, which hold both addresses, keep training."""

from __future__ import annotations

import time
import uuid

from fthsdp.client import CoordinatorClient
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.ending import end_started
from tests.harness.processes import AgentProcess, CoordinatorProcess
from tests.harness.waiting import wait_until


def leader_and_follower(coordinators):
    statuses = {}
    for c in coordinators:
        with CoordinatorClient([c.address], timeout=2) as client:
            statuses[c.address] = client.call("Status", pb.StatusRequest())
    leaders = [c for c in coordinators if not statuses[c.address].follower]
    followers = [c for c in coordinators if statuses[c.address].follower]
    return leaders, followers, statuses


def test_leader_killed_the_other_takes_over_and_training_goes_on(tmp_path, etcd_url):
    args = ("--store", etcd_url, "--store-prefix", f"/fthsdp-test/{uuid.uuid4().hex[:12]}", "--leader-ttl", "2s",
            "--heartbeat-interval", "200ms", "--heartbeat-timeout", "2s", "--join-timeout", "0s")
    for i in range(2):
        (tmp_path / f"c{i}").mkdir()
    coordinators = [CoordinatorProcess(tmp_path / f"c{i}", *args).start() for i in range(2)]
    addresses = ",".join(c.address for c in coordinators)
    agents = [
        AgentProcess(tmp_path, addresses, f"r{i}", i, 2, "--steps", "1000000", "--wait-for", "2",
                     "--hidden", "64").start()
        for i in range(2)
    ]
    try:
        leaders, followers, statuses = leader_and_follower(coordinators)
        assert len(leaders) == 1 and len(followers) == 1, statuses
        leader, follower = leaders[0], followers[0]
        assert statuses[follower.address].leader == leader.address  # the follower points to the leader
        with CoordinatorClient([follower.address]) as client:  # and status through it reaches the leader
            assert not client.status().follower

        line = agents[0].read_until(lambda line: line.get("step", 0) >= 10)
        quorum = line["quorum"]
        leader.kill()
        killed = time.monotonic()

        def took_over() -> bool:
            with CoordinatorClient([follower.address], timeout=1) as client:
                s = client.call("Status", pb.StatusRequest())
            return not s.follower and s.quorum.id == quorum

        wait_until(took_over, 15, interval=0.05, message="the follower leads with the same quorum id")
        print(f"failover: the follower led {time.monotonic() - killed:.2f}s after SIGKILL of the leader")
        # Training never stopped, and stays in the same quorum once the replicas re-registered.
        for agent in agents:
            after = agent.read_until(lambda line: line.get("t", 0) > killed and "step" in line, timeout=10)
            later = agent.read_until(lambda line, after=after: line.get("step", 0) >= after["step"] + 20,
                                     timeout=60)
            assert after["quorum"] == later["quorum"] == quorum
        with CoordinatorClient([follower.address]) as client:
            s = client.status()
        assert s.quorum.id == quorum and sorted(m.replica_id for m in s.quorum.members) == ["r0", "r1"]
        assert {r.replica_id: r.state for r in s.replicas} == {"r0": 2, "r1": 2}  # both healthy again
    finally:
        end_started()  # everything it started, killed at once (tests/harness/ending.py)
