"""With no failures, N replicas under fthsdp end with the parameters torch's
own DistributedDataParallel reaches with world size N on the same data."""

from __future__ import annotations

import pytest
import torch

from tests.harness.ddp import train_with_ddp_and_fthsdp


@pytest.mark.parametrize("model, bucket_cap_mb", [("plain", "25"), ("batchnorm", "25"), ("plain", "0.004"),
                                                   ("plain", "0")])
def test_same_parameters_as_ddp(tmp_path, model, bucket_cap_mb):
    """With batch norm, DDP's replica 0 sets every replica's running
    statistics before each forward pass (broadcast_buffers); fthsdp's first
    contributor does, in the all-reduce: the same statistics. The all-reduce
    starts during the backward pass in buckets (one bucket of this small
    model by default, many 4 KB ones, or none: one all-reduce after it)."""
    expected, replicas = train_with_ddp_and_fthsdp(tmp_path, ("--names", model),
                                                   {"FTHSDP_BUCKET_CAP_MB": bucket_cap_mb})
    for r, got in enumerate(replicas):
        for name, value in expected.items():
            # Equal up to float32 rounding: DDP divides before summing, FTAR after.
            torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=f"replica {r}, {name}")
        # and the replicas are bit-identical among themselves
        assert all(torch.equal(got[k], replicas[0][k]) for k in replicas[0])


