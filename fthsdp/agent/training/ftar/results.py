"""What FTAR returns and asks of its caller (fthsdp/agent/training/ftar/allreduce.py): a step's
result, and the requests a joiner answers while its first step runs."""

from __future__ import annotations

import dataclasses

import torch

__all__ = ["CloseGap", "EnterStep", "ReplayTo", "Request", "StepResult"]


@dataclasses.dataclass(frozen=True)
class StepResult:
    total: torch.Tensor
    """The *sum* over the contributors: dividing is left to the caller, who
    can fuse it with copying the result back into the gradients."""
    contributors: int
    quorum_id: int
    """The quorum whose vote decided this sum (fthsdp/agent/training/ftar/vote.py): every
    member that commits this step holds the same sum with the same id."""
    abandoned: int
    """Collectives of this step that were abandoned for a newer quorum."""
    step: int = -1
    """The step this sum belongs to (a joiner that closed a gap is further on
    than the step it asked for)."""
    checkpoint: bool = False
    """Some member asked for a checkpoint at this step's boundary (CHECKPOINT_SLOT).
    False when the sum was taken from a peer after a failure: that checkpoint
    then lacks this member's share and is never used (as when a member dies
    mid-save), and the next one is taken on time."""
    overlapped: int = 0
    """Buckets of this sum that started during the backward pass
    (fthsdp/agent/training/ftar/overlap.py); 0: it ran after the backward pass."""
    vote_s: float = 0.0
    """Seconds this member's commit vote took, from its sum's completion to the
    decision (fthsdp/agent/training/ftar/vote.py; 0: the sum was another member's decision)."""



@dataclasses.dataclass(frozen=True)
class CloseGap:
    """What FTAR needs next: this replica has a gradient for ``step`` but the
    members are at ``head`` >= step + 2 (it was admitted while it replayed).
    Bring it to ``head - 1`` with that step's inputs, where it takes the
    members' sum; answer the step it is at."""

    step: int
    head: int


@dataclasses.dataclass(frozen=True)
class EnterStep:
    """This joiner, without a gradient, is about to join the members' data
    all-reduce of step ``head`` (they wait in it: their inputs of ``head``
    are stable now). Answer None once they are read."""

    head: int


@dataclasses.dataclass(frozen=True)
class ReplayTo:
    """That all-reduce runs: replay up to ``head`` meanwhile; answer the step."""

    head: int


Request = CloseGap | EnterStep | ReplayTo
