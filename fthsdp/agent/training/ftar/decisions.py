"""FTAR's decisions, as pure functions of what the members exchanged.

Kept apart from the collectives (fthsdp/agent/training/ftar/allreduce.py) so that they can be checked
exhaustively without processes (tests/test_ftar_agree.py): after every
agree, what each member does next; whether a newer quorum only grows a
group; and whether the members agreed to switch to it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple

from fthsdp.core.errors import FtarError
from fthsdp.protos.v1 import coordinator_pb2 as pb

# ----- growth: the agreed switch --------------------------------------------------------

CONTROL_SLOTS = 4
"""Spare elements at the end of a gradient buffer (``allreduce(...,
control_slots=True)``) that carry control values inside the data
all-reduce, at no cost.

The first two carry this member's switch proposal: d and d*d, d being the
proposed quorum id minus the group's (0: none). Every member proposed the
same d > 0 exactly when (sum d)^2 == n * sum d^2 (Cauchy-Schwarz), exact in
float32 for d <= 15 and up to 74,000 members. Other dtypes, or no spare
elements: a separate small all-reduce carries the proposal.

The third is CHECKPOINT_SLOT, the fourth STALE_SLOT."""
MAX_SLOT_PROPOSAL = 15
CHECKPOINT_SLOT = 2
"""1 from a member that asks for a checkpoint at this step's boundary (its
``--checkpoint-every 30m`` clock ran out), else 0. The sum is positive
exactly when some member asked, in any dtype (a sum of non-negative values
with a 1 in it does not round to 0), so every member that completes the
all-reduce reads the same answer at the same step."""
STALE_SLOT = 3
"""1 from a member whose buckets, started during the backward pass
(fthsdp/agent/training/ftar/overlap.py), carried a gradient that changed afterwards (another
micro-batch's backward pass), else 0. Positive: every member sums the step
again, flat, in the same group (the same answer on every member, as for
CHECKPOINT_SLOT)."""


def is_growth(group_quorum_id: int, quorum: pb.Quorum | None) -> bool:
    """Whether ``quorum`` keeps every member of quorum ``group_quorum_id``
    (the one a group was built for) and adds some: no quorum since dropped
    anyone (``last_drop_id``, 0 when unknown: not vouched for)."""
    if quorum is None or quorum.id <= group_quorum_id:
        return False
    return 0 < quorum.last_drop_id <= group_quorum_id


def slot_switch(quorum_id: int, size: int, total: int, squares: int) -> int:
    """The quorum every member of ``quorum_id``'s group (``size`` members)
    agreed to switch to, from the sums of their proposals d and d*d carried
    in the data all-reduce (see CONTROL_SLOTS); 0 if they did not agree."""
    if total > 0 and total * total == size * squares:
        return quorum_id + total // size
    return 0


# ----- the agreement, as a pure function -------------------------------------------------

class AgreeAction(str, enum.Enum):
    """What a member does after an agree (the next collective is the same on every member)."""

    AGAIN = "again"
    """Agree again (another member closes a gap first)."""
    IN_PHASE = "in-phase"
    """Every member is at this step: the data all-reduce follows (arg: contributors)."""
    JOIN_IN_PHASE = "join-in-phase"
    """A joiner without a gradient, at or behind the members' step (arg): it
    takes part in their data all-reduce at once and replays up to their step meanwhile."""
    REPLAY_TO_BEFORE_HEAD = "replay-to-before-head"
    """Two or more steps behind with a gradient: replay up to arg - 1, then agree again."""
    FOLLOW_HEAL = "follow-heal"
    """A joiner takes part in the members' broadcast among themselves (arg: root)."""
    TAKE_LAST = "take-last"
    """One step behind: receive the sum of this step from arg, and commit it."""
    SERVE_LAST = "serve-last"
    """Others are one step behind: broadcast the sum of the last step (arg: root)."""
    NO_GRADIENT = "no-gradient"
    """No member has a gradient for the step (a joiner whose members were all
    lost as it was admitted): the step is not committed; the loop runs it
    again, this time with a gradient of its own."""
    TAKE_HELD = "take-held"
    """Every member is at this step and some hold its complete sum, undecided
    (their commit vote was abandoned): the first holder (arg) broadcasts it,
    and every member votes to commit that sum (see fthsdp/agent/training/ftar/vote.py)."""
    FOLLOW_HELD = "follow-held"
    """A joiner takes part in the members' TAKE_HELD broadcast and vote (arg: root)."""


# The names the callers and tests use.
AGAIN = AgreeAction.AGAIN
IN_PHASE = AgreeAction.IN_PHASE
JOIN_IN_PHASE = AgreeAction.JOIN_IN_PHASE
REPLAY_TO_BEFORE_HEAD = AgreeAction.REPLAY_TO_BEFORE_HEAD
FOLLOW_HEAL = AgreeAction.FOLLOW_HEAL
TAKE_LAST = AgreeAction.TAKE_LAST
SERVE_LAST = AgreeAction.SERVE_LAST
NO_GRADIENT = AgreeAction.NO_GRADIENT
TAKE_HELD = AgreeAction.TAKE_HELD
FOLLOW_HELD = AgreeAction.FOLLOW_HELD


class AgreeRow(NamedTuple):
    """What each member puts into an agree (an all-gather of int64 rows)."""

    step: int
    numel: int
    """Gradient elements."""
    structure: int
    """The model's structure hash."""
    last_contributors: int
    """Contributors of the last sum this member holds (0: none)."""
    last_quorum: int
    """The quorum id of that sum (0: not held)."""
    contributes: int
    """1 if this member has a gradient for ``step``."""
    plan: int = 0
    """The signature of its bucket plan (fthsdp/agent/training/ftar/buckets.py; 0: none): equal on every member."""
    held_quorum: int = 0
    """The quorum id of a complete sum of ``step`` this member holds, not yet
    decided (its commit vote was abandoned; 0: none)."""
    held_contributors: int = 0
    """Contributors of that sum."""


def agree_action(
    step: int, contributes: bool, rows: Sequence[Sequence[int]], quorum_id: int = 0
) -> tuple[AgreeAction, int]:
    """What this member does after an agree, from every member's row.

    A row is an ``AgreeRow`` (or its six ints in that order). The members
    with a gradient (contributes) decide; joiners without one follow them,
    whatever step they are at below the members'. Every member reaches a
    decision whose next collective is the same as every other member's
    (tests/test_ftar_agree.py checks this over all small configurations): an
    all-gather (AGAIN, REPLAY_TO_BEFORE_HEAD), the data all-reduce (IN_PHASE,
    JOIN_IN_PHASE), one broadcast from the same root (FOLLOW_HEAL,
    TAKE_LAST, SERVE_LAST), or none (NO_GRADIENT: every member returns).
    """
    members = [AgreeRow(*r) for r in rows]
    steps = [r.step for r in members]
    counted = [r.step for r in members if r.contributes]
    if not counted:
        return NO_GRADIENT, 0
    lo, hi = min(counted), max(counted)

    def held_root() -> int | None:
        """The first member with a gradient that holds the undecided sum of ``hi``."""
        return next((i for i, r in enumerate(members) if r.contributes and r.step == hi and r.held_quorum > 0), None)

    def holder(at: int) -> int:
        """The first member at ``at`` that holds the sum of ``at - 1``."""
        for i, r in enumerate(members):
            if r.step == at and r.last_quorum > 0:
                return i
        raise FtarError(f"quorum {quorum_id}: no member at step {at} holds the result of step {at - 1}")

    if not contributes:
        if lo < hi:
            return FOLLOW_HEAL, holder(hi)
        if step > hi:
            raise FtarError(f"this replica is at step {step}, ahead of the quorum's {hi}")
        if max(steps) > hi:
            return AGAIN, 0  # another joiner is ahead: it fails, and the quorum changes
        if (root := held_root()) is not None:
            return FOLLOW_HELD, root
        # Even at the members' step: the joiner sets their hyperparameters for it.
        return JOIN_IN_PHASE, hi
    if lo == hi == step:
        if max(steps) > step:
            return AGAIN, 0
        # A sum some member holds may have been committed by a member that is
        # gone: redoing the step could commit another (commit_vote.py).
        root = held_root()
        return (IN_PHASE, len(counted)) if root is None else (TAKE_HELD, root)
    if lo == step and hi >= step + 2:
        return REPLAY_TO_BEFORE_HEAD, hi
    if lo < step - 1 and hi == step:
        return AGAIN, 0
    if lo == step and hi == step + 1:
        return TAKE_LAST, holder(hi)
    if lo == step - 1 and hi == step:
        return SERVE_LAST, holder(step)
    raise FtarError(f"replicas in quorum {quorum_id} are at steps {lo}..{hi}, this one at {step}")
