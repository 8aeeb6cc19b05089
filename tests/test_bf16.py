"""bf16 gradients, the normal case on a GPU, with real processes.

bf16 cannot carry FTAR's switch proposals exactly in the data all-reduce's
spare slots (fthsdp/agent/training/ftar/decisions.py), so a separate small all-reduce
carries them: a replica joining a bf16 job is switched in through that path.
The overlapped buckets (fthsdp/agent/training/ftar/overlap.py) run on bf16 gradients too.
"""

from __future__ import annotations

import torch

from tests.harness.ddp import train_with_ddp_and_fthsdp
from tests.harness.replicas import assert_same_state_after_rejoin

BF16 = ("--dtype", "bfloat16")
SMALL_BUCKETS = {"FTHSDP_BUCKET_CAP_MB": "0.004"}  # 4 KB: several buckets of this small model


def test_bf16_replicas_are_identical_and_close_to_ddp(tmp_path):
    expected, replicas = train_with_ddp_and_fthsdp(tmp_path, BF16, SMALL_BUCKETS)
    assert all(v.dtype is torch.bfloat16 for v in replicas[0].values())
    for r, got in enumerate(replicas):
        assert all(torch.equal(got[k], replicas[0][k]) for k in replicas[0]), f"replica {r} differs from replica 0"
    for name, value in expected.items():
        # DDP divides before its bf16 sum and FTAR after: bf16 rounding apart, through AdamW.
        torch.testing.assert_close(replicas[0][name], value, rtol=1.6e-2, atol=1e-2, msg=name)


def test_a_replica_joins_a_bf16_job_at_an_agreed_step(cluster):
    coordinator, _, worker = cluster
    c = coordinator("--min-replicas", "2")
    r0, r1 = (worker(c, i, 2, *BF16, env=SMALL_BUCKETS) for i in range(2))
    r0.read_until(lambda line: line.get("step", 0) >= 10)
    r2 = worker(c, 2, 2, *BF16, env=SMALL_BUCKETS)
    admitted = r2.read_until(lambda line: "admitted" in line, timeout=60)
    assert admitted["catch_up"] is not None  # it copied a member's state
    first = r2.read_until(lambda line: "step" in line)["step"]
    joined_in = r2.steps[first]["quorum"]
    for member in (r0, r1):
        line = member.read_until(lambda line: line.get("quorum", 0) >= joined_in)
        # Switched at a step boundary the members agreed on (the bf16 control all-reduce): nothing abandoned.
        assert line["quorum"] == joined_in and line["abandoned"] == 0, line
    assert_same_state_after_rejoin(r2, r0)
