"""Durable checkpoints with real processes: every replica lost, the job goes on from the newest checkpoint.

Three replicas (real processes, gloo, a real coordinator) save a checkpoint
every 10 steps, each writing a third; all three are SIGKILLed; fresh
processes come, the coordinator restores the newest complete checkpoint,
and they train on from its step with the state it recorded.
"""

from __future__ import annotations

import json
from pathlib import Path

from fthsdp.client import CoordinatorClient
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.events import JsonLog, has
from tests.harness.waiting import wait_until

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

    # The script waits for 3 replicas, which a job that lost its members no longer
    # does: the first to load the checkpoint (at least --min-replicas) train on from
    # it at once, and one that loads it after they trained on catches up from them.
    second = [worker(c, i, 3, env=env, name=f"r{i}-second") for i in range(3)]
    first_steps = []
    for w in second:
        admitted = w.read_until(lambda line: "admitted" in line, timeout=60)
        line = w.read_until(lambda line: "step" in line, timeout=30)
        first_steps.append((admitted["catch_up"], line["step"]))
    from_checkpoint = [step for source, step in first_steps if source is None and step == restored.step + 1]
    assert len(from_checkpoint) >= 2, first_steps  # a quorum formed at the checkpoint's step
    assert all(step > restored.step for _, step in first_steps), first_steps
    # Training goes on, and the periodic checksums agree across the new replicas (checked by
    # the coordinator too: no mismatch).
    latest_first = max(step for _, step in first_steps)
    step = max(restored.step + 3 * EVERY, (latest_first // EVERY + 1) * EVERY)  # one all of them print
    for w in second:
        w.read_until(lambda line: line.get("step", 0) >= step, timeout=60)
    assert len({w.steps[step]["checksum"] for w in second}) == 1 and second[0].steps[step]["checksum"]
    wait_until(lambda: status(c).committed_step >= step, 10, message="the coordinator heard of the steps")
    assert not any(r.checksum_mismatch_step for r in status(c).replicas)


def recorded_steps(c) -> int:
    return status(c).checkpoint.step


def test_a_member_killed_mid_save_leaves_that_checkpoint_unused_and_the_next_completes(cluster, tmp_path):
    coordinator, _, worker = cluster
    c = coordinator("--min-replicas", "2", "--log-format", "json")
    root = tmp_path / "ckpt"
    env = checkpointing(root)
    dying_at = 2 * EVERY  # r2 is SIGKILLed in the forward pass right after staging its share of step 20
    workers = [worker(c, i, 3, "--hidden", "1536", env=env, name=f"r{i}")  # 28 MB of state: a write of some ms
               for i in range(2)]
    workers.append(worker(c, 2, 3, "--hidden", "1536", "--die-at", str(dying_at), env=env, name="r2"))
    assert workers[2].collect_after_exit(timeout=90) != 0
    wait_until(lambda: recorded_steps(c) >= 3 * EVERY, 90, message="a later checkpoint recorded")
    # r2 died within a millisecond of staging, long before its share could be written.
    sealer = (tmp_path / "worker-r0.log").read_text()
    assert f"checkpoint of step {dying_at} is incomplete: share-2-rank-0 not written" in sealer
    s = status(c)
    log = JsonLog(c.log_path)
    log.wait_event("checkpoint", 10, step=s.checkpoint.step)  # the log has the checkpoints recorded...
    assert not log.events_named("checkpoint", step=dying_at)  # ...and not that one: never recorded, never used
    assert s.checkpoint.shares == 2  # the survivors wrote the next one between them
    assert (root / "default" / f"step-{s.checkpoint.step:010d}" / "checkpoint.json").exists()


def test_a_corrupt_checkpoint_is_refused_and_the_one_before_restored(cluster, tmp_path):
    coordinator, _, worker = cluster
    c = coordinator("--min-replicas", "2", "--log-format", "json")
    root = tmp_path / "ckpt"
    env = checkpointing(root)
    first = [worker(c, i, 3, env=env, name=f"r{i}-first") for i in range(3)]
    wait_until(lambda: recorded_steps(c) >= 2 * EVERY, 60, message="two checkpoints recorded")
    for w in first:
        w.kill()
    wait_until(lambda: status(c).HasField("last_restore"), 30, message="the lost state restored")
    newest = status(c).last_restore.checkpoint
    data = Path(newest.path) / "share-1-rank-0" / "__0_0.distcp"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte, same size
    data.write_bytes(bytes(raw))
    # Fewer replicas than saved, with the same command: their script's wait for 3
    # would hold them out for good, and after a loss it is not kept.
    second = [worker(c, i, 3, env=env, name=f"r{i}-second") for i in range(2)]
    wait_until(lambda: status(c).last_restore.checkpoint.step == newest.step - EVERY, 60,
               message="the checkpoint before restored")
    for w in second:
        line = w.read_until(lambda line: "step" in line, timeout=60)
        assert line["step"] == newest.step - EVERY + 1
    JsonLog(c.log_path).wait_event("checkpoint_refused", 10, step=newest.step,
                                   reason=has("share-1-rank-0/__0_0.distcp is corrupt"))


def test_plain_dcp_reads_a_checkpoint_the_replicas_wrote(cluster, tmp_path):
    """What the replicas wrote between them is one ordinary DCP checkpoint:
    torch's own converter reads every tensor, equal to fthsdp's restore.

    The checkpoints here are timed (``--checkpoint-every 1s``): each
    replica's clock is its own, and the members still save at one step
    boundary (every checkpoint recorded has a share from each of the three,
    and none was left incomplete)."""
    import warnings

    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from fthsdp.agent.training.checkpoint.restore import load
    from fthsdp.agent.training.checkpoint.seal import read_checkpoint

    coordinator, _, worker = cluster
    c = coordinator("--min-replicas", "2")
    env = {**checkpointing(tmp_path / "ckpt"), "FTHSDP_CHECKPOINT_EVERY": "1s"}
    for i in range(3):
        worker(c, i, 3, env=env, name=f"r{i}")
    wait_until(lambda: recorded_steps(c) > 0, 60, message="a checkpoint recorded")
    first = recorded_steps(c)
    wait_until(lambda: recorded_steps(c) > first, 60, message="a second timed checkpoint recorded")
    record = status(c).checkpoint
    assert record.shares == 3
    folder = Path(record.path)
    out = tmp_path / "converted.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(str(folder), str(out))
    converted = torch.load(out, weights_only=True)
    structure = json.loads((folder / "checkpoint.json").read_text())["structure"]
    theirs = read_checkpoint(folder, job="default", structure=structure, digest=record.digest)
    assert theirs["step"] == record.step and theirs["shares"] == 3
    assert converted["model"]  # the model's tensors, by their state_dict names
    restored = load(folder, theirs, rank=0, current={"model": {}, "optimizer": {}, "extra": {}, "rng": {}})
    for name, tensor in converted["model"].items():
        assert torch.equal(restored["model"][name], tensor), name
    logs = "".join((tmp_path / f"worker-r{i}.log").read_text() for i in range(3))
    assert "incomplete" not in logs and "skipped" not in logs


def test_a_fresh_job_started_with_resume_goes_on_from_the_newest_checkpoint(cluster, tmp_path):
    coordinator, _, worker = cluster
    first_coordinator = coordinator("--min-replicas", "2")
    env = checkpointing(tmp_path / "ckpt")
    first = [worker(first_coordinator, i, 2, env=env, name=f"r{i}-first") for i in range(2)]
    wait_until(lambda: recorded_steps(first_coordinator) >= 2 * EVERY, 60, message="two checkpoints recorded")
    for w in first:
        w.kill()
    first_coordinator.stop()
    # The newest complete one on disk (a later one than the coordinator recorded may have been sealed).
    sealed = (tmp_path / "ckpt").glob("default/*/checkpoint.json")
    newest = max(int(p.parent.name.removeprefix("step-")) for p in sealed)
    # A new coordinator knows nothing of the job: only the checkpoint folder does.
    c = coordinator("--min-replicas", "2")
    second = [worker(c, i, 2, env={**env, "FTHSDP_RESUME": "1"}, name=f"r{i}-second") for i in range(2)]
    for w in second:
        assert w.read_until(lambda line: "step" in line, timeout=60)["step"] == newest + 1
    text = (tmp_path / "worker-r0-second.log").read_text()
    assert f"restored from the checkpoint of step {newest}" in text
    wait_until(lambda: status(c).committed_step > newest, 10, message="the coordinator heard of the steps")


def test_without_auto_restore_an_operator_restores_a_checkpoint_by_its_step(cluster, tmp_path):
    from tests.harness.cli import fthsdp

    coordinator, _, worker = cluster
    c = coordinator("--min-replicas", "2", "--no-auto-restore")
    env = checkpointing(tmp_path / "ckpt")
    first = [worker(c, i, 2, env=env, name=f"r{i}-first") for i in range(2)]
    wait_until(lambda: recorded_steps(c) >= 2 * EVERY, 60, message="two checkpoints recorded")
    refused = fthsdp("restore", "--coordinator", c.address, "--step", str(EVERY))
    assert refused.returncode == 1 and "is not lost" in refused.stderr and "Traceback" not in refused.stderr
    for w in first:
        w.kill()
    wait_until(lambda: status(c).state_lost_step > 0, 30, message="the loss detected")
    assert not status(c).HasField("last_restore")  # nothing restored by itself
    unknown = fthsdp("restore", "--coordinator", c.address, "--step", "7")
    assert unknown.returncode == 1 and "no complete checkpoint of step 7" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1
    chosen = status(c).checkpoint.step - EVERY  # not the newest, by choice (the replicas keep 3 on disk)
    done = fthsdp("restore", "--coordinator", c.address, "--step", str(chosen))
    assert done.returncode == 0, done.stderr
    assert f"restoring the checkpoint of step {chosen}" in done.stdout
    s = status(c)
    assert s.last_restore.checkpoint.step == chosen and s.last_restore.requested_by.endswith(")")
    table = fthsdp("status", "--coordinator", c.address).stdout
    assert f"restored from step {chosen};" in table and "checkpoint: step" in table
    second = [worker(c, i, 2, env=env, name=f"r{i}-second") for i in range(2)]
    for w in second:
        assert w.read_until(lambda line: "step" in line, timeout=60)["step"] == chosen + 1
