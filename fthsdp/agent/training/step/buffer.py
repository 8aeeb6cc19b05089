"""The flat buffer one step's all-reduce sums: the gradients, then the
batch-norm statistics (from the first contributor only: fthsdp/agent/training/state/running_buffers.py),
then FTAR's spare control slots (its switch proposals ride along: fthsdp/agent/training/ftar/decisions.py).

The gradients themselves stay intact, so that a redo among the survivors of
a failure can flatten them again into a fresh tensor (an abandoned
collective may still write the old one).
"""

from __future__ import annotations

import torch

from fthsdp.agent.training.ftar.buffer_pool import BufferPool
from fthsdp.agent.training.ftar.decisions import CONTROL_SLOTS
from fthsdp.agent.training.state.codec import local
from fthsdp.agent.training.state.running_buffers import RunningBuffers
from fthsdp.agent.training.state.train_state import check_dense


class StepBuffer:
    def __init__(self, params: list[torch.Tensor], running: RunningBuffers, contributes: bool,
                 buffers: BufferPool | None = None) -> None:
        """``contributes=False``: a joiner without a gradient for the step: every element is zero.
        ``buffers``: where flat tensors come from (fthsdp/agent/training/ftar/buffer_pool.py); ``lent`` lists them."""
        self._pool = buffers if buffers is not None else BufferPool(0)
        self.lent: list[torch.Tensor] = []
        self.grads: list[torch.Tensor] = []
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)  # (a DTensor for an FSDP2 parameter)
            self.grads.append(p.grad)
        self.params = params
        check_dense(self.grads)
        self._shards = [local(g) for g in self.grads]
        self._running = running
        self._contributes = contributes
        self._spare = self._shards[0].new_zeros(CONTROL_SLOTS)
        numel = sum(g.numel() for g in self._shards)
        self.first_only = (numel, numel + running.numel()) if running.carries else None
        """The elements FTAR sums from the first contributor only (None: none)."""

    def flatten(self) -> torch.Tensor:
        """A fresh flat tensor of this step's values."""
        stats = self._running.pieces(self._spare.dtype, self._spare.device) if self.first_only else []
        pieces = [g.reshape(-1) for g in self._shards] + stats + [self._spare]
        flat = self._pool.take(sum(p.numel() for p in pieces), self._spare.dtype, self._spare.device)
        self.lent.append(flat)
        if not self._contributes:
            return flat.zero_()
        return torch.cat(pieces, out=flat)

    def fill_tail(self, buffer: torch.Tensor, start: int) -> None:
        """Write what follows the gradients (the statistics, the spare slots) into ``buffer[start:]``
        (the buffer of buckets started during the backward pass: fthsdp/agent/training/ftar/overlap.py)."""
        stats = self._running.pieces(self._spare.dtype, self._spare.device) if self.first_only else []
        buffer[start:].copy_(torch.cat(stats + [self._spare]))

    def restore(self) -> None:
        """Put the step's gradient tensors back (a joiner's replays inside FTAR reset them)."""
        for p, grad in zip(self.params, self.grads, strict=True):
            p.grad = grad
