"""FTAR's collectives as they are started and waited on in a quorum's group.

Every wait goes through ``QuorumGroups.wait_work`` (fthsdp/agent/training/ftar/groups.py),
together with the coordinator's push: never a blind blocking wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.distributed as dist

from fthsdp.agent.training.ftar.groups import DONE, QuorumGroup, QuorumGroups


def start_allreduce(group: QuorumGroup, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM):
    opts = dist.AllreduceOptions()
    opts.reduceOp = cast(Any, op)  # pybind11 converts it; torch 2.13's stubs do not say so
    return group.pg.allreduce([tensor], opts)


def start_sum(group: QuorumGroup, buf: torch.Tensor, slices: Sequence[tuple[int, int]]) -> list:
    """The step's sum after the backward pass, in the buckets' ``slices`` and then the tail,
    as the overlapped step runs it: gloo and NCCL add up an element in an order that depends on
    the length of the tensor it is in, so one flat all-reduce would give other bits. With the
    same slices a step summed after the backward pass (the first in a group, a joiner's, one
    redone after a restore) is bit for bit the step summed bucket by bucket."""
    end = max((stop for _, stop in slices), default=0)
    if not slices or end > buf.numel():
        return [start_allreduce(group, buf)]
    works = [start_allreduce(group, buf[start:stop]) for start, stop in slices]
    if end < buf.numel():
        works.append(start_allreduce(group, buf[end:]))
    return works


def broadcast(groups: QuorumGroups, group: QuorumGroup, tensor: torch.Tensor, root: int, deadline: float) -> bool:
    """``tensor`` from ``root`` to every member; False if abandoned for a newer quorum (the group is retired)."""
    opts = dist.BroadcastOptions()
    opts.rootRank = root
    if groups.wait_work(group.pg.broadcast([tensor], opts), group, deadline) == DONE:
        return True
    groups.retire(group)
    return False


__all__ = ["broadcast", "start_allreduce", "start_sum"]
