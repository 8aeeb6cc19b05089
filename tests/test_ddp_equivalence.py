"""With no failures, N replicas under fthsdp end with the parameters torch's
own DistributedDataParallel reaches with world size N on the same data."""

from __future__ import annotations

import pytest
import torch

from tests.processes import CoordinatorProcess, WorkerProcess, start_ddp_oracle

N, STEPS, HIDDEN = 3, 12, "96"


@pytest.mark.parametrize("model", ["plain", "batchnorm"])
def test_same_parameters_as_ddp(tmp_path, model):
    """With batch norm, DDP's replica 0 sets every replica's running
    statistics before each forward pass (broadcast_buffers); fthsdp's first
    contributor does, in the all-reduce: the same statistics."""
    oracle = start_ddp_oracle(tmp_path, N, STEPS, HIDDEN, "--names", model)
    coordinator = CoordinatorProcess(tmp_path, "--min-replicas", str(N)).start()
    try:
        workers = [
            WorkerProcess(tmp_path, coordinator.address, f"r{r}", r, "--steps", str(STEPS), "--wait-for", str(N),
                          "--hidden", HIDDEN, "--names", model, "--save", str(tmp_path / f"ft{r}.pt")).start()
            for r in range(N)
        ]
        for w in workers:
            w.finish()
    finally:
        coordinator.stop()
    for p in oracle:
        assert p.wait(timeout=120) == 0
    expected = torch.load(tmp_path / "ddp0.pt", weights_only=True)
    for r in range(N):
        got = torch.load(tmp_path / f"ft{r}.pt", weights_only=True)
        for name, value in expected.items():
            # Equal up to float32 rounding: DDP divides before summing, FTAR after.
            torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=f"replica {r}, {name}")
        # and the replicas are bit-identical among themselves
        first = torch.load(tmp_path / "ft0.pt", weights_only=True)
        assert all(torch.equal(got[k], first[k]) for k in first)
