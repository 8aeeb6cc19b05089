"""The bucket plan of the overlapped all-reduce (pure) and the hooks that start the buckets (one process)."""

from __future__ import annotations

import pytest
import torch

from fthsdp.agent.training.ftar.buckets import FIRST_BUCKET_BYTES, Bucket, bucket_of, plan_buckets, plan_signature
from fthsdp.agent.training.ftar.overlap import Overlap
from tests.harness.buckets import RecordingPg, model

MB = 1 << 20


@pytest.mark.parametrize("numels, cap, expected", [
    ([], 25 * MB, ()),
    ([10, 10], 0, ()),  # no overlap
    # Float32: 4 bytes. The last parameters first; the first bucket is capped at 1 MiB.
    ([MB // 4, MB // 4], 25 * MB, (Bucket(1, 2, MB // 4, MB // 2), Bucket(0, 1, 0, MB // 4))),
    ([100, 100, 100], 25 * MB, (Bucket(0, 3, 0, 300),)),
    # A parameter larger than the cap is a bucket alone.
    ([10, 30 * MB // 4, 10], 25 * MB, (Bucket(2, 3, 10 + 30 * MB // 4, 20 + 30 * MB // 4),
                                        Bucket(1, 2, 10, 10 + 30 * MB // 4), Bucket(0, 1, 0, 10))),
    # A cap below the first bucket's: every bucket takes it.
    ([64, 64, 64, 64], 512, (Bucket(2, 4, 128, 256), Bucket(0, 2, 0, 128))),
])
def test_buckets_are_cut_from_the_last_parameter(numels, cap, expected):
    buckets = plan_buckets(numels, 4, cap)
    assert buckets == expected
    # Every parameter is in exactly one bucket, and the buckets tile the gradients.
    owners = bucket_of(buckets, len(numels))
    assert all(o >= 0 for o in owners) or not buckets
    assert sum(b.stop_element - b.start_element for b in buckets) == (sum(numels) if buckets else 0)


def test_buckets_hold_about_the_cap():
    numels = [MB // 8] * 100  # 128 KiB each, 12.5 MiB in all
    buckets = plan_buckets(numels, 4, 4 * MB)
    sizes = [(b.stop_element - b.start_element) * 4 for b in buckets]
    assert sizes[0] <= FIRST_BUCKET_BYTES
    assert all(s <= 4 * MB for s in sizes) and all(s >= 3 * MB for s in sizes[1:-1])


def test_a_different_cap_is_a_different_signature():
    numels = [1000] * 50
    assert plan_signature(plan_buckets(numels, 4, 2000)) != plan_signature(plan_buckets(numels, 4, 8000))
    assert plan_signature(plan_buckets(numels, 4, 2000)) == plan_signature(plan_buckets(list(numels), 4, 2000))








def flat_grads(m: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in m.parameters()])


def test_buckets_start_during_backward_with_the_final_gradients():
    m = model()
    params = list(m.parameters())
    overlap = Overlap(params, cap_bytes=64 * 65 * 4, tail=3)  # about one layer per bucket
    assert len(overlap.buckets) >= 3
    pg = RecordingPg()
    overlap.arm("group", pg)
    m(torch.randn(4, 64)).sum().backward()
    assert len(pg.started) == len(overlap.buckets)  # every bucket started inside backward()
    pre = overlap.complete()
    assert pre is not None and not pre.stale and pre.group == "group"
    assert pre.buffer.numel() == pre.gradients + 3
    assert torch.equal(pre.buffer[:pre.gradients], flat_grads(m))
    # Each bucket was started with its slice of the final gradients.
    for work, bucket in zip(pg.started, overlap.buckets, strict=True):
        assert torch.equal(work.snapshot, flat_grads(m)[bucket.start_element:bucket.stop_element])
    overlap.close()


def test_accumulation_sends_only_the_last_micro_batch_once_learned():
    m = model()
    overlap = Overlap(list(m.parameters()), cap_bytes=64 * 65 * 4, tail=0)
    n = len(overlap.buckets)
    pg = RecordingPg()
    overlap.arm("g", pg)
    for _ in range(3):  # three micro-batches; the count is not known yet: the first pass starts the buckets
        m(torch.randn(4, 64)).sum().backward()
    pre = overlap.complete()
    assert pre is not None and pre.stale and len(pg.started) == n  # stale: FTAR sums the step again
    m.zero_grad()
    pg = RecordingPg()
    overlap.arm("g", pg)
    for micro in range(3):
        m(torch.randn(4, 64)).sum().backward()
        assert len(pg.started) == (n if micro == 2 else 0)  # nothing before the last micro-batch
    pre = overlap.complete()
    assert pre is not None and not pre.stale
    assert torch.equal(pre.buffer, flat_grads(m))


def test_an_unused_parameter_holds_back_its_bucket_once_and_is_sent_as_zeros():
    m = model()
    params = list(m.parameters())
    overlap = Overlap(params, cap_bytes=64 * 65 * 4, tail=0)
    pg = RecordingPg()
    overlap.arm("g", pg)
    frozen_out = m[4]
    x = torch.randn(4, 64)
    (m[:4](x).sum()).backward()  # the last layer has no gradient this step
    assert len(pg.started) == 0  # bucket 0 holds the last layer: everything waits
    pre = overlap.complete()
    assert pre is not None and len(pg.started) == len(overlap.buckets)
    assert torch.count_nonzero(pre.buffer[-frozen_out.weight.numel() - 8:]) == 0
    # The next step knows: the unused layer no longer holds the others back.
    overlap.arm("g", pg := RecordingPg())
    (m[:4](x).sum()).backward()
    assert len(pg.started) == len(overlap.buckets)
    overlap.complete()


def test_not_armed_the_hooks_do_nothing_and_close_removes_them():
    m = model()
    overlap = Overlap(list(m.parameters()), cap_bytes=MB, tail=0)
    m(torch.randn(4, 64)).sum().backward()
    assert overlap.complete() is None
    overlap.close()
    pg = RecordingPg()
    overlap.arm("g", pg)
    m(torch.randn(4, 64)).sum().backward()
    assert not pg.started


def test_overlap_is_off_without_a_cap():
    m = model()
    overlap = Overlap(list(m.parameters()), cap_bytes=0, tail=2)
    assert not overlap.enabled and overlap.buckets == ()
    overlap.arm("g", RecordingPg())
    assert overlap.complete() is None


FSDP2_SCRIPT = """
import json, os, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from fthsdp.agent.training.ftar.overlap import Overlap
from fthsdp.agent.training.state.codec import local
from tests.harness.buckets import RecordingPg, model

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
m = model()
for layer in (m[0], m[2], m[4]):
    fully_shard(layer)
fully_shard(m)
params = list(m.parameters())
overlap = Overlap(params, cap_bytes=64 * 65 * 4, tail=0)
pg = RecordingPg()
overlap.arm("g", pg)
m(torch.randn(4, 64)).sum().backward()
started_in_backward = len(pg.started)
pre = overlap.complete()
flat = torch.cat([local(p.grad).reshape(-1) for p in params])
print(json.dumps({"buckets": len(overlap.buckets), "started_in_backward": started_in_backward,
                  "equal": bool(torch.equal(pre.buffer, flat)), "enabled": overlap.enabled}))
dist.destroy_process_group()
"""


def test_fsdp2_parameters_start_their_buckets_during_backward():
    """FSDP2 calls the sharded parameters' post-accumulate-grad hooks once it
    has set their gradients, module by module: the buckets of the local
    shards start inside backward(). (A process of its own: FSDP2 needs a
    default process group.)"""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", FSDP2_SCRIPT], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["enabled"] and result["buckets"] >= 3
    assert result["started_in_backward"] == result["buckets"]
    assert result["equal"]
