"""A process group that only records the all-reduces started, and the small
model the bucket and buffer-pool tests plan buckets for."""

from __future__ import annotations

import torch


class RecordedWork:
    def __init__(self, tensor: torch.Tensor) -> None:
        self.snapshot = tensor.clone()  # what the all-reduce was started with


class RecordingPg:
    """Records the all-reduces started, in order (no communication)."""

    def __init__(self) -> None:
        self.started: list[RecordedWork] = []

    def allreduce(self, tensors, opts):
        self.started.append(RecordedWork(tensors[0]))
        return self.started[-1]


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 8))
