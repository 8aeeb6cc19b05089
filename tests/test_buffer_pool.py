"""The step buffers' reuse (fthsdp/agent/training/ftar/buffer_pool.py) and the
gradient log that hands them back (fthsdp/agent/training/catchup/grad_log.py)."""

from __future__ import annotations

import torch

from fthsdp.agent.training.catchup.grad_log import GradientLog
from fthsdp.agent.training.ftar.buffer_pool import BufferPool
from fthsdp.agent.training.ftar.overlap import Overlap
from fthsdp.protos.v1 import catchup_pb2 as cpb
from tests.harness.buckets import RecordingPg, model

CPU = torch.device("cpu")


def test_a_buffer_handed_back_is_lent_again():
    pool = BufferPool(4)
    a = pool.take(10, torch.float32, CPU)
    pool.give_back(a[:8])  # the log holds the gradients' part: a view from the start
    assert pool.take(10, torch.float32, CPU).data_ptr() == a.data_ptr()


def test_a_forgotten_buffer_is_never_lent_again():
    pool = BufferPool(4)
    a = pool.take(10, torch.float32, CPU)
    pool.forget(a)
    pool.give_back(a)  # too late: ignored
    assert pool.held == (0, 0)
    assert pool.take(10, torch.float32, CPU).data_ptr() != a.data_ptr()  # a fresh one (``a`` is alive)


def test_what_the_pool_did_not_lend_is_ignored_and_sizes_do_not_mix():
    pool = BufferPool(4)
    pool.give_back(torch.zeros(10))
    assert pool.held == (0, 0)
    a = pool.take(10, torch.float32, CPU)
    pool.give_back(a)
    b = pool.take(12, torch.float32, CPU)  # another size: the free one is let go
    assert b.numel() == 12 and pool.held == (1, 0)


def test_beyond_its_size_a_step_gets_a_buffer_of_its_own():
    pool = BufferPool(2)
    lent = [pool.take(10, torch.float32, CPU) for _ in range(3)]
    assert pool.held == (2, 0)
    pool.give_back(lent[2])  # not pooled: ignored
    assert pool.held == (2, 0)


def log_with_pool(keep: int) -> tuple[GradientLog, list[torch.Tensor]]:
    dropped: list[torch.Tensor] = []
    return GradientLog(keep_steps=keep, on_drop=dropped.append), dropped


def append(log: GradientLog, step: int, data: torch.Tensor) -> None:
    log.append(cpb.LogEntry(step=step, hyperparams_json="[]"), data, 2, 1)


def test_the_log_hands_back_what_it_lets_go():
    log, dropped = log_with_pool(keep=2)
    sums = [torch.full((4,), float(s)) for s in range(4)]
    for s, t in enumerate(sums):
        append(log, s, t)
    assert [d.data_ptr() for d in dropped] == [sums[0].data_ptr(), sums[1].data_ptr()]


def test_an_entry_being_sent_is_handed_back_only_once_sent():
    log, dropped = log_with_pool(keep=1)
    first = torch.zeros(4)
    append(log, 0, first)
    records, _, _ = log.read(0, 1 << 20)  # a catch-up server starts sending step 0
    append(log, 1, torch.ones(4))  # the log lets step 0 go meanwhile
    assert dropped == []
    log.done(records)
    assert [d.data_ptr() for d in dropped] == [first.data_ptr()]


def test_a_gap_hands_back_every_entry():
    log, dropped = log_with_pool(keep=4)
    append(log, 0, torch.zeros(4))
    append(log, 1, torch.zeros(4))
    append(log, 7, torch.zeros(4))
    assert len(dropped) == 2


def test_steps_of_the_overlap_reuse_a_few_buffers():
    """The overlap takes each step's buffer from the pool and the log hands
    it back: over many steps the replica holds the log's steps and a few more."""
    m = model()
    keep = 2
    pool = BufferPool(keep + 3)
    log = GradientLog(keep_steps=keep, on_drop=pool.give_back)
    overlap = Overlap(list(m.parameters()), cap_bytes=64 * 65 * 4, tail=0, buffers=pool)
    addresses = set()
    for step in range(12):
        overlap.arm("g", RecordingPg())
        m(torch.randn(4, 64)).sum().backward()
        pre = overlap.complete()
        assert pre is not None
        addresses.add(pre.buffer.data_ptr())
        append(log, step, pre.buffer[:pre.gradients])
        m.zero_grad()
    overlap.close()
    assert len(addresses) <= keep + 1, len(addresses)
