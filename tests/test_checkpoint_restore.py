"""Durable checkpoints with real processes: every replica lost, the job goes on from the newest checkpoint.

Three replicas (real processes, gloo, a real coordinator) save a checkpoint
every 10 steps, each writing a third; all three are SIGKILLed; fresh
processes come, the coordinator restores the newest complete checkpoint,
and they train on from its step with the state it recorded.
"""

from __future__ import annotations

from pathlib import Path

from fthsdp.client import CoordinatorClient
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.waiting import wait_until

EVERY = 10


def checkpointing(folder: Path) -> dict[str, str]:
    return {"FTHSDP_CHECKPOINT_DIR": str(folder), "FTHSDP_CHECKPOINT_EVERY": str(EVERY),
            "FTHSDP_CHECKSUM_EVERY": str(EVERY)}


def status(c) -> pb.StatusResponse:
    with CoordinatorClient([c.address]) as client:
        return client.status("default")


def test_every_replica_killed_the_job_resumes_from_the_newest_checkpoint(cluster, tmp_path):
    coordinator, _, worker = cluster
    c = coordinator("--min-replicas", "2")
    env = checkpointing(tmp_path / "ckpt")
    first = [worker(c, i, 3, env=env, name=f"r{i}-first") for i in range(3)]
    wait_until(lambda: status(c).checkpoint.step >= 2 * EVERY, 60, message="two checkpoints recorded")
    for w in first:
        w.kill()
    first[0].collect_after_exit()
    wait_until(lambda: status(c).HasField("last_restore"), 30, message="the lost state restored")
    s = status(c)
    restored = s.last_restore.checkpoint
    assert restored.step % EVERY == 0 and restored.step >= 2 * EVERY
    assert s.last_restore.lost_step >= restored.step and s.last_restore.requested_by == "automatic"
    assert restored.shares == 3  # each replica wrote a third
    # The state the checkpoint recorded is the one the members had at its step.
    assert first[0].steps[restored.step]["checksum"] == restored.state_checksum

    second = [worker(c, i, 3, env=env, name=f"r{i}-second") for i in range(3)]
    for w in second:
        admitted = w.read_until(lambda line: "admitted" in line, timeout=60)
        assert admitted["catch_up"] is None  # restored from the checkpoint, not copied from a peer
        line = w.read_until(lambda line: "step" in line, timeout=30)
        assert line["step"] == restored.step + 1  # the first step after the checkpoint's
    # Training goes on, and the next periodic checksum agrees across the new replicas (checked by
    # the coordinator: no mismatch) and is reported.
    step = restored.step + 2 * EVERY
    for w in second:
        w.read_until(lambda line: line.get("step", 0) >= step, timeout=60)
    wait_until(lambda: status(c).committed_step >= step, 10, message="the coordinator heard of the steps")
    assert not any(r.checksum_mismatch_step for r in status(c).replicas)
