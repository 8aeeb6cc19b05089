"""One commit decision per step, shared by every member that took part in it.

The problem. A step's data all-reduce can complete on one member and be
abandoned on another: a newer quorum is pushed to some members while the
collective runs, and they leave it (gloo's collectives cannot be aborted, so
FTAR never waits on one blindly: fthsdp/agent/training/ftar/groups.py). Completion is local:
a member whose all-reduce completed holds the full sum, but it cannot tell
whether the others saw it complete. Were it to commit at once, a member the
others dropped (cut from the coordinator while its data link works) would
commit a sum the survivors then redo without it: two states for one step.

The vote. After a member's data all-reduce completes locally, it starts one
more small all-reduce in the same group: its *vote* (the newest quorum id it
knows, reduced by MAX). It commits the step only when the vote completes.
Every member starts its vote only after its own data all-reduce completed, so
a completed vote on any member proves that *every* member of the group holds
the same full sum. A member whose vote is abandoned (a newer quorum came)
keeps that sum, undecided, and says so in the next group's agree
(``AgreeRow.held_quorum``). Two rules make the decision the same everywhere:

1. A member commits a sum only after a vote on it completed, or takes one
   that another member committed (TAKE_LAST).
2. In a new group, when the members with a gradient are at one step and some
   hold its sum undecided, nobody redoes the step: the first holder
   broadcasts its sum and every member votes on it again (TAKE_HELD,
   fthsdp/agent/training/ftar/decisions.py).

So if any member committed a sum S of step s, every member of that vote held
S; every survivor among them brings S into each later group, and the only
sum of step s any of them can commit is S. If no vote on S completed, nobody
committed anything for step s, and the survivors are free to redo it.

Out of the quorum. The vote carries the newest quorum id each member knows.
A member that learns from its peers of a quorum it has not been pushed yet
waits for that push (its peers got it; its own is normally milliseconds
behind). If the newest quorum it knows does not include it, or the push
never comes before the step's deadline (it is cut from the coordinator), it
commits nothing: it raises ``Evicted`` and its agent restarts it. A member
that is out cannot split the job's state whether it commits or not; it
commits nothing so that no script ever logs, evaluates or saves from a step
boundary the job went past without it. A member that learns of a newer
quorum only after its vote completed commits the decided step and switches at
the boundary.

Every way a step can be left after its sum is complete, who decides, and why
nobody decides otherwise:

* A pushed newer quorum (a failure, a regroup of a stuck collective, an
  unreachable member's take-out, a drain, a hung member's take-out: each is
  a new quorum id): each member alone, by whether its vote completed. A
  completed vote means every member holds the sum (rule 2 commits it in the
  next group); an abandoned one keeps the sum for the next group's agree.
* A hang notice to this replica, or its group's eviction (another rank of a
  multi-rank group died): the coordinator's newest quorum excludes it, so
  it commits nothing (``Evicted`` at the vote, or at its next API call);
  the members that go on decide among themselves by rules 1 and 2.
* A checkpoint request (CHECKPOINT_SLOT, fthsdp/agent/training/ftar/decisions.py): it
  rides in the sum, so every member that commits the sum reads the same
  request; TAKE_HELD broadcasts the slots with the sum. A checkpoint's share
  records the quorum whose vote decided the step and the state's checksum,
  and the sealer refuses shares that differ in either
  (fthsdp/agent/training/checkpoint/seal.py).
* A joiner's first step: the joiner takes part in the data all-reduce and in
  the vote like a member, and commits only on a completed vote; its own
  undecided sums are never used (it has no gradient in them), it follows
  the members' TAKE_HELD without committing, and catches up the step from
  the log instead.
"""

from __future__ import annotations

import enum
from typing import Any, cast

import torch
import torch.distributed as dist

from fthsdp.agent.training.ftar.groups import DONE, QuorumGroup, QuorumGroups
from fthsdp.core.errors import Evicted

VOTE_DTYPE = torch.int64


class Verdict(str, enum.Enum):
    """What a member does once its vote on a sum completed."""

    COMMIT = "commit"
    """Every member holds the sum and this one is in the newest quorum it knows: the step is committed."""
    OUT = "out"
    """The newest quorum this member knows leaves it out: it commits nothing."""
    UNHEARD = "unheard"
    """A peer knew a newer quorum whose push never reached this member by
    the step's deadline (cut from the coordinator): it commits nothing."""


def verdict(seen: int, known: int, included: bool) -> Verdict:
    """After a completed vote: ``seen`` the newest quorum id any member knew
    when it voted, ``known`` the newest this member knows (after waiting for
    the push of ``seen``), ``included`` whether that one includes it."""
    if known < seen:
        return Verdict.UNHEARD
    return Verdict.COMMIT if included else Verdict.OUT


def vote_tensor(newest_known: int, device: torch.device) -> torch.Tensor:
    """This member's vote: the newest quorum id it knows (reduced by MAX)."""
    return torch.tensor([newest_known], dtype=VOTE_DTYPE, device=device)


def vote(groups: QuorumGroups, group: QuorumGroup, deadline: float, device: torch.device,
         decides: bool = True) -> int | None:
    """This member holds the step's complete sum: its vote, in ``group``.
    Returns the newest quorum id any member knew, once the vote completed
    and, if ``decides``, this member may commit; None if it was abandoned
    (``group`` is then retired). Raises ``Evicted`` if this member is out of
    the quorum: it commits nothing."""
    view = groups.view
    ballot = vote_tensor(view.newest_id(), device)
    opts = dist.AllreduceOptions()
    opts.reduceOp = cast(Any, dist.ReduceOp.MAX)  # pybind11 converts it; torch 2.13's stubs do not say so
    if groups.wait_work(group.pg.allreduce([ballot], opts), group, deadline) != DONE:
        groups.retire(group)
        return None
    seen = int(ballot[0])
    if not decides:
        return seen
    if view.newest_id() < seen:
        groups.wait_for_push(seen, deadline)  # its peers got it; this one's is normally ms behind
    with view.cond:
        known, included = view.newest_id(), view.includes_me(view.quorum)
    said = verdict(seen, known, included)
    if said is Verdict.COMMIT:
        return seen
    groups.retire(group)
    if said is Verdict.UNHEARD:
        raise Evicted(f"its peers know quorum {seen}, whose push never reached this replica (cut from the "
                      f"coordinator?): it commits nothing of quorum {group.quorum_id}'s step")
    raise Evicted(f"the newest quorum ({known}) does not include this replica: it commits nothing of quorum "
                  f"{group.quorum_id}'s step{view.out_because()}")


__all__ = ["VOTE_DTYPE", "Verdict", "verdict", "vote", "vote_tensor"]
