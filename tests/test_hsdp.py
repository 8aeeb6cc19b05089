"""HSDP on CPU: replica groups of 2 ranks each sharding the model with FSDP2,
FTAR across replicas (each shard rank with the same shard rank of the others),
launched by `fthsdp agent --nproc 2` against a real coordinator."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from fthsdp.testing.local_etcd import free_port
from tests.harness.ddp import start_ddp_oracle
from tests.harness.ending import end_started
from tests.harness.events import JsonLog, has
from tests.harness.hsdp import HIDDEN, RANKS, REPLICAS, hsdp_agent
from tests.harness.processes import CoordinatorProcess
from tests.harness.waiting import wait_until

STEPS = 6


@pytest.mark.parametrize("bucket_cap_mb", ["25", "0.001", "0"], ids=["one-bucket", "many-buckets", "no-overlap"])
def test_hsdp_matches_ddp_over_all_ranks(tmp_path, bucket_cap_mb):
    """Each shard rank's cross-replica sum, overlapped with the backward pass
    in buckets of its local shards (fthsdp/agent/training/ftar/overlap.py: FSDP2
    calls their hooks), in one bucket, or after the backward pass."""
    world = REPLICAS * RANKS
    oracle = start_ddp_oracle(tmp_path, world, "--steps", str(STEPS), "--hidden", HIDDEN)
    for p in oracle:
        assert p.wait(timeout=180) == 0
    c = CoordinatorProcess(tmp_path, "--min-replicas", str(REPLICAS)).start()
    try:
        agents = [
            hsdp_agent(tmp_path, c.address, k, "--steps", str(STEPS), "--save", str(tmp_path / f"hsdp{k}.pt"),
                       agent_args=("--bucket-cap-mb", bucket_cap_mb)).start()
            for k in range(REPLICAS)
        ]
        for a in agents:
            a.finish(timeout=180)
    finally:
        end_started()  # everything it started, killed at once (tests/harness/ending.py)
    r0, r1 = agents
    for step in range(1, STEPS + 1):
        assert r0.steps[step]["checksum"] == r1.steps[step]["checksum"], f"replicas differ at step {step}"
        assert r0.steps[step]["contributors"] == REPLICAS
    # The first step in a group sums after the backward pass; from the next on, in buckets during it.
    overlapped = [r.steps[s]["overlapped"] for r in agents for s in range(3, STEPS + 1)]
    if bucket_cap_mb == "25":
        assert set(overlapped) == {1}, overlapped  # the whole shard in one bucket
    elif bucket_cap_mb == "0":
        assert set(overlapped) == {0}, overlapped
    else:
        assert min(overlapped) >= 1 and max(overlapped) >= 3, overlapped
    expected = torch.load(tmp_path / "ddp0.pt", weights_only=True)
    for k in range(REPLICAS):
        got = torch.load(tmp_path / f"hsdp{k}.pt", weights_only=True)
        for name, value in expected.items():
            torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=f"replica {k}, {name}")




def fast_coordinator(tmp_path) -> CoordinatorProcess:
    # A stopped rank is found by the heartbeat timeout: short, but not so
    # short that a loaded 2-core machine's pause in a healthy rank's heartbeat
    # thread drops it (the product's default is 5 s; the hang limit keeps its
    # default 10 s floor here).
    return CoordinatorProcess(tmp_path, "--min-replicas", "1", "--heartbeat-timeout", "2s",
                              "--heartbeat-interval", "200ms", "--log-format", "json").start()


@pytest.mark.parametrize(
    "sig, detected_by",
    [
        # Rank 1 dies: its agent reports it at once (r1's rank 0 holds the session).
        (signal.SIGKILL, ("agent_reported", {"replica": "r1", "node_rank": 0, "state": "failed"})),
        # Rank 1 hangs while r1's rank 0 goes on heartbeating: rank 1's own
        # pings stop, so the coordinator drops r1 after the heartbeat timeout.
        (signal.SIGSTOP, ("quorum_change", {"reason": has("r1 (heartbeat timeout)")})),
    ],
    ids=["killed", "hung"],
)
def test_a_failed_shard_rank_takes_its_replica_out_and_the_other_trains_on(tmp_path, sig, detected_by):
    c = fast_coordinator(tmp_path)
    r0 = hsdp_agent(tmp_path, c.address, 0, "--steps", "200").start()
    r1 = hsdp_agent(tmp_path, c.address, 1, "--steps", "200").start()
    victim = None
    try:
        victim = r1.read_until(lambda line: line.get("rank") == 1)["pid"]
        r0.read_until(lambda line: line.get("step") == 5)
        os.kill(victim, sig)
        r0.finish(timeout=180)
        if sig == signal.SIGSTOP:
            # Dropped for silence with its connections open: its agent ends it
            # (fthsdp/agent/node/hang_watch.py), SIGKILL after --hang-grace.
            wait_until(lambda: not _running(victim), 60, message="the agent ended the stopped rank")
            assert "taken out by the coordinator" in r1.log_path.read_text()
    finally:
        if victim is not None and sig == signal.SIGSTOP and _running(victim):
            os.kill(victim, signal.SIGCONT)
        r1.stop()
        c.stop()
    assert sorted(r0.steps) == list(range(1, 201)), "r0 lost or repeated a step"
    assert r0.steps[200]["contributors"] == 1
    name, fields = detected_by
    assert JsonLog(c.log_path).find_event(name, **fields), c.log_tail()


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie awaiting its agent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_replica_group_spanning_two_nodes_is_restarted_on_both(tmp_path):
    """Replica r1's two ranks run under two agents (two "nodes"); killing the
    rank on node 1 takes the whole group out: the coordinator drops r1, the
    rank on node 0 exits (eviction watchdog) and both agents restart."""
    c = fast_coordinator(tmp_path)
    port = str(free_port())
    nodes = []
    for node in (0, 1):
        a = hsdp_agent(tmp_path, c.address, 1, "--steps", "300",
                       agent_args=("--nproc", "1", "--nnodes", "2", "--node-rank", str(node), "--master-port", port))
        a.log_path = tmp_path / f"agent-r1-node{node}.log"
        nodes.append(a.start())
    r0 = hsdp_agent(tmp_path, c.address, 0, "--steps", "300").start()
    try:
        victim = nodes[1].read_until(lambda line: line.get("rank") == 1)
        r0.read_until(lambda line: line.get("step") == 5)
        os.kill(victim["pid"], signal.SIGKILL)

        log = JsonLog(c.log_path)
        for node in (0, 1):  # both nodes of r1 restarting
            log.wait_event("agent_reported", 60, replica="r1", node_rank=node, state="restarting")
        r0.finish(timeout=240)
    finally:
        end_started()  # everything it started, killed at once (tests/harness/ending.py)
    assert sorted(r0.steps) == list(range(1, 301))
    assert r0.steps[300]["contributors"] == 1
