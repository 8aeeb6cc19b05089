"""What FTAR is asked, returns, and asks of its caller (fthsdp/agent/training/ftar/allreduce.py):
a step's sum as asked, its result, and what a joiner does while its first step runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

import torch

from fthsdp.agent.training.ftar.overlap import Prelaunched
from fthsdp.core.errors import FtarError

__all__ = ["Joining", "NotJoining", "StepResult", "StepSum"]


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
class StepSum:
    """One step's sum, as the caller asks FTAR for it (``FTAR.allreduce``).

    The data all-reduce runs in place in ``buffer`` (no copy on the fast
    path); a redo needs the local values again in a *fresh* tensor, since an
    abandoned collective may still write the old one: ``refill`` makes one
    (for example by flattening the intact gradients again). Without it a
    copy of ``buffer`` is kept up front. The returned sum must be left
    unchanged until the next call: a replica that fell behind may need it."""

    step: int
    buffer: torch.Tensor
    structure_hash: int
    """The model's structure hash, checked equal in every new group's agree."""
    refill: Callable[[], torch.Tensor] | None = None
    contributes: bool = True
    """False: this replica has no gradient for the step (a joiner whose forward
    pass ran on a state it has since replayed past); ``buffer`` holds zeros,
    and the result's ``contributors`` does not count it. Only a replica's
    first step in a new group can be one without a contribution."""
    proposal: int | None = None
    """The growth quorum this replica proposes to switch to after this step
    (``FTAR.growth_ready``); None: this rank's own. The ranks of a multi-rank
    replica group must propose the same."""
    control_slots: bool = False
    """``buffer`` (and every ``refill``) ends in CONTROL_SLOTS spare elements
    that carry the proposal and the checkpoint and stale flags; the result
    excludes them (fthsdp/agent/training/ftar/decisions.py)."""
    first_only: tuple[int, int] | None = None
    """Elements ``[start, stop)`` summed from one member only, the first that
    contributes a gradient; the others zero them before the data all-reduce,
    so that the sum is that member's values exactly (batch-norm statistics:
    fthsdp/agent/training/state/running_buffers.py)."""
    checkpoint: bool = False
    """This member asks for a checkpoint at this step's boundary (with
    ``control_slots`` only); the result's ``checkpoint`` says whether any did."""
    prelaunched: Prelaunched | None = None
    """The step's buckets, started during the backward pass
    (fthsdp/agent/training/ftar/overlap.py); ``buffer`` must be their buffer, its
    tail filled. Used if the step runs in the group they were started in;
    otherwise dropped with that group, and the step is summed flat from ``refill``."""


class Joining(Protocol):
    """What FTAR asks of a joiner during its first steps in the quorum
    (fthsdp/agent/training/catchup/last_gap.py answers): its own work on the
    training thread, never a wait for the members."""

    def close_gap(self, step: int, head: int) -> int:
        """This replica has a gradient for ``step`` but the members are at
        ``head`` >= step + 2 (it was admitted while it replayed): bring it to
        ``head - 1`` with that step's inputs, where it takes the members' sum;
        return the step it is at."""
        ...

    def enter_step(self, head: int) -> None:
        """This joiner, without a gradient, is about to join the members' data
        all-reduce of step ``head`` (they wait in it: their inputs of ``head``
        are stable now): read them."""
        ...

    def replay_to(self, head: int) -> int:
        """That all-reduce runs: replay up to ``head`` meanwhile; return the step reached."""
        ...

    def while_waiting(self) -> None:
        """Between polls while this joiner, without a gradient, waits in a new
        group for the members: replay a step they committed meanwhile, if any."""
        ...


class NotJoining:
    """A replica that cannot catch up (no catch-up source): being behind is an error."""

    def close_gap(self, step: int, head: int) -> int:
        raise FtarError(f"this replica is at step {step}, the quorum at {head}, and it cannot catch up")

    def enter_step(self, head: int) -> None:
        raise FtarError(f"this replica has no gradient for the quorum's step {head} and cannot catch up")

    def replay_to(self, head: int) -> int:
        raise FtarError(f"this replica is behind the quorum's step {head} and cannot catch up")

    def while_waiting(self) -> None:
        """Nothing to replay: it simply waits."""
