"""The step protocol of FTAR, as a pure state machine.

One call of ``FTAR.allreduce`` runs one step's sum through a sequence of
phases; each phase is one collective (or one request to the joiner), and
what comes next depends only on the phase and how it ended: ``after(phase,
end, action)``. Each phase is one method of ``StepRun``
(fthsdp/agent/training/ftar/phases.py), which runs the collectives and the requests;
this decides, and tests/test_step_protocol.py checks the whole table.

    FIND_GROUP --in-step--> DATA --completed--> VOTE --completed--> DONE
        |                    | \\--abandoned--> FIND_GROUP   \\--abandoned--> FIND_GROUP (the sum held)
        |                    \\--stale--> DATA (again, flat, in the same group)
        \\--new-group--> AGREE --(agree_action)--> CLOSE_GAP | FOLLOW_HEAL | TAKE_HELD |
                                 FOLLOW_HELD | TAKE_LAST | SERVE_LAST | NO_GRADIENT | FIND_GROUP
    TAKE_HELD --completed--> VOTE;  FOLLOW_HELD --completed--> FOLLOW_VOTE --completed--> FIND_GROUP

Rules the table keeps (and the test asserts): an abandoned collective (a
newer quorum came, fthsdp/agent/training/ftar/groups.py) always goes back to FIND_GROUP,
where the step continues in the newer group from the intact local
gradients; a step ends only with a sum every member of a completed vote
holds (VOTE completed, fthsdp/agent/training/ftar/vote.py), with one another member
committed (TAKE_LAST completed), or with NO_GRADIENT (nobody had a gradient:
not a step); after every agree
whose action is not itself a collective or a request, the next phase is
found again, so that a quorum newer than the agree is never skipped.
"""

from __future__ import annotations

import enum

from fthsdp.agent.training.ftar.decisions import AgreeAction
from fthsdp.core.errors import FtarError


class Phase(str, enum.Enum):
    FIND_GROUP = "find-group"
    """Take the newest group this rank can run the step in (building it if needed)."""
    AGREE = "agree"
    """A new group's first collective: all-gather every member's step and sizes."""
    DATA = "data"
    """The data all-reduce (a joiner reads the members' inputs first and replays during it)."""
    CLOSE_GAP = "close-gap"
    """Ask the joiner to replay up to the step before the members' (``Joining.close_gap``)."""
    FOLLOW_HEAL = "follow-heal"
    """Take part, without using it, in the broadcast of the last sum to members one step behind."""
    TAKE_LAST = "take-last"
    """Receive the sum of this step, which others completed, and end the step with it."""
    SERVE_LAST = "serve-last"
    """Broadcast (or help broadcast) the last sum to members one step behind."""
    VOTE = "vote"
    """This member holds the step's complete sum: vote to commit it (fthsdp/agent/training/ftar/vote.py)."""
    TAKE_HELD = "take-held"
    """Broadcast (from the first holder) the sum some members hold undecided; a vote follows."""
    FOLLOW_HELD = "follow-held"
    """A joiner takes part, without using it, in a TAKE_HELD broadcast."""
    FOLLOW_VOTE = "follow-vote"
    """A joiner takes part, without committing, in the vote after a TAKE_HELD."""
    DONE = "done"
    """The step has its sum."""
    NO_GRADIENT = "no-gradient"
    """Nobody had a gradient for the step: it is not committed; the loop runs it again."""


TERMINAL = frozenset({Phase.DONE, Phase.NO_GRADIENT})


class PhaseEnd(str, enum.Enum):
    IN_STEP = "in-step"
    """FIND_GROUP: the group already agreed on this step; the data all-reduce is next."""
    NEW_GROUP = "new-group"
    """FIND_GROUP: a group whose first collective is an agree."""
    AGREED = "agreed"
    """AGREE: the rows arrived; ``agree_action`` names what follows."""
    COMPLETED = "completed"
    """A collective finished."""
    ABANDONED = "abandoned"
    """A collective was given up for a newer quorum (or its group failed)."""
    ANSWERED = "answered"
    """The caller answered a request."""
    STALE = "stale"
    """DATA: its buckets, started during the backward pass, carried a gradient
    that changed afterwards (STALE_SLOT, the same on every member): sum again."""


_AFTER_AGREE = {
    AgreeAction.NO_GRADIENT: Phase.NO_GRADIENT,
    AgreeAction.IN_PHASE: Phase.FIND_GROUP,
    AgreeAction.JOIN_IN_PHASE: Phase.FIND_GROUP,
    AgreeAction.AGAIN: Phase.FIND_GROUP,
    AgreeAction.REPLAY_TO_BEFORE_HEAD: Phase.CLOSE_GAP,
    AgreeAction.FOLLOW_HEAL: Phase.FOLLOW_HEAL,
    AgreeAction.TAKE_LAST: Phase.TAKE_LAST,
    AgreeAction.SERVE_LAST: Phase.SERVE_LAST,
    AgreeAction.TAKE_HELD: Phase.TAKE_HELD,
    AgreeAction.FOLLOW_HELD: Phase.FOLLOW_HELD,
}
"""IN_PHASE and JOIN_IN_PHASE mark the group in step (FTAR does), so FIND_GROUP then leads to DATA."""

_TABLE: dict[tuple[Phase, PhaseEnd], Phase] = {
    (Phase.FIND_GROUP, PhaseEnd.IN_STEP): Phase.DATA,
    (Phase.FIND_GROUP, PhaseEnd.NEW_GROUP): Phase.AGREE,
    (Phase.DATA, PhaseEnd.COMPLETED): Phase.VOTE,
    (Phase.VOTE, PhaseEnd.COMPLETED): Phase.DONE,
    (Phase.TAKE_HELD, PhaseEnd.COMPLETED): Phase.VOTE,
    (Phase.FOLLOW_HELD, PhaseEnd.COMPLETED): Phase.FOLLOW_VOTE,
    (Phase.FOLLOW_VOTE, PhaseEnd.COMPLETED): Phase.FIND_GROUP,
    (Phase.DATA, PhaseEnd.STALE): Phase.DATA,
    (Phase.TAKE_LAST, PhaseEnd.COMPLETED): Phase.DONE,
    (Phase.FOLLOW_HEAL, PhaseEnd.COMPLETED): Phase.FIND_GROUP,
    (Phase.SERVE_LAST, PhaseEnd.COMPLETED): Phase.FIND_GROUP,
    (Phase.CLOSE_GAP, PhaseEnd.ANSWERED): Phase.FIND_GROUP,
}

COLLECTIVES = frozenset({Phase.AGREE, Phase.DATA, Phase.VOTE, Phase.FOLLOW_HEAL, Phase.TAKE_LAST, Phase.SERVE_LAST,
                         Phase.TAKE_HELD, Phase.FOLLOW_HELD, Phase.FOLLOW_VOTE})
"""The phases that run a collective, and so can be abandoned."""


def after(phase: Phase, outcome: PhaseEnd, action: AgreeAction | None = None) -> Phase:
    """The phase that follows ``phase`` ending with ``outcome`` (after an
    agree: ``action``, from ``agree_action``). An outcome the phase cannot
    have is an internal error, never a silent fallthrough."""
    if outcome is PhaseEnd.ABANDONED and phase in COLLECTIVES:
        return Phase.FIND_GROUP
    if phase is Phase.AGREE and outcome is PhaseEnd.AGREED and action is not None:
        return _AFTER_AGREE[AgreeAction(action)]
    try:
        return _TABLE[(phase, outcome)]
    except KeyError:
        raise FtarError(f"internal: the step protocol has no way on from {phase.value} after {outcome.value}") from None
