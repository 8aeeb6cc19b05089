"""Module buffers that the forward pass changes: batch-norm running statistics.

A ``BatchNorm`` layer in training mode updates ``running_mean`` and
``running_var`` (and counts ``num_batches_tracked``) in every forward pass,
from this replica's own batch: outside the update a joiner replays, and
different on every replica. torch's DistributedDataParallel keeps them equal
by broadcasting rank 0's buffers before each forward pass
(``broadcast_buffers=True``, its default). fthsdp does the same inside the
step's gradient all-reduce, at no extra collective:

* The floating-point running statistics ride at the end of the flat gradient
  buffer. Only one member, the *first contributor* of the step (group rank
  0 unless a joiner without a gradient holds it), puts its values there; the
  others put zeros (FTAR's ``first_only``). The sum is then that member's
  values, exactly (x + 0 = x), and every member sets its buffers to it after
  the all-reduce. The logged sum carries them, so a joiner's replay sets them
  the same way: bit-identical, as DDP's replica 0 decides.
* The counts (``num_batches_tracked``, an integer: a float of the gradients'
  dtype would not hold it exactly) are the same on every member, which run
  the same forward passes; they are recorded with the step's inputs
  (fthsdp/agent/training/state/train_state.py) and restored before a replay.

Which buffers: those of every module with ``track_running_stats`` set and a
``running_mean`` buffer (``BatchNorm1d/2d/3d``, ``SyncBatchNorm``, the lazy
ones, ``InstanceNorm*`` with running statistics), found once from the
model's structure, so every replica finds the same. Any other buffer must
not change outside the update (a causal mask or a rotary table never
does); if one does, the joiner's checksum names the model.
"""

from __future__ import annotations

import torch

from fthsdp.agent.training.state.codec import local

STAT_NAMES = ("running_mean", "running_var")
"""The floating-point running statistics, carried in the all-reduce."""
COUNT_NAME = "num_batches_tracked"
"""The integer count, recorded with the step's inputs."""


class _Buffer:
    """One buffer, looked up on its module at each use: ``model.to(device)``
    after the manager was built replaces buffer tensors (not parameters)."""

    def __init__(self, module: torch.nn.Module, attr: str) -> None:
        self.module, self.attr = module, attr

    def get(self) -> torch.Tensor:
        return local(getattr(self.module, self.attr))


class RunningBuffers:
    """The running statistics of a model's normalisation layers, in a fixed order."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._stats: list[tuple[str, _Buffer]] = []
        self._counts: list[tuple[str, _Buffer]] = []
        for prefix, module in model.named_modules():
            if not getattr(module, "track_running_stats", False) or getattr(module, "running_mean", None) is None:
                continue
            for name in STAT_NAMES:
                buf = getattr(module, name, None)
                if isinstance(buf, torch.Tensor) and buf.is_floating_point():
                    self._stats.append((_qualified(prefix, name), _Buffer(module, name)))
            if isinstance(getattr(module, COUNT_NAME, None), torch.Tensor):
                self._counts.append((_qualified(prefix, COUNT_NAME), _Buffer(module, COUNT_NAME)))

    @property
    def stats(self) -> list[tuple[str, torch.Tensor]]:
        """(qualified name, this rank's tensor) of every floating-point running statistic."""
        return [(name, b.get()) for name, b in self._stats]

    @property
    def counts(self) -> list[tuple[str, torch.Tensor]]:
        """(qualified name, this rank's tensor) of every batch count."""
        return [(name, b.get()) for name, b in self._counts]

    def __bool__(self) -> bool:
        return bool(self._stats or self._counts)

    @property
    def carries(self) -> bool:
        """Whether the all-reduce carries statistics (checked every step: no list built)."""
        return bool(self._stats)

    def numel(self) -> int:
        """Elements the statistics take at the end of the flat gradient buffer."""
        return sum(local(b).numel() for _, b in self.stats)

    def pieces(self, dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
        """The statistics, flattened and cast to the gradients' dtype, for ``torch.cat``."""
        return [local(b).detach().reshape(-1).to(device=device, dtype=dtype) for _, b in self.stats]

    def load(self, section: torch.Tensor) -> None:
        """Set every statistic from ``section`` (the first contributor's values, as summed)."""
        offset = 0
        with torch.no_grad():
            for _, b in self.stats:
                target = local(b)
                n = target.numel()
                piece = section[offset : offset + n].view(target.shape)
                target.copy_(piece.to(device=target.device, dtype=target.dtype))
                offset += n

    def count_state(self) -> dict[str, torch.Tensor]:
        """The batch counts, as recorded with a step's inputs (copies)."""
        return {name: local(b).detach().clone() for name, b in self.counts}

    def load_counts(self, state: dict) -> None:
        """Restore recorded batch counts (a dict from ``count_state``)."""
        mine = dict(self.counts)
        unknown = sorted(set(state) - set(mine))
        if unknown or len(state) != len(mine):
            raise ValueError(f"the source's model counts batches in {sorted(state)}, this one in {sorted(mine)}")
        with torch.no_grad():
            for name, value in state.items():
                target = local(mine[name])
                target.copy_(value.to(device=target.device, dtype=target.dtype).view(target.shape))


def _qualified(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name
