"""The step protocol's table (fthsdp/agent/training/ftar/protocol.py), checked whole."""

from __future__ import annotations

import itertools
import random

import pytest

from fthsdp.agent.training.ftar.decisions import AgreeAction
from fthsdp.agent.training.ftar.protocol import COLLECTIVES, TERMINAL, Phase, PhaseEnd, after
from fthsdp.core.errors import FtarError

P, Out, A = Phase, PhaseEnd, AgreeAction

CASES = [
    # phase, outcome, action, next phase
    (P.FIND_GROUP, Out.IN_STEP, None, P.DATA),
    (P.FIND_GROUP, Out.NEW_GROUP, None, P.AGREE),
    (P.DATA, Out.COMPLETED, None, P.VOTE),  # complete here, decided by the vote (commit_vote.py)
    (P.DATA, Out.ABANDONED, None, P.FIND_GROUP),
    (P.VOTE, Out.COMPLETED, None, P.DONE),
    (P.VOTE, Out.ABANDONED, None, P.FIND_GROUP),  # the sum is held into the next group's agree
    (P.DATA, Out.STALE, None, P.DATA),  # buckets sent before a later backward pass: once more, flat
    (P.AGREE, Out.ABANDONED, None, P.FIND_GROUP),
    (P.AGREE, Out.AGREED, A.IN_PHASE, P.FIND_GROUP),  # marked in step: FIND_GROUP then leads to DATA
    (P.AGREE, Out.AGREED, A.JOIN_IN_PHASE, P.FIND_GROUP),
    (P.AGREE, Out.AGREED, A.AGAIN, P.FIND_GROUP),
    (P.AGREE, Out.AGREED, A.NO_GRADIENT, P.NO_GRADIENT),
    (P.AGREE, Out.AGREED, A.REPLAY_TO_BEFORE_HEAD, P.CLOSE_GAP),
    (P.AGREE, Out.AGREED, A.FOLLOW_HEAL, P.FOLLOW_HEAL),
    (P.AGREE, Out.AGREED, A.TAKE_LAST, P.TAKE_LAST),
    (P.AGREE, Out.AGREED, A.SERVE_LAST, P.SERVE_LAST),
    (P.AGREE, Out.AGREED, A.TAKE_HELD, P.TAKE_HELD),
    (P.AGREE, Out.AGREED, A.FOLLOW_HELD, P.FOLLOW_HELD),
    (P.TAKE_HELD, Out.COMPLETED, None, P.VOTE),  # a held sum is voted on again, never committed unvoted
    (P.TAKE_HELD, Out.ABANDONED, None, P.FIND_GROUP),
    (P.FOLLOW_HELD, Out.COMPLETED, None, P.FOLLOW_VOTE),
    (P.FOLLOW_HELD, Out.ABANDONED, None, P.FIND_GROUP),
    (P.FOLLOW_VOTE, Out.COMPLETED, None, P.FIND_GROUP),
    (P.FOLLOW_VOTE, Out.ABANDONED, None, P.FIND_GROUP),
    (P.CLOSE_GAP, Out.ANSWERED, None, P.FIND_GROUP),
    (P.FOLLOW_HEAL, Out.COMPLETED, None, P.FIND_GROUP),
    (P.FOLLOW_HEAL, Out.ABANDONED, None, P.FIND_GROUP),
    (P.TAKE_LAST, Out.COMPLETED, None, P.DONE),
    (P.TAKE_LAST, Out.ABANDONED, None, P.FIND_GROUP),
    (P.SERVE_LAST, Out.COMPLETED, None, P.FIND_GROUP),
    (P.SERVE_LAST, Out.ABANDONED, None, P.FIND_GROUP),
]


@pytest.mark.parametrize("phase, outcome, action, expected", CASES)
def test_table(phase, outcome, action, expected):
    assert after(phase, outcome, action) is expected


def test_every_other_outcome_is_an_internal_error():
    listed = {(p, o) for p, o, _, _ in CASES}
    for phase, outcome in itertools.product(Phase, PhaseEnd):
        if phase in TERMINAL or (phase, outcome) in listed:
            continue
        with pytest.raises(FtarError, match="internal"):
            after(phase, outcome, AgreeAction.AGAIN if outcome is Out.AGREED else None)


def test_every_agree_action_has_a_way_on():
    assert {after(P.AGREE, Out.AGREED, a) for a in AgreeAction} <= set(Phase)


def test_an_abandoned_collective_always_goes_back_to_the_newest_group():
    for phase in COLLECTIVES:
        assert after(phase, Out.ABANDONED) is P.FIND_GROUP


def test_only_a_voted_sum_a_committed_one_or_no_gradient_ends_the_step():
    """A sum that completed here but was not voted on never ends a step: a
    member that another dropped could otherwise commit it alone."""
    ends = {(p, o, a) for p, o, a, nxt in CASES if nxt in TERMINAL}
    assert ends == {(P.VOTE, Out.COMPLETED, None), (P.TAKE_LAST, Out.COMPLETED, None),
                    (P.AGREE, Out.AGREED, A.NO_GRADIENT)}


def test_every_sum_made_in_a_group_is_voted_on_before_the_step_ends():
    """The phases that make a sum this member did not take from a committed
    one (DATA, TAKE_HELD) lead to VOTE, and only VOTE leads from them to DONE."""
    for phase in (P.DATA, P.TAKE_HELD):
        assert after(phase, Out.COMPLETED) is P.VOTE


def test_random_walks_end_once_the_quorum_stops_changing():
    """Whatever the collectives' outcomes while quorums change, a walk whose
    collectives all complete from some point on ends within a few phases:
    the protocol has no cycle that a stable quorum keeps turning in (the
    agree actions here are those of members at one step: IN_PHASE, or one
    round of healing first)."""
    rng = random.Random(0)
    for _ in range(500):
        phase, in_step, settled_after, healed, n = P.FIND_GROUP, False, rng.randrange(8), False, 0
        stale = rng.random() < 0.3  # the first data all-reduce's buckets were stale (its redo is flat: never)
        while phase not in TERMINAL:
            n += 1
            assert n < settled_after + 12, "the walk does not end"
            stable = n > settled_after
            if phase is P.FIND_GROUP:
                outcome, action = (Out.IN_STEP if in_step else Out.NEW_GROUP), None
            elif phase in COLLECTIVES and not stable and rng.random() < 0.5:
                outcome, action, in_step = Out.ABANDONED, None, False
            elif phase is P.AGREE:
                action = A.IN_PHASE if healed or stable else rng.choice(
                    [A.SERVE_LAST, A.AGAIN, A.IN_PHASE, A.TAKE_HELD])
                outcome, healed = Out.AGREED, healed or action in (A.SERVE_LAST, A.TAKE_HELD)
                in_step = action is A.IN_PHASE
            elif phase is P.CLOSE_GAP:
                outcome, action = Out.ANSWERED, None
            elif phase is P.DATA and stale:
                outcome, action, stale = Out.STALE, None, False
            else:
                outcome, action = Out.COMPLETED, None
            phase = after(phase, outcome, action)
        assert phase is P.DONE
