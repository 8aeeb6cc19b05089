"""Every replica holding the job's state is lost: the coordinator (a real
process on a real etcd) refuses to start the job over from fresh replicas,
across a restart of its own, until an operator gives the state up by name."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest

from fthsdp.client import CoordinatorClient
from fthsdp.coordinator.ledger.keys import JobKeys
from fthsdp.coordinator.store import open_store
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.cli import fthsdp
from tests.harness.etcd import fresh_prefix
from tests.harness.events import JsonLog
from tests.harness.processes import CoordinatorProcess, ReplicaProcess
from tests.harness.waiting import wait_until


@pytest.fixture
def started(tmp_path):
    """Start processes with ``started(proc)``; all are stopped at the end."""
    procs = []

    def start(proc):
        procs.append(proc.start())
        return proc

    yield start
    for proc in reversed(procs):
        proc.stop()


def status(address: str) -> pb.StatusResponse:
    with CoordinatorClient([address]) as client:
        return client.status("default")


def metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(url, timeout=5).read().decode()  # the /metrics URL the start-up line printed
    return float(re.search(rf'^{name}{{job="default"}} (\S+)$', text, re.M).group(1))


def stored(etcd_url: str, prefix: str) -> pb.CommittedStep | None:
    with open_store(etcd_url) as store:
        item = store.get(JobKeys(prefix, "default").committed)
        return pb.CommittedStep.FromString(item.value) if item else None


def test_lost_state_is_never_silently_restarted_and_is_given_up_by_name(started, etcd_url, tmp_path):
    prefix = fresh_prefix()
    # join-timeout 0: SIGKILLed replicas close their streams, which the
    # split-brain guard would otherwise take join_timeout to believe.
    args = ("--store", etcd_url, "--store-prefix", prefix, "--heartbeat-interval", "100ms",
            "--heartbeat-timeout", "2s", "--join-timeout", "0s", "--metrics-port", "0", "--log-format", "json")
    first = started(CoordinatorProcess(tmp_path, *args))

    def replicas(address: str, *extra: str) -> list[ReplicaProcess]:
        return [started(ReplicaProcess(tmp_path, address, rid, *extra)) for rid in ("r0", "r1", "r2")]

    trainers = replicas(first.address, "--step-period", "0.01")  # a step every 10 ms as members
    wait_until(lambda: status(first.address).committed_step >= 20, 30, message="the job trained 20 steps")

    for r in trainers:
        r.kill()
    wait_until(lambda: status(first.address).state_lost_step > 0, 20, message="the loss detected")
    s = status(first.address)
    lost, q = s.state_lost_step, s.quorum.id
    assert lost == s.committed_step >= 20
    assert s.state_lost_reason == "no live replica holds it; no replica is alive"
    assert metric(first.metrics_url, "fthsdp_state_lost_step") == lost
    assert metric(first.metrics_url, "fthsdp_committed_step") == lost
    wait_until(lambda: stored(etcd_url, prefix).step == lost, 10, message="the committed step stored")

    fresh = replicas(first.address)  # new processes, at step 0 (and they never step: the record stays at 0)
    for r in fresh:
        event = r.wait_event(lambda e: e["reason"].startswith(f"state lost at step {lost}: "))
        assert event["rank"] is None and event["catch_up"] == ""  # no place, no source

    def refused_by(address: str) -> pb.StatusResponse:
        s = status(address)
        # Nobody admitted. (A restarted coordinator may still drop a
        # restarted member that it had presumed alive: a new id, no new member.)
        assert s.state_lost_step == lost and all(m.joined_quorum_id <= q for m in s.quorum.members), s.reason
        assert {r.replica_id: (r.state, r.step) for r in s.replicas} == {
            rid: (pb.REPLICA_STATE_JOINING, 0) for rid in ("r0", "r1", "r2")}
        return s

    wait_until(lambda: refused_by(first.address), 20, message="three fresh replicas, none admitted")
    assert s.state_lost_reason.startswith("no live replica holds it")

    # A coordinator restart (and so a failover) still knows the step.
    first.kill()
    second = started(CoordinatorProcess(tmp_path, *args, port=first.port))
    wait_until(lambda: status(second.address).epoch == 2 and refused_by(second.address), 30,
               message="the fresh replicas back with the restarted coordinator, still refused")
    s = status(second.address)
    assert s.state_lost_reason == "no live replica holds it; r0 at step 0, r1 at step 0, r2 at step 0"
    assert metric(second.metrics_url, "fthsdp_state_lost_step") == lost
    table = fthsdp("status", "--coordinator", second.address)
    assert table.returncode == 0 and (
        f"STATE LOST at step {lost}: no live replica holds it; r0 at step 0, r1 at step 0, r2 at step 0 (waiting; "
        f"`fthsdp give-up-state --job default --step {lost}` starts over)") in table.stdout
    as_json = json.loads(fthsdp("status", "--coordinator", second.address, "--json").stdout)
    assert (as_json["committed_step"], as_json["state_lost_step"]) == (lost, lost) and as_json["last_give_up"] is None

    q = s.quorum.id
    wrong = fthsdp("give-up-state", "--coordinator", second.address, "--job", "default", "--step", str(lost - 1))
    assert wrong.returncode == 1 and "Traceback" not in wrong.stderr
    assert wrong.stderr.strip().count("\n") == 0 and f"lost its state at step {lost}, not {lost - 1}" in wrong.stderr
    assert status(second.address).state_lost_step == lost  # nothing changed

    right = fthsdp("give-up-state", "--coordinator", second.address, "--job", "default", "--step", str(lost))
    assert right.returncode == 0, right.stderr
    for r in fresh:
        r.wait_members(["r0", "r1", "r2"], timeout=20)
    s = status(second.address)
    assert s.quorum.id == q + 1 and {m.joined_quorum_id for m in s.quorum.members} == {q + 1}
    assert s.state_lost_step == 0 and s.state_lost_reason == ""
    assert s.last_give_up.step == lost and "@" in s.last_give_up.requested_by and s.last_give_up.peer
    record = stored(etcd_url, prefix)
    assert record.step == 0 and record.last_give_up == s.last_give_up  # stored, who and when with it
    log = JsonLog(tmp_path / "coordinator.log")  # both coordinators'
    # Once per coordinator, not once per decision.
    assert len(log.events_named("state_lost", job="default", step=lost)) == 2, log.events_named("state_lost")
    assert len(log.events_named("state_given_up", job="default", step=lost)) == 1
