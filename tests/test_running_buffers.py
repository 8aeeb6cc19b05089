"""Which module buffers travel in the all-reduce, and how they come back."""

from __future__ import annotations

import pytest
import torch

from fthsdp.agent.training.state.running_buffers import RunningBuffers
from fthsdp.agent.training.state.train_state import TrainState


def model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(4, 6),
        torch.nn.BatchNorm1d(6),
        torch.nn.BatchNorm1d(6, track_running_stats=False),  # no statistics: nothing to keep
        torch.nn.InstanceNorm1d(6, track_running_stats=True),
        torch.nn.LayerNorm(6),
    )


def test_finds_the_running_statistics_and_counts_only():
    m = model()
    m.register_buffer("mask", torch.tril(torch.ones(3, 3)))  # a constant buffer: never carried
    r = RunningBuffers(m)
    assert [n for n, _ in r.stats] == ["1.running_mean", "1.running_var", "3.running_mean", "3.running_var"]
    assert [n for n, _ in r.counts] == ["1.num_batches_tracked", "3.num_batches_tracked"]
    assert r.numel() == 24
    assert not RunningBuffers(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2)))


def test_pieces_and_load_round_trip():
    a, b = model(), model()
    a.train()[:2](torch.randn(5, 4))  # a forward pass moves a's statistics
    ra, rb = RunningBuffers(a), RunningBuffers(b)
    section = torch.cat(ra.pieces(torch.float32, torch.device("cpu")))
    rb.load(section)
    for (name, x), (_, y) in zip(ra.stats, rb.stats, strict=True):
        assert torch.equal(x, y), name
    rb.load_counts(ra.count_state())
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(ra.counts, rb.counts, strict=True))


def test_counts_of_another_model_are_refused():
    r = RunningBuffers(model())
    with pytest.raises(ValueError, match="counts batches"):
        r.load_counts({"9.num_batches_tracked": torch.tensor(1)})


def test_inputs_carry_the_counts_and_restore_them():
    a, b = model(), model()
    a.train()[:2](torch.randn(5, 4))
    opt_a, opt_b = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (a, b))
    entry = TrainState(a, opt_a).inputs(7)
    TrainState(b, opt_b).apply_inputs(entry)
    assert int(b[1].num_batches_tracked) == int(a[1].num_batches_tracked) == 1


def test_buffers_replaced_by_a_later_to_are_followed():
    """``model.to(...)`` after the manager was built replaces buffer tensors
    (parameters keep theirs): the statistics are looked up at each use."""
    m = model()
    r = RunningBuffers(m)
    m.double()
    assert r.stats[0][1] is m[1].running_mean and r.stats[0][1].dtype is torch.float64
    r.load(torch.full((r.numel(),), 2.0))
    assert torch.equal(m[1].running_mean, torch.full((6,), 2.0, dtype=torch.float64))
